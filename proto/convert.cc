// Wire <-> domain conversions; see convert.h.
#include "proto/convert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/time_util.h"

namespace spgate {

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

namespace {

using google::protobuf::FieldDescriptor;

// The wire field of each row of kGateFields, looked up once. A row without a wire field
// of the right type is a build-time mistake; tests/proto/convert_test.cc catches it.
const std::array<const FieldDescriptor*, kNumGateFields>& WireFields() {
  static const auto* fields = [] {
    auto* out = new std::array<const FieldDescriptor*, kNumGateFields>();
    const auto* desc = v1::GateConfig::descriptor();
    for (size_t i = 0; i < kNumGateFields; ++i) {
      (*out)[i] = desc->FindFieldByName(std::string(kGateFields[i].name));
    }
    return out;
  }();
  return *fields;
}

}  // namespace

const FieldDescriptor* WireGateField(const GateField& field) {
  return WireFields()[static_cast<size_t>(&field - kGateFields.data())];
}

GateConfig LayerGateConfig(GateConfig c, const v1::GateConfig& layer) {
  const auto* refl = v1::GateConfig::GetReflection();
  for (const GateField& f : kGateFields) {
    const FieldDescriptor* w = WireGateField(f);
    if (w == nullptr || !refl->HasField(layer, w)) continue;
    if (f.is_choice()) {
      // An unknown or UNSPECIFIED value stays as it is, for validation to name.
      c.*f.choice = static_cast<GatePolicyKind>(refl->GetEnumValue(layer, w));
    } else if (f.is_count()) {
      c.*f.count = refl->GetInt64(layer, w);
    } else {
      c.*f.real = refl->GetDouble(layer, w);
    }
  }
  return c;
}

v1::GateConfig ToProto(const GateConfig& c) {
  v1::GateConfig p;
  const auto* refl = v1::GateConfig::GetReflection();
  for (const GateField& f : kGateFields) {
    const FieldDescriptor* w = WireGateField(f);
    if (w == nullptr) continue;
    if (f.is_choice()) {
      refl->SetEnumValue(&p, w, static_cast<int>(c.*f.choice));
    } else if (f.is_count()) {
      refl->SetInt64(&p, w, c.*f.count);
    } else {
      refl->SetDouble(&p, w, c.*f.real);
    }
  }
  return p;
}

absl::Status ApplyFieldMask(const v1::GateConfig& update, const google::protobuf::FieldMask& mask,
                            v1::GateConfig* overrides) {
  const auto* desc = v1::GateConfig::descriptor();
  const auto* refl = v1::GateConfig::GetReflection();
  v1::GateConfig result = *overrides;
  if (mask.paths_size() == 0) {
    result.MergeFrom(update);
    *overrides = std::move(result);
    return absl::OkStatus();
  }
  for (const std::string& path : mask.paths()) {
    const auto* field = desc->FindFieldByName(path);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("update_mask: unknown GateConfig field \"", path, "\""));
    }
    if (refl->HasField(update, field)) {
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          refl->SetDouble(&result, field, refl->GetDouble(update, field));
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          refl->SetInt64(&result, field, refl->GetInt64(update, field));
          break;
        case FieldDescriptor::CPPTYPE_ENUM:
          refl->SetEnumValue(&result, field, refl->GetEnumValue(update, field));
          break;
        default:
          return absl::InternalError(absl::StrCat("update_mask: field \"", path,
                                                  "\" has a type the conversion lacks"));
      }
    } else {
      refl->ClearField(&result, field);
    }
  }
  *overrides = std::move(result);
  return absl::OkStatus();
}

