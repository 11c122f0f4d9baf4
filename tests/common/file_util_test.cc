// WriteFileAtomically (common/file_util.h): the new contents replace the old ones whole,
// the temp file never outlives the call, the mode is the caller's, and a failure names
// the step, the path and the errno text.
#include "common/file_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "file_util_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    ::chmod(dir_.c_str(), 0700);
    fs::remove_all(dir_);
  }
  // Every name in the directory but `keep`: no temp file may be left behind.
  int Others(const std::string& keep) const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().filename() != keep;
    return n;
  }
  std::string dir_;
};

TEST_F(FileUtilTest, CreatesThenReplacesWhole) {
  const std::string path = dir_ + "/state.textproto";
  ASSERT_OK(WriteFileAtomically(path, "a much longer first version\n"));
  EXPECT_EQ(Read(path), "a much longer first version\n");
  ASSERT_OK(WriteFileAtomically(path, "v2\n"));
  EXPECT_EQ(Read(path), "v2\n");  // not a tail of the old contents
  ASSERT_OK(WriteFileAtomically(path, ""));
  EXPECT_EQ(Read(path), "");
  EXPECT_EQ(Others("state.textproto"), 0);
}

TEST_F(FileUtilTest, ModeIsTheCallers) {
  const mode_t old_umask = ::umask(022);
  const std::string daemon = dir_ + "/daemon", user = dir_ + "/user";
  ASSERT_OK(WriteFileAtomically(daemon, "x"));
  ASSERT_OK(WriteFileAtomically(user, "x", 0666));
  ::umask(old_umask);
  struct stat st;
  ASSERT_EQ(::stat(daemon.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  ASSERT_EQ(::stat(user.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST_F(FileUtilTest, MissingDirectoryNamesTheTempFileAndErrno) {
  const std::string path = dir_ + "/no/such/dir/out.json";
  EXPECT_THAT(WriteFileAtomically(path, "x"),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr(absl::StrCat("cannot create ", path, ".tmp.")),
                             HasSubstr("No such file or directory"))));
}

TEST_F(FileUtilTest, FailedRenameLeavesNoTempFile) {
  // A directory where the file should be: the rename fails (EISDIR) after the temp file
  // is written, and the call must clean up after itself.
  const std::string path = dir_ + "/taken";
  fs::create_directory(path);
  EXPECT_THAT(WriteFileAtomically(path, "x"),
              StatusIs(absl::StatusCode::kInternal,
                       AllOf(HasSubstr(absl::StrCat("cannot rename onto ", path, ": ")),
                             HasSubstr("Is a directory"))));
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(Others("taken"), 0);
}

}  // namespace
}  // namespace spgate
