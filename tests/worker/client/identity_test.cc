// IncarnationFromEnvironment: the launcher sources in their documented order
// (worker/client/identity.h), each set and unset in the process environment. A relaunch
// must read as a new incarnation, so TorchElastic's restart count is part of the value
// and torchrun's default run id "none" names nothing.
#include "worker/client/identity.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace spgate::client {
namespace {

constexpr const char* kSources[] = {
    "SPGATE_INCARNATION",  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",        "SLURM_RESTART_COUNT", "PMIX_NAMESPACE",
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

class IncarnationFromEnvironmentTest : public testing::Test {
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

}  // namespace
}  // namespace spgate::client
