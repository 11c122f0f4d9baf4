// Files the daemon reads and writes: the --config file (GateConfig, protobuf text
// format) and the operator state in --state_dir (PersistedState, text format).
// The state file is replaced atomically — temp file, fsync, rename, fsync of the
// directory (spgate::WriteFileAtomically, common/file_util.h) — so a crash leaves either
// the old or the new file, never a torn one.
// A file that does not parse is an error that names the file; it is never replaced
// by defaults.
#ifndef SPGATE_SERVER_PERSISTENCE_H_
#define SPGATE_SERVER_PERSISTENCE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::server {

inline constexpr char kStateFileName[] = "spgated-state.textproto";
// Who owns each job id: its live launch (incarnation, credential digest) and the
// launches it replaced (PersistedLaunches). Written by the launch book (launch_book.h)
// when a launch starts, apart from the operator state, which has its own lock and writer.
inline constexpr char kLaunchesFileName[] = "spgated-launches.textproto";

std::string StateFilePath(const std::string& state_dir);
std::string LaunchesFilePath(const std::string& state_dir);

// Parses a GateConfig text-format file and validates it layered over the defaults.
absl::StatusOr<v1::GateConfig> LoadGateConfigFile(const std::string& path);
// The same for text already read; `source` names it in errors (the file's path).
absl::StatusOr<v1::GateConfig> ParseGateConfigText(const std::string& source,
                                                   const std::string& text);

// nullopt when the state file does not exist yet; a file that does not parse or holds a
// value out of range is CorruptStateFile.
absl::StatusOr<std::optional<v1::PersistedState>> LoadPersistedState(const std::string& state_dir);
// DATA_LOSS for a state file the daemon refuses, `what` naming the file and the field:
// "corrupt state file WHAT (fix or move the file; ...)", the operator's two ways out.
absl::Status CorruptStateFile(absl::string_view what);

absl::Status SavePersistedState(const std::string& state_dir, const v1::PersistedState& state);

// nullopt when the launches file does not exist yet; DATA_LOSS naming the file when it
// does not parse or a launch lacks its job id, incarnation or a well-formed digest.
absl::StatusOr<std::optional<v1::PersistedLaunches>> LoadPersistedLaunches(
    const std::string& state_dir);
absl::Status SavePersistedLaunches(const std::string& state_dir,
                                   const v1::PersistedLaunches& launches);

// A writer killed between creating its temp file and the rename leaves `path`.tmp.<pid>
// (WriteFileAtomically's temp name) behind, one per crash, never read again. Removes
// those whose <pid> is not a live process (a write another process has in flight is left
// alone); returns how many. The daemon calls it at start-up, before it loads the state
// file.
int RemoveStaleTempFiles(const std::string& path);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_PERSISTENCE_H_
