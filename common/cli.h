// Command-line conventions shared by the project's binaries. The absl-flags ones
// (spgated, spgate-sim, spgate-worker) call InitFlagsUsage before absl::ParseCommandLine,
// so that --help and --helpshort list the flags this project defines, wherever the file
// (absl by default lists only a file named after the binary, and printed "No flags
// matched"), and --version prints VersionLine. spgatectl parses its own command line and
// prints the same VersionLine.
//
// Usage:
//   spgate::InitFlagsUsage("spgate-sim");
//   absl::SetProgramUsageMessage("...");
//   std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
#ifndef SPGATE_COMMON_CLI_H_
#define SPGATE_COMMON_CLI_H_

#include <string>
#include <string_view>

namespace spgate {

// "spgated 0.1.0\n": the program and the project's one version (common/version.h).
std::string VersionLine(std::string_view program);

// Whether a flag defined in `filename` (as absl's usage filter sees it, after
// InitFlagsUsage's normalisation) is one of this project's: a path below the source
// root, not absl's own nor a dependency's.
bool IsProjectFlagFile(std::string_view filename);

// Sets absl's usage config: --help/--helpshort filters (IsProjectFlagFile), file names
// relative to the source root, and the --version string. Call once, first in main.
void InitFlagsUsage(std::string_view program);

}  // namespace spgate

#endif  // SPGATE_COMMON_CLI_H_
