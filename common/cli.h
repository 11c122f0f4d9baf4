// Command-line conventions shared by the project's binaries. The absl-flags ones
// (spgated, spgate-sim, spgate-worker) call InitFlagsUsage and parse with ParseFlags, so
// that --help and --helpshort list the flags this project defines, wherever the file
// (absl by default lists only a file named after the binary, and printed "No flags
// matched"), --version prints VersionLine, and a refused command line exits 2 like every
// other usage error of ours. spgatectl parses its own command line and prints the same
// VersionLine.
//
// Usage:
//   spgate::InitFlagsUsage("spgate-sim");
//   absl::SetProgramUsageMessage("...");
//   std::vector<char*> rest = spgate::ParseFlags(argc, argv);
#ifndef SPGATE_COMMON_CLI_H_
#define SPGATE_COMMON_CLI_H_

#include <string>
#include <string_view>
#include <vector>

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

// absl::ParseCommandLine with the project's exit statuses. absl ends the process itself
// when it refuses a flag (unknown, or a value that does not parse: its message names the
// flag) and after --help, both with status 1 — which our binaries keep for a run that
// failed. Here a refused command line exits 2 (a usage error), and --help and its kin
// (--helpfull, --helpshort, --helppackage, --helpon, --helpmatch) exit 0, as --version
// and --only_check_args do (the latter checks what absl checks: a binary's own range
// checks run after ParseFlags). Call once, after InitFlagsUsage.
std::vector<char*> ParseFlags(int argc, char* argv[]);

}  // namespace spgate

#endif  // SPGATE_COMMON_CLI_H_
