// IncarnationFromEnvironment: the launcher sources in their documented order
// (worker/client/identity.h), each set and unset in the process environment. A relaunch
// must read as a new incarnation, so TorchElastic's restart count is part of the value
// and torchrun's default run id "none" names nothing. The launch credential: only
// SPGATE_LAUNCH_CREDENTIAL is one (the launcher's ids are visible to other users), new
// ones are 32 lower-case hex digits from the kernel and never repeat, and the rule the
// daemon applies is checked without echoing the secret. The hardware id: a GPU's from its
// properties, the CPU's from /proc/cpuinfo's text (trimmed, printable, at most 128),
// SPGATE_HARDWARE_ID over either.
#include "worker/client/identity.h"

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "common/hardware_id.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;
using ::spgate::testing::StatusIs;

constexpr const char* kSources[] = {
    "SPGATE_INCARNATION",  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",        "SLURM_RESTART_COUNT", "SLURM_STEP_ID",     "PMIX_NAMESPACE",
    "OMPI_MCA_orte_ess_jobid",
};

struct Var {
  const char* name;
  const char* value;
};

struct Case {
  const char* name;
  std::vector<Var> env;
  std::string want;
};

class IncarnationFromEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearAll(); }
  void TearDown() override { ClearAll(); }
  static void ClearAll() {
    for (const char* n : kSources) unsetenv(n);
  }
};

TEST_F(IncarnationFromEnvironmentTest, SourcesInOrder) {
  const std::vector<Case> cases = {
      {"nothing set", {}, ""},
      {"by hand wins", {{"SPGATE_INCARNATION", "abc"}, {"TORCHELASTIC_RUN_ID", "r1"},
                        {"SLURM_JOB_ID", "77"}}, "abc"},
      {"torchelastic, first launch", {{"TORCHELASTIC_RUN_ID", "r1"},
                                      {"TORCHELASTIC_RESTART_COUNT", "0"}},
       "torchelastic-r1-0"},
      {"torchelastic restart is new", {{"TORCHELASTIC_RUN_ID", "r1"},
                                       {"TORCHELASTIC_RESTART_COUNT", "3"}},
       "torchelastic-r1-3"},
      {"torchelastic, no restart count", {{"TORCHELASTIC_RUN_ID", "r1"}}, "torchelastic-r1-0"},
      {"torchelastic wins over slurm", {{"TORCHELASTIC_RUN_ID", "r1"},
                                        {"TORCHELASTIC_RESTART_COUNT", "1"},
                                        {"SLURM_JOB_ID", "77"}},
       "torchelastic-r1-1"},
      {"torchrun default id none falls through", {{"TORCHELASTIC_RUN_ID", "none"},
                                                  {"TORCHELASTIC_RESTART_COUNT", "2"},
                                                  {"SLURM_JOB_ID", "77"}},
       "slurm-77"},
      {"torchrun default id none alone", {{"TORCHELASTIC_RUN_ID", "none"},
                                          {"TORCHELASTIC_RESTART_COUNT", "0"}},
       ""},
      {"empty run id falls through", {{"TORCHELASTIC_RUN_ID", ""}, {"PMIX_NAMESPACE", "ns"}},
       "pmix-ns"},
      {"slurm", {{"SLURM_JOB_ID", "77"}}, "slurm-77"},
      {"slurm requeued", {{"SLURM_JOB_ID", "77"}, {"SLURM_RESTART_COUNT", "2"}}, "slurm-77.2"},
      {"each srun of an allocation is a launch", {{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "3"}},
       "slurm-77-step3"},
      {"srun step of a requeued job", {{"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"},
                                       {"SLURM_RESTART_COUNT", "1"}},
       "slurm-77-step0.1"},
      {"slurm wins over mpi", {{"SLURM_JOB_ID", "77"}, {"PMIX_NAMESPACE", "ns"}}, "slurm-77"},
      {"pmix", {{"PMIX_NAMESPACE", "ns"}, {"OMPI_MCA_orte_ess_jobid", "9"}}, "pmix-ns"},
      {"ompi", {{"OMPI_MCA_orte_ess_jobid", "9"}}, "ompi-9"},
  };
  for (const Case& c : cases) {
    ClearAll();
    for (const Var& v : c.env) setenv(v.name, v.value, /*overwrite=*/1);
    EXPECT_EQ(IncarnationFromEnvironment(), c.want) << c.name;
  }
}

TEST(NewIncarnationTest, ThirtyTwoHexDigitsAndFresh) {
  const std::string a = NewIncarnation();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, NewIncarnation());
}

