// Small fixtures the server's unit tests share: a fake clock to inject into StateOptions
// and StoreOptions, a fresh temporary --state_dir per call (removed when the test binary
// exits), whole-file reads for the state file and the audit log, and the one-field config
// update most tests make.
#ifndef SPGATE_TESTS_SERVER_TEST_UTIL_H_
#define SPGATE_TESTS_SERVER_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

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

// The directories TempDir made, removed with everything in them when the test binary exits
// normally (the state files, audit logs and test certificates a test writes there); a
// binary that crashes leaves its own to look at.
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& dir : dirs_) {
      std::error_code ignored;  // best effort: a test may have removed it already
      std::filesystem::remove_all(dir, ignored);
    }
  }
  void Add(std::string dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(std::move(dir));
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

// A new, empty directory under the test's temp dir, named `prefix`_XXXXXX.
inline std::string TempDir(const std::string& prefix = "server_test") {
  static TempDirs made;
  std::string dir = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror(("mkdtemp " + dir).c_str());
    std::abort();
  }
  made.Add(dir);
  return dir;
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
