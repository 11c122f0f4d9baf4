// ADAPTIVE's learned tables on disk (docs/operations.md, "What persists"): one file per
// job, <state_dir>/learned/<job_id>.textproto (v1::PersistedLearned, text format), written
// atomically (spgate::WriteFileAtomically: temp file, fsync, rename, fsync of the
// directory), so a crash leaves the last complete file. GateState writes them from the
// sweep thread (never on the decision path) and reads them once at start-up.
//
// A file is refused — never half-loaded — when it does not parse, is larger than a job's
// tables can be, names another format version or table shape, fails its checksum (a
// truncated or altered file), or holds a value out of range; the error names the file and
// the field. LoadLearnedDir renames a refused file aside (<file>.corrupt, or .corrupt.N
// when earlier refusals' copies hold the names before) and its job starts cold.
//
// A later launch of the job starts from the previous launch's tables only when it
// declares the same layout, group size, model shape and hardware id (LearnedKey; a file
// written before hardware ids has an empty one, which only a launch declaring none
// matches), aged by
// the half-life over the steps the job could have run since the last fold
// (AgeLearned), and restamped at its first step (RestampLearned): a relaunch's step
// counter starts again at its checkpoint or at 0.
//
// Usage:
//   RETURN_IF_ERROR(SaveLearned(state_dir, record, kMaxPipelineStages));
//   LoadedLearned loaded = LoadLearnedDir(state_dir, kMaxPipelineStages, max_jobs);
//   for (const std::string& line : loaded.problems) Log(line);  // refused files
#ifndef SPGATE_SERVER_LEARNED_STORE_H_
#define SPGATE_SERVER_LEARNED_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "policy/adaptive_policy.h"
#include "policy/cost_prior.h"
#include "policy/gate_policy.h"
#include "policy/step_plan.h"

namespace spgate::v1 {
class PersistedLearned;
}  // namespace spgate::v1

namespace spgate::server {

inline constexpr char kLearnedDirName[] = "learned";
inline constexpr int kLearnedFormatVersion = 1;
// The most text one table can take (64 cells, the switch cost and the prior, printed by
// TextFormat: about 17 KiB); a file holds at most 1 + stages tables.
inline constexpr int64_t kMaxLearnedTableBytes = 32 * 1024;

// What a launch declares at Register that its tables depend on: a later launch declaring
// the same starts from them, any other starts cold.
struct LearnedKey {
  std::optional<JobLayout> layout;  // none: plain plans
  PriorInputs declared;             // tp (the group size), hidden, layers
  // RegisterRequest.hardware_id (common/hardware_id.h): an identity, never a prior input.
  // Empty: none declared (an older client).
  std::string hardware_id;
  friend bool operator==(const LearnedKey&, const LearnedKey&) = default;
};

// One job's learned state as persisted.
struct LearnedRecord {
  std::string job_id;
  std::string incarnation;  // the launch that learned it
  LearnedKey key;
  absl::Time fold_time = absl::UnixEpoch();  // when its newest step was folded in
  double step_seconds = 0;                   // the job's mean step time then; 0: unknown
  double cv_band_width = 0;                  // the band edges it was learned with
  int64_t tokens_band_base = 0;
  ThroughputTable table;                     // a job without a layout
  std::vector<ThroughputTable> stage_tables; // a job with a layout: one per stage
  friend bool operator==(const LearnedRecord&, const LearnedRecord&) = default;
};

std::string LearnedDirPath(const std::string& state_dir);
std::string LearnedFilePath(const std::string& state_dir, const std::string& job_id);
// The largest file a job of at most `max_stages` pipeline stages can have.
int64_t MaxLearnedFileBytes(int max_stages);

// The checksum a file's message must carry: FNV-1a 64 of its deterministic binary form
// with the checksum unset.
uint64_t LearnedChecksum(const v1::PersistedLearned& message);
// The file's contents (a comment line, then the text format with its checksum).
std::string SerializeLearned(const LearnedRecord& record);
// DATA_LOSS naming `source` and the field: see the top of this file. `expected_job_id`
// (non-empty): the job the file name says it holds.
absl::StatusOr<LearnedRecord> ParseLearned(const std::string& source, const std::string& text,
                                           const std::string& expected_job_id, int max_stages);

// Writes the record's file (making <state_dir>/learned/ if needed); INTERNAL naming the
// path on failure, the old file then left as it was. Refuses (FAILED_PRECONDITION) a
// record over MaxLearnedFileBytes(max_stages).
absl::Status SaveLearned(const std::string& state_dir, const LearnedRecord& record,
                         int max_stages);
// Removes the job's file; a missing one is not an error.
absl::Status RemoveLearned(const std::string& state_dir, const std::string& job_id);

struct LoadedLearned {
  std::vector<LearnedRecord> records;  // at most max_records, the newest folds first
  // One line per file refused or skipped, naming the file, what is wrong and what was
  // done with it; for the daemon's log.
  std::vector<std::string> problems;
};
// Reads every job's file under <state_dir>/learned/ (none: nothing), removing the temp
// files of writers that died (RemoveStaleTempFiles). A refused file is renamed to the
// first free one of <file>.corrupt, <file>.corrupt.1, ... (never over an earlier copy;
// left in place when it cannot be) and reported.
LoadedLearned LoadLearnedDir(const std::string& state_dir, int max_stages, int max_records);

// The table with every weight decayed over `steps` more steps at the config's half-life
// (cells never below adaptive_min_samples once they had them, as ThroughputTable's own
// forgetting); the prior's collective sums are kept (they describe the hardware, which
// the key holds the same). Steps stay as they were.
ThroughputTable AgeLearned(const GateConfig& config, const ThroughputTable& table, double steps);
// The table brought to its newest step (each cell decayed as ThroughputTable::At would)
// and restamped there as `step`: every cell, the switch cost and the prior's sums then
// last folded at `step`; a detected change keeps its distance from the newest step (one
// that would fall before step 0 is dropped).
ThroughputTable RestampLearned(const GateConfig& config, const ThroughputTable& table,
                               int64_t step);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_LEARNED_STORE_H_
