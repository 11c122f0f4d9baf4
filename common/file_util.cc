// Atomic file replacement; see file_util.h.
#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace spgate {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Closes `fd` and removes `tmp`, keeping the status of the step that failed.
absl::Status Abandon(absl::Status s, int fd, const std::string& tmp) {
  if (fd >= 0) ::close(fd);
  ::unlink(tmp.c_str());
  return s;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                        static_cast<mode_t>(mode));
  if (fd < 0) return Errno("cannot create", tmp);
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Abandon(Errno("cannot write", tmp), fd, tmp);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return Abandon(Errno("cannot fsync", tmp), fd, tmp);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Abandon(Errno("cannot rename onto", path), -1, tmp);
  }
  // The rename is durable only once the directory entry is.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash);
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace spgate