v1::LearnedTable ToProto(const ThroughputTable& table) {
  v1::LearnedTable out;
  for (int band = 0; band < kBands; ++band) {
    for (Mode mode : {Mode::kSequenceParallel, Mode::kTensorParallelOnly}) {
      const ThroughputCell& c = table.cell(band, mode);
      if (c.last_step < 0) continue;
      v1::LearnedCell* w = out.add_cells();
      w->set_band(band);
      w->set_mode(ToProto(mode));
      w->set_tokens(c.tokens);
      w->set_seconds(c.seconds);
      w->set_weight(c.weight);
      w->set_last_step(c.last_step);
      w->set_drift(c.drift);
      w->set_noise(c.noise);
      if (c.changed_step >= 0) w->set_changed_step(c.changed_step);
      w->set_beyond(c.beyond);
      w->set_seconds_drift(c.seconds_drift);
      if (c.straggler_share >= 0) w->set_straggler_share(c.straggler_share);
    }
  }
  for (int band = 0; band < kBands; ++band) {
    const PairedCell& p = table.pair(band);
    if (p.last_step < 0) continue;
    v1::LearnedPair* w = out.add_pairs();
    w->set_band(band);
    w->set_sp_seconds(p.sp_seconds);
    w->set_tp_seconds(p.tp_seconds);
    w->set_weight(p.weight);
    w->set_last_step(p.last_step);
  }
  const SwitchCostCell& s = table.switch_cost();
  if (s.last_step >= 0) {
    v1::LearnedSwitchCost* w = out.mutable_switch_cost();
    w->set_seconds(s.seconds);
    w->set_weight(s.weight);
    w->set_last_step(s.last_step);
  }
  out.set_changes(table.changes());
  const ThroughputTable::StragglerTiming& timing = table.straggler_timing();
  out.set_straggler_timed_sp(timing.timed[0]);
  out.set_straggler_timed_tp(timing.timed[1]);
  out.set_straggler_untimed(timing.untimed);
  const PriorInputs& in = table.prior_inputs();
  const PriorSums& ps = table.prior_sums();
  if (in != PriorInputs{} || ps.last_step >= 0) {
    v1::LearnedPrior* w = out.mutable_prior();
    w->set_tp(in.tp);
    w->set_hidden(in.hidden);
    w->set_layers(in.layers);
    w->set_weight(ps.weight);
    w->set_tokens(ps.tokens);
    w->set_tokens_sq(ps.tokens_sq);
    w->set_all_gather(ps.all_gather);
    w->set_tokens_all_gather(ps.tokens_all_gather);
    w->set_seconds(ps.seconds);
    w->set_cv(ps.cv);
    w->set_cv_sq(ps.cv_sq);
    w->set_wait(ps.wait);
    w->set_cv_wait(ps.cv_wait);
    w->set_last_step(ps.last_step);
  }
  return out;
}

