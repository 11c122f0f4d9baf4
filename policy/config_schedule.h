// The per-step config schedule of one TP group (docs/design.md §4): a config change
// applies from its effective_from_step on, never to a step already decided, and never
// in the middle of a step, because a step's config is looked up once, when the step is
// decided. The daemon keeps one per group and the worker's fallback keeps one for its
// group, so both look up the same config for the same step.
//
// Invariant: entries are in ascending effective_from_step, and there is always at least
// one (the config before any change).
//
// Usage:
//   spgate::ConfigSchedule schedule(spgate::GateConfig{}, /*version=*/0);
//   schedule.Schedule(new_config, /*version=*/7, /*effective_from_step=*/102);
//   const spgate::ScheduledConfig& c = schedule.At(101);   // still version 0
//   schedule.Prune(101);                                   // steps only increase
#ifndef SPGATE_POLICY_CONFIG_SCHEDULE_H_
#define SPGATE_POLICY_CONFIG_SCHEDULE_H_

#include <cstdint>
#include <deque>
#include <limits>

#include "policy/gate_config.h"

namespace spgate {

struct ScheduledConfig {
  GateConfig config;
  int64_t version = 0;
  int64_t effective_from_step = 0;
};

class ConfigSchedule {
 public:
  static constexpr int64_t kAlways = std::numeric_limits<int64_t>::min();

  explicit ConfigSchedule(const GateConfig& initial = GateConfig{}, int64_t version = 0) {
    entries_.push_back({initial, version, kAlways});
  }

  // `config` applies to steps >= effective_from_step. Anything scheduled from that step
  // on is replaced (a newer update wins); older entries stay for earlier steps.
  void Schedule(const GateConfig& config, int64_t version, int64_t effective_from_step) {
    while (entries_.size() > 1 && entries_.back().effective_from_step >= effective_from_step) {
      entries_.pop_back();
    }
    if (entries_.back().effective_from_step >= effective_from_step) {
      // The only entry left starts at or after this one: the new config replaces it.
      entries_.back() = {config, version, effective_from_step};
      return;
    }
    entries_.push_back({config, version, effective_from_step});
  }

  // The config in force for `step`: the newest entry that starts at or before it. When
  // every entry starts after `step` (a re-registration scheduled the daemon's config from
  // the group's next step), the oldest is the best known for it.
  const ScheduledConfig& At(int64_t step) const {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      if (it->effective_from_step <= step) return *it;
    }
    return entries_.front();
  }

  // Steps only increase: once `step` is decided, entries before the one in force for it
  // are dead.
  void Prune(int64_t step) {
    while (entries_.size() > 1 && entries_[1].effective_from_step <= step) entries_.pop_front();
  }

  // The newest entry (what a group's next undecided step will use, or later).
  const ScheduledConfig& latest() const { return entries_.back(); }
  size_t size() const { return entries_.size(); }

 private:
  std::deque<ScheduledConfig> entries_;
};

}  // namespace spgate

#endif  // SPGATE_POLICY_CONFIG_SCHEDULE_H_
