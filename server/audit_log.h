// The audit trail of operator changes: <state_dir>/audit.log, one AuditEntry per line
// in protobuf JSON (docs/design.md §5). The store appends a line as part of persist
// before apply: the line is appended and fsynced first, then the state file is written;
// if that write fails the line is cut off again, so the file never records a change
// that was not made. Reads are bounded: only the newest kMaxAuditReadBytes are parsed.
//
// Usage:
//   ASSIGN_OR_RETURN(AuditAppend pending, AuditAppend::Start(path, entry));
//   if (!SaveTheState().ok()) pending.Undo();   // the line is gone again
#ifndef SPGATE_SERVER_AUDIT_LOG_H_
#define SPGATE_SERVER_AUDIT_LOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::server {

inline constexpr char kAuditFileName[] = "audit.log";
// How much of the file history and rollback read, from its end.
inline constexpr int64_t kMaxAuditReadBytes = 16 << 20;

std::string AuditLogPath(const std::string& state_dir);

// One entry as a single line of JSON (proto field names), ending in '\n'.
std::string AuditLine(const v1::AuditEntry& entry);

// An appended, fsynced line that can still be taken back (ftruncate to the old size)
// while the caller holds the store's persist lock, so no other line follows it.
class AuditAppend {
 public:
  static absl::StatusOr<AuditAppend> Start(const std::string& path, const v1::AuditEntry& entry);
  AuditAppend(AuditAppend&& other) noexcept;
  AuditAppend& operator=(AuditAppend&&) = delete;
  ~AuditAppend();
  // Cuts the line off again (best effort: a failure leaves a line for a change that
  // was not made, which is reported).
  absl::Status Undo();

 private:
  AuditAppend(int fd, int64_t old_size, std::string path)
      : fd_(fd), old_size_(old_size), path_(std::move(path)) {}
  int fd_;
  int64_t old_size_;
  std::string path_;
};

struct AuditRecord {
  int64_t offset;  // of the line in the file: the page token of older entries
  v1::AuditEntry entry;
};

// The entries that start before byte `before` (-1: the end of the file), oldest first,
// from at most the last `max_bytes` before it. A missing file is no entries; a line that
// does not parse (a torn last line after a crash) is skipped.
absl::StatusOr<std::vector<AuditRecord>> ReadAuditLog(const std::string& path,
                                                      int64_t before = -1,
                                                      int64_t max_bytes = kMaxAuditReadBytes);

// Where versions go on: the newest entry's version_counter (every entry has it), or in a
// log written before entries carried it, the newest config change's version (pins, unpins
// and forgets had none). The tail is read in windows of 64 KiB, growing to
// kMaxAuditReadBytes, until one holds either. 0 for a missing log or one with neither.
absl::StatusOr<int64_t> NewestAuditVersion(const std::string& path);

}  // namespace spgate::server

#endif  // SPGATE_SERVER_AUDIT_LOG_H_