ThroughputTable FromProto(const v1::LearnedTable& table) {
  ThroughputTable out;
  for (const v1::LearnedCell& w : table.cells()) {
    if (w.band() < 0 || w.band() >= kBands || !IsValidMode(w.mode()) || w.last_step() < 0) {
      continue;
    }
    const double sums[] = {w.tokens(), w.seconds(), w.weight(), w.noise()};
    if (!std::all_of(std::begin(sums), std::end(sums),
                     [](double x) { return std::isfinite(x) && x >= 0; }) ||
        !std::isfinite(w.drift()) || !(w.seconds_drift() >= kSecondsDriftMin) ||
        !(w.seconds_drift() <= kSecondsDriftMax) ||
        w.beyond() <= -kChangeConfirmSamples ||
        w.beyond() >= kChangeConfirmSamples ||
        (w.has_straggler_share() &&
         !(w.straggler_share() >= 0 && w.straggler_share() <= 1))) {
      continue;
    }
    out.SetCell(w.band(), FromProto(w.mode()),
                ThroughputCell{w.tokens(), w.seconds(), w.weight(), w.last_step(), w.drift(),
                               w.noise(),
                               w.has_changed_step() ? std::max<int64_t>(-1, w.changed_step())
                                                    : -1,
                               w.beyond(), w.seconds_drift(),
                               w.has_straggler_share() ? w.straggler_share() : -1.0});
  }
  for (const v1::LearnedPair& w : table.pairs()) {
    // Sums of positive seconds: both positive wherever the weight is.
    const double sums[] = {w.sp_seconds(), w.tp_seconds(), w.weight()};
    if (w.band() < 0 || w.band() >= kBands || w.last_step() < 0 ||
        !std::all_of(std::begin(sums), std::end(sums),
                     [](double x) { return std::isfinite(x) && x >= 0; }) ||
        (w.weight() > 0 && !(w.sp_seconds() > 0 && w.tp_seconds() > 0))) {
      continue;
    }
    out.SetPair(w.band(),
                PairedCell{w.sp_seconds(), w.tp_seconds(), w.weight(), w.last_step()});
  }
  // A switch cost is an excess over an estimate: finite, of either sign; its weight not.
  const v1::LearnedSwitchCost& s = table.switch_cost();
  if (table.has_switch_cost() && s.last_step() >= 0 && std::isfinite(s.seconds()) &&
      std::isfinite(s.weight()) && s.weight() >= 0) {
    out.SetSwitchCost(SwitchCostCell{s.seconds(), s.weight(), s.last_step()});
  }
  out.SetChanges(std::max<int64_t>(0, table.changes()));
  out.SetStragglerTiming({.timed = {table.straggler_timed_sp(), table.straggler_timed_tp()},
                          .untimed = table.straggler_untimed()});
  if (table.has_prior()) {
    const v1::LearnedPrior& w = table.prior();
    const auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
    // A table written before the declared link was dropped may carry `hardware`: ignored.
    if (w.tp() >= 0 && w.hidden() >= 0 && w.layers() >= 0) {
      out.SetPriorInputs(PriorInputs{w.tp(), w.hidden(), w.layers()});
    }
    // The sums of squares and of the non-negative values stay non-negative; the one of
    // CV × wait too (both are).
    const double sums[] = {w.weight(), w.tokens(), w.tokens_sq(), w.all_gather(),
                           w.tokens_all_gather(), w.seconds(), w.cv(), w.cv_sq(), w.wait(),
                           w.cv_wait()};
    if (w.last_step() >= 0 && std::all_of(std::begin(sums), std::end(sums), ok)) {
      out.SetPriorSums(PriorSums{w.weight(), w.tokens(), w.tokens_sq(), w.all_gather(),
                                 w.tokens_all_gather(), w.seconds(), w.cv(), w.cv_sq(),
                                 w.wait(), w.cv_wait(), w.last_step()});
    }
  }
  return out;
}

absl::StatusOr<JobLayout> FromProto(const v1::JobLayout& l) {
  JobLayout out{.tp = l.tp(),
                .pp = l.pp(),
                .vp = l.vp() == 0 ? 1 : l.vp(),
                .cp = l.cp() == 0 ? 1 : l.cp(),
                .dp = l.dp(),
                .microbatches = l.microbatches()};
  switch (l.schedule()) {
    case v1::JobLayout::SCHEDULE_UNSPECIFIED:
    case v1::JobLayout::SCHEDULE_1F1B: out.schedule = PipelineSchedule::k1F1B; break;
    case v1::JobLayout::SCHEDULE_INTERLEAVED_1F1B:
      out.schedule = PipelineSchedule::kInterleaved1F1B;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrFormat("layout.schedule: unknown value %d", static_cast<int>(l.schedule())));
  }
  return out;
}

void ToProto(const JobLayout& l, v1::JobLayout* out) {
  out->set_tp(l.tp);
  out->set_pp(l.pp);
  out->set_vp(l.vp);
  out->set_cp(l.cp);
  out->set_dp(l.dp);
  out->set_microbatches(l.microbatches);
  out->set_schedule(l.schedule == PipelineSchedule::kInterleaved1F1B
                        ? v1::JobLayout::SCHEDULE_INTERLEAVED_1F1B
                        : v1::JobLayout::SCHEDULE_1F1B);
}

}  // namespace spgate
