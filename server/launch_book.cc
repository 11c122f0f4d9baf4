// The launch book: each job's lease and the launches file; see launch_book.h. The only
// place the leases meet their wire form (v1::PersistedLaunches).
#include "server/launch_book.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/convert.h"
#include "server/call_credentials.h"  // ConstantTimeEquals
#include "server/persistence.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::server {
namespace {

void AddLaunch(const std::string& job_id, const LaunchLease& lease, v1::PersistedLaunches& out) {
  if (lease.incarnation.empty()) return;  // released: nothing to keep
  v1::PersistedLaunch* l = out.add_launches();
  l->set_job_id(job_id);
  l->set_incarnation(lease.incarnation);
  l->set_credential_sha256(lease.credential_digest);
  for (const std::string& r : lease.retired) l->add_retired(r);
  *l->mutable_start_time() = ToTimestamp(lease.start);
}

}  // namespace

LaunchBook::LaunchBook(Options options, Metrics& metrics)
    : options_([&] {
        if (!options.clock) options.clock = [] { return absl::Now(); };
        return std::move(options);
      }()),
      path_(options_.state_dir.empty() ? "" : LaunchesFilePath(options_.state_dir)),
      metrics_(metrics) {}

absl::StatusOr<std::vector<LaunchBook::Restored>> LaunchBook::Restore() {
  std::vector<Restored> restored;
  if (options_.state_dir.empty()) return restored;
  RemoveStaleTempFiles(path_);
  absl::StatusOr<std::optional<v1::PersistedLaunches>> launches =
      LoadPersistedLaunches(options_.state_dir);
  if (!launches.ok()) return launches.status();
  if (!launches->has_value()) return restored;
  const absl::Time now = Now();
  std::map<std::string, LaunchLease> read;
  for (const v1::PersistedLaunch& l : (*launches)->launches()) {
    LaunchLease& lease = read[l.job_id()];  // a job named twice: the later entry
    lease.incarnation = l.incarnation();
    lease.credential_digest = l.credential_sha256();
    lease.start = l.has_start_time() ? FromTimestamp(l.start_time()) : now;
    lease.retired.assign(l.retired().begin(), l.retired().end());
    lease.held_until = now + options_.restored_hold;
  }
  for (auto& [job_id, lease] : read) {
    restored.push_back({job_id, lease.incarnation});
    leases_[job_id] = std::move(lease);
  }
  return restored;
}

absl::StatusOr<LaunchBook::Claim> LaunchBook::Check(const std::string& job_id,
                                                   const std::string& incarnation,
                                                   const std::string& digest,
                                                   absl::FunctionRef<bool()> ranks_heard_from) {
  auto it = leases_.find(job_id);
  if (it == leases_.end()) return Claim::kStart;
  const LaunchLease& live = it->second;
  if (live.incarnation == incarnation) {
    if (!ConstantTimeEquals(live.credential_digest, digest)) {
      metrics_.refused_launch_credential.Increment();
      return absl::PermissionDeniedError(absl::StrFormat(
          "launch_credential: does not match the credential launch \"%s\" of job %s "
          "registered with; every rank of a launch presents the one its world rank 0 made",
          incarnation, job_id));
    }
    return Claim::kJoin;
  }
  if (std::find(live.retired.begin(), live.retired.end(), incarnation) != live.retired.end()) {
    metrics_.refused_stale_incarnation.Increment();
    return absl::FailedPreconditionError(absl::StrFormat(
        "incarnation: launch \"%s\" of job %s was replaced by a newer launch; a rank of a "
        "replaced launch cannot rejoin",
        incarnation, job_id));
  }
  // One launch at a time: a second launch under the same job id while the first still
  // runs is a mistake or someone taking the job over, and the running launch keeps it.
  // A launch that ended (its streams closed, or its ranks silent for stale_after) hands
  // over; the new launch's ranks retry until then (docs/security.md). A launch just read
  // back after a restart holds until its ranks have had the time to come back. The
  // message names nothing the caller did not send.
  const absl::Time now = Now();
  if (!live.incarnation.empty() && now < live.held_until) {
    metrics_.refused_live_incarnation.Increment();
    return absl::FailedPreconditionError(absl::StrFormat(
        "incarnation: job %s is held by a launch the daemon read back after its restart, "
        "for %s (its ranks' time to come back); launch \"%s\" is accepted after that if "
        "none of them is back, in %s at the earliest",
        job_id, absl::FormatDuration(options_.restored_hold), incarnation,
        absl::FormatDuration(absl::Ceil(live.held_until - now, absl::Seconds(1)))));
  }
  if (!live.incarnation.empty() && ranks_heard_from()) {
    metrics_.refused_live_incarnation.Increment();
    return absl::FailedPreconditionError(absl::StrFormat(
        "incarnation: job %s is held by another launch whose ranks are still running; "
        "launch \"%s\" is accepted once they have closed their streams or been silent for "
        "%s (--stale_after)",
        job_id, incarnation, absl::FormatDuration(options_.stale_after)));
  }
  return Claim::kStart;
}

absl::Status LaunchBook::Take(const std::string& job_id, const std::string& incarnation,
                              const std::string& digest) {
  LaunchLease next;
  if (auto it = leases_.find(job_id); it != leases_.end()) {
    next.retired = it->second.retired;
    next.held_until = it->second.held_until;
    if (!it->second.incarnation.empty()) next.retired.push_back(it->second.incarnation);
    while (next.retired.size() > kRetiredLaunchesKept) next.retired.pop_front();
  }
  next.incarnation = incarnation;
  next.credential_digest = digest;
  next.start = Now();
  if (!options_.state_dir.empty() && !options_.read_only) {
    if (absl::Status s = Write(job_id, &next); !s.ok()) {
      return WriteFailed(absl::StrCat("cannot persist the new launch of job ", job_id,
                                      " (nothing changed; retry): ", s.message()));
    }
  }
  leases_[job_id] = std::move(next);
  return absl::OkStatus();
}

void LaunchBook::Release(const std::string& job_id) {
  auto it = leases_.find(job_id);
  if (it == leases_.end()) return;
  it->second.incarnation.clear();
  it->second.credential_digest.clear();
  it->second.start = Now();
}

void LaunchBook::Forget(const std::string& job_id) { leases_.erase(job_id); }

absl::Status LaunchBook::Save() {
  if (options_.state_dir.empty() || options_.read_only) return absl::OkStatus();
  absl::Status s = Write("", nullptr);
  return s.ok() ? s : WriteFailed(std::string(s.message()));
}

absl::Status LaunchBook::WriteFailed(std::string what) {
  if (options_.on_write_failure) options_.on_write_failure(what);
  return absl::UnavailableError(std::move(what));
}

const LaunchLease* LaunchBook::Find(const std::string& job_id) const {
  auto it = leases_.find(job_id);
  return it == leases_.end() ? nullptr : &it->second;
}

absl::Status LaunchBook::Write(const std::string& job_id, const LaunchLease* next) const {
  v1::PersistedLaunches out;
  bool seen = false;
  for (const auto& [id, lease] : leases_) {
    const bool replaced = next != nullptr && id == job_id;
    seen = seen || replaced;
    AddLaunch(id, replaced ? *next : lease, out);
  }
  if (next != nullptr && !seen) AddLaunch(job_id, *next, out);
  return SavePersistedLaunches(options_.state_dir, out);
}

}  // namespace spgate::server