TEST_F(IncarnationFromEnvironmentTest, OnlySpgateLaunchCredentialIsACredential) {
  unsetenv("SPGATE_LAUNCH_CREDENTIAL");
  for (const char* n : kSources) setenv(n, "visible-to-everyone", /*overwrite=*/1);
  EXPECT_EQ(LaunchCredentialFromEnvironment(), "");
  setenv("SPGATE_LAUNCH_CREDENTIAL", "0123456789abcdef-wrapper", /*overwrite=*/1);
  EXPECT_EQ(LaunchCredentialFromEnvironment(), "0123456789abcdef-wrapper");
  unsetenv("SPGATE_LAUNCH_CREDENTIAL");
}

TEST(NewLaunchCredentialTest, ThirtyTwoLowerCaseHexDigitsNeverRepeated) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> c = NewLaunchCredential();
    ASSERT_THAT(c.status(), IsOk());
    ASSERT_EQ(c->size(), 32u) << *c;
    ASSERT_EQ(c->find_first_not_of("0123456789abcdef"), std::string::npos) << *c;
    ASSERT_THAT(CheckLaunchCredential(*c), IsOk());
    seen.insert(*c);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(HardwareIdTest, GpuIdIsNameCapabilityAndGiB) {
  // A device of 143,771 MiB (141 GB) is 140 GiB, rounded.
  EXPECT_EQ(GpuHardwareId("NVIDIA H200", 9, 0, uint64_t{143771} << 20), "NVIDIA H200 sm_90 140GiB");
  EXPECT_EQ(GpuHardwareId(" NVIDIA  A100-SXM4-80GB\n", 8, 0, uint64_t{81920} << 20),
            "NVIDIA A100-SXM4-80GB sm_80 80GiB");
}

TEST(HardwareIdTest, CpuIdIsTheModelNameTrimmedPrintableAndAtMost128) {
  EXPECT_EQ(CpuHardwareId("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                          "model name\t:  AMD EPYC  9654 96-Core\x01 Processor \n"
                          "processor\t: 1\nmodel name\t: other\n"),
            "cpu:AMD EPYC 9654 96-Core Processor");
  EXPECT_EQ(CpuHardwareId("Processor\t: AArch64 Processor rev 1 (aarch64)\n"),
            "cpu:AArch64 Processor rev 1 (aarch64)");
  const std::string long_id = CpuHardwareId("model name : " + std::string(300, 'x') + "\n");
  EXPECT_EQ(long_id.size(), kMaxHardwareIdLength);
  EXPECT_TRUE(long_id.starts_with("cpu:xxx"));
  // No model line: the machine (uname), never a bare "cpu:".
  const std::string bare = CpuHardwareId("");
  EXPECT_TRUE(bare.starts_with("cpu:") && bare.size() > 4) << bare;
  // The host's, as the client sends it: valid by the daemon's rule.
  unsetenv("SPGATE_HARDWARE_ID");
  const std::string host = DefaultHardwareId();
  EXPECT_TRUE(host.starts_with("cpu:")) << host;
  EXPECT_THAT(ValidateHardwareId(host), IsOk());
}

TEST(HardwareIdTest, TheVariableWinsOverWhatIsDetected) {
  unsetenv("SPGATE_HARDWARE_ID");
  EXPECT_EQ(DefaultHardwareId("NVIDIA H200 sm_90 140GiB"), "NVIDIA H200 sm_90 140GiB");
  setenv("SPGATE_HARDWARE_ID", "lab-h200-nvl", 1);
  EXPECT_EQ(DefaultHardwareId("NVIDIA H200 sm_90 140GiB"), "lab-h200-nvl");
  EXPECT_EQ(DefaultHardwareId(), "lab-h200-nvl");
  setenv("SPGATE_HARDWARE_ID", "", 1);  // empty counts as unset
  EXPECT_EQ(DefaultHardwareId("gpu"), "gpu");
  unsetenv("SPGATE_HARDWARE_ID");
  // What a CUDA worker's device cannot name falls back to the host's CPU.
  EXPECT_TRUE(DefaultHardwareId("\x01").starts_with("cpu:"));
}

TEST(ValidateLaunchCredentialTest, SixteenToOneHundredTwentyEightPrintableCharacters) {
  EXPECT_THAT(CheckLaunchCredential(std::string(16, '!')), IsOk());
  EXPECT_THAT(CheckLaunchCredential(std::string(128, '~')), IsOk());
  EXPECT_THAT(CheckLaunchCredential(""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "launch_credential: must be 16 to 128 characters, got 0"));
  EXPECT_THAT(CheckLaunchCredential(std::string(129, 'a'), "SPGATE_LAUNCH_CREDENTIAL"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "SPGATE_LAUNCH_CREDENTIAL: must be 16 to 128 characters, got 129"));
  EXPECT_THAT(CheckLaunchCredential("secret-secret secret"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "launch_credential: printable ASCII without spaces only (character 14 "
                       "is not)"));
  EXPECT_THAT(CheckLaunchCredential(std::string("secret-secret-secret\x7f")),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("character 21")));
}

}  // namespace
}  // namespace spgate::client
