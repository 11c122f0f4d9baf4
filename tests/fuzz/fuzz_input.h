// What the harnesses share: the record framing of their inputs and the config invariant.
//
// An input is a sequence of records, each [selector: 1 byte][length: 2 bytes, little
// endian][payload]; a length past the end takes the rest, so any byte string is a valid
// input (possibly of one short record). The selector picks the message type a payload is
// parsed as, so one input drives a short session of calls against one state.
//
// Usage:
//   FuzzRecords records(data, size);
//   uint8_t selector; std::string_view payload;
//   while (records.Next(&selector, &payload)) { ... }
#ifndef SPGATE_TESTS_FUZZ_FUZZ_INPUT_H_
#define SPGATE_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/stubs/logging.h"
#include "policy/gate_config.h"

namespace spgate::fuzz {

// At most this many records of an input are applied (keeps every execution short).
inline constexpr int kMaxRecords = 64;

class FuzzRecords {
 public:
  FuzzRecords(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool Next(uint8_t* selector, std::string_view* payload) {
    if (pos_ >= size_ || count_ >= kMaxRecords) return false;
    *selector = data_[pos_++];
    size_t len = 0;
    if (pos_ + 2 <= size_) {
      len = data_[pos_] | (size_t{data_[pos_ + 1]} << 8);
      pos_ += 2;
    } else {
      pos_ = size_;
    }
    if (len > size_ - pos_) len = size_ - pos_;
    *payload = std::string_view(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    ++count_;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  int count_ = 0;
};

// One record as the generator (make_corpus.cc) writes it.
inline std::string Record(uint8_t selector, const std::string& payload) {
  std::string out(1, static_cast<char>(selector));
  out.push_back(static_cast<char>(payload.size() & 0xff));
  out.push_back(static_cast<char>((payload.size() >> 8) & 0xff));
  return out + payload;
}

// Protobuf logs every string field with invalid UTF-8 it parses; fuzzed inputs are full
// of them. Call once per input (cheap after the first).
inline void QuietProtobufLogs() {
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
}

// A broken invariant is a finding: print it and abort, so libFuzzer keeps the input.
[[noreturn]] inline void Finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

inline void CheckValid(const GateConfig& config, const std::string& where) {
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) {
    Finding(where + ": effective config no longer valid: " + std::string(s.message()));
  }
}

}  // namespace spgate::fuzz

#endif  // SPGATE_TESTS_FUZZ_FUZZ_INPUT_H_
