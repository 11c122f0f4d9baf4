// The audit file; see audit_log.h.
#include "server/audit_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace spgate::server {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status FsyncParent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

std::string AuditLogPath(const std::string& state_dir) {
  return absl::StrCat(state_dir, "/", kAuditFileName);
}

std::string AuditLine(const v1::AuditEntry& entry) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(entry, &json, options);
  json.push_back('\n');
  return json;
}

absl::StatusOr<AuditAppend> AuditAppend::Start(const std::string& path,
                                               const v1::AuditEntry& entry) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return Errno("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = Errno("cannot stat", path);
    ::close(fd);
    return s;
  }
  AuditAppend pending(fd, st.st_size, path);
  const std::string line = AuditLine(entry);
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = Errno("cannot append to", path);
      (void)pending.Undo();
      return s;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = Errno("cannot fsync", path);
    (void)pending.Undo();
    return s;
  }
  // A new file is durable only once its directory entry is.
  if (st.st_size == 0) {
    if (absl::Status s = FsyncParent(path); !s.ok()) {
      (void)pending.Undo();
      return s;
    }
  }
  return pending;
}

AuditAppend::AuditAppend(AuditAppend&& other) noexcept
    : fd_(other.fd_), old_size_(other.old_size_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

AuditAppend::~AuditAppend() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status AuditAppend::Undo() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s;
  if (::ftruncate(fd_, old_size_) != 0 || ::fsync(fd_) != 0) {
    s = Errno("cannot take the line back out of", path_);
  }
  ::close(fd_);
  fd_ = -1;
  return s;
}

absl::StatusOr<std::vector<AuditRecord>> ReadAuditLog(const std::string& path, int64_t before,
                                                      int64_t max_bytes) {
  std::vector<AuditRecord> out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return out;
    return Errno("cannot read", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    absl::Status s = Errno("cannot stat", path);
    ::close(fd);
    return s;
  }
  const int64_t end = before < 0 ? st.st_size : std::min<int64_t>(before, st.st_size);
  const int64_t start = std::max<int64_t>(0, end - max_bytes);
  std::string text(static_cast<size_t>(end - start), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + got, text.size() - got,
                              static_cast<off_t>(start + static_cast<int64_t>(got)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  size_t pos = 0;
  if (start > 0) {  // the window starts inside a line: skip to the next whole one
    const size_t nl = text.find('\n');
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line
    AuditRecord record{start + static_cast<int64_t>(pos), {}};
    const std::string line = text.substr(pos, nl - pos);
    if (google::protobuf::util::JsonStringToMessage(line, &record.entry, options).ok()) {
      out.push_back(std::move(record));
    }
    pos = nl + 1;
  }
  return out;
}

absl::StatusOr<int64_t> NewestAuditVersion(const std::string& path) {
  for (int64_t window = 64 << 10;; window *= 16) {
    window = std::min(window, kMaxAuditReadBytes);
    ASSIGN_OR_RETURN(std::vector<AuditRecord> entries, ReadAuditLog(path, -1, window));
    // Every entry carries the counter; a log written before it did has pins, unpins and
    // forgets with no version (0): the newest change that has one.
    int64_t newest = 0;
    for (const AuditRecord& r : entries) {
      newest = std::max({newest, r.entry.version(), r.entry.version_counter()});
    }
    if (newest > 0 || window == kMaxAuditReadBytes) return newest;
  }
}

}  // namespace spgate::server
