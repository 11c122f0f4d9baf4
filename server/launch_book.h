// Who owns each job id (docs/security.md, "Launch credentials"; docs/design.md §10): one
// named lease per job — its live launch (the incarnation), the SHA-256 of that launch's
// credential, when it started, the launches it replaced — and the launches file
// (persistence.h, kLaunchesFileName) that keeps them across a restart. A lease is renewed
// while its launch's ranks are heard from (the live state says so: it owns the ranks),
// taken over by a new launch once they are not, and a lease read back after a restart
// holds its job until its restored hold expires, by the injected clock. One table under
// one lock.
//
// Invariants:
//  - a launch is joined only with its credential (its digest, compared in constant time);
//  - a new launch takes a job only from a launch whose ranks have gone and whose restored
//    hold is over, and a launch it replaced never takes the job again (the last
//    kRetiredLaunchesKept are kept);
//  - a new lease is written to the file before it is granted (Take), so a crash never
//    leaves a granted lease the file does not hold; a file that does not parse is an
//    error naming it, and it is never replaced.
//
// Locking: mu() guards the table and is held across a launch change — check, write the
// file, grant — so that no two interleave. Callers take it before the live state's own
// mutex and never on the decision path (server/gate_state.h).
//
// Usage (GateState::Register):
//   MutexLock launch(&book.mu());
//   ASSIGN_OR_RETURN(LaunchBook::Claim c, book.Check(job, incarnation, digest, heard_from));
//   if (c == LaunchBook::Claim::kStart) RETURN_IF_ERROR(book.Take(job, incarnation, digest));
#ifndef SPGATE_SERVER_LAUNCH_BOOK_H_
#define SPGATE_SERVER_LAUNCH_BOOK_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "server/metrics.h"

namespace spgate::server {

inline constexpr size_t kRetiredLaunchesKept = 16;

// One job's lease.
struct LaunchLease {
  std::string incarnation;        // the live launch; empty: released (none live)
  std::string credential_digest;  // LaunchCredentialDigest of its credential
  absl::Time start;
  // A launch read back after a restart holds its job until then (restored_hold).
  absl::Time held_until = absl::InfinitePast();
  std::deque<std::string> retired;  // launches it replaced, newest last
};

class LaunchBook {
 public:
  struct Options {
    std::string state_dir;  // empty: in memory only (no file)
    absl::Duration restored_hold = absl::Seconds(15);
    absl::Duration stale_after = absl::Seconds(5);  // named in the refusal's message
    std::function<absl::Time()> clock;              // empty: absl::Now
    // Read the file, never write it (a read-only state_dir): leases live in memory.
    bool read_only = false;
    // A failed write, naming the file: counted and logged by the owner (GateState).
    // Called with the book's lock held: it must not call back into the book.
    std::function<void(absl::string_view what)> on_write_failure;
  };
  LaunchBook(Options options, Metrics& metrics);

  Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // The launches file ("" without a state_dir).
  const std::string& path() const { return path_; }

  // Reads the launches file back (a missing one: nothing) and returns the restored
  // (job id, incarnation) pairs; each holds its job for restored_hold from now. DATA_LOSS
  // naming the file for one that does not parse or holds a malformed launch: then the
  // table is unchanged and the file left as it is.
  struct Restored {
    std::string job_id;
    std::string incarnation;
  };
  absl::StatusOr<std::vector<Restored>> Restore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What a Register of (job, incarnation) presenting `digest` does: join the job's live
  // launch (kJoin) or start a new one (kStart). Refused, and counted, with nothing
  // changed: PERMISSION_DENIED for another credential, FAILED_PRECONDITION for a launch
  // the job replaced or while the live launch holds its job — `ranks_heard_from` (asked
  // only then) or its restored hold. Messages name only what the caller sent.
  enum class Claim { kJoin, kStart };
  absl::StatusOr<Claim> Check(const std::string& job_id, const std::string& incarnation,
                              const std::string& digest,
                              absl::FunctionRef<bool()> ranks_heard_from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants the job to a new launch, the one it replaces retired: the file is written
  // first, and a write that fails is UNAVAILABLE (counted) with nothing changed.
  absl::Status Take(const std::string& job_id, const std::string& incarnation,
                    const std::string& digest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's live launch is gone (idle): no lease, the retired launches stay. Memory
  // only, like an idle job's forgetting.
  void Release(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the job's lease and retired launches; Save writes that down.
  void Forget(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the table as it is (nothing without a state_dir); a failure is counted and
  // logged.
  absl::Status Save() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The job's lease; nullptr: the book has none.
  const LaunchLease* Find(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  absl::Time Now() const { return options_.clock(); }
  // The table as the file holds it, with `job_id`'s entry replaced by `next` (an empty
  // job_id: as it is). Released leases are not written.
  absl::Status Write(const std::string& job_id, const LaunchLease* next) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed write: told to on_write_failure, and UNAVAILABLE with `what`.
  absl::Status WriteFailed(std::string what);

  const Options options_;
  const std::string path_;
  Metrics& metrics_;
  Mutex mu_;
  std::map<std::string, LaunchLease> leases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_LAUNCH_BOOK_H_
