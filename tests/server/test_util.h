// Small fixtures the server's unit tests share: a fake clock to inject into StateOptions
// and StoreOptions, a fresh temporary --state_dir per call, whole-file reads for the
// state file and the audit log, and the one-field config update most tests make.
#ifndef SPGATE_TESTS_SERVER_TEST_UTIL_H_
#define SPGATE_TESTS_SERVER_TEST_UTIL_H_

#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "spgate/v1/admin.pb.h"

namespace spgate::server {

class FakeClock {
 public:
  absl::Time Now() const { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

// A new, empty directory under the test's temp dir.
inline std::string TempDir() {
  std::string dir = ::testing::TempDir() + "/server_test_XXXXXX";
  return mkdtemp(dir.data());
}

// The file's bytes; empty when it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An update of max_length_cv alone, globally or (job non-empty) for one job.
inline v1::UpdateGateConfigRequest SetCv(double cv, const std::string& job = "") {
  v1::UpdateGateConfigRequest up;
  up.set_job_id(job);
  up.mutable_config()->set_max_length_cv(cv);
  up.mutable_update_mask()->add_paths("max_length_cv");
  return up;
}

}  // namespace spgate::server

#endif  // SPGATE_TESTS_SERVER_TEST_UTIL_H_
