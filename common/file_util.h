// Files written so that a crash never leaves a torn one: the daemon's operator state
// (server/persistence.cc) and spgate-worker's --summary_json both go through here.
//
// Invariant: after WriteFileAtomically returns OK, `path` holds exactly `contents`, on
// disk (the file and its directory entry fsynced); after a failure or a crash at any
// point, `path` holds either its old contents or the new ones, never a mix. The write
// goes through `path`.tmp.<pid>, which a failed call removes; a writer killed before the
// rename leaves it behind (server/persistence.h RemoveStaleTempFiles cleans those up).
//
// Usage:
//   RETURN_IF_ERROR(spgate::WriteFileAtomically("/var/lib/spgated/state.textproto", text));
#ifndef SPGATE_COMMON_FILE_UTIL_H_
#define SPGATE_COMMON_FILE_UTIL_H_

#include <string>

#include "absl/status/status.h"

namespace spgate {

// Temp file, write, fsync, rename onto `path`, fsync of the directory. `mode` is the new
// file's permission bits (before the umask). INTERNAL naming the step, the path and the
// errno text ("cannot rename onto /x/y: Permission denied") on failure.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode = 0640);

}  // namespace spgate

#endif  // SPGATE_COMMON_FILE_UTIL_H_
