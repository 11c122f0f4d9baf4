// The worker's options (worker/runtime/worker.h): bad flags are refused naming them.
// The run itself is tested over MPI (worker_runtime_mpi_test.cc) and through the binary
// (worker_cli_test.py).

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/worker.h"

namespace spgate::runtime {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ValidationTest, WorkerOptionsNameTheFlags) {
  WorkerOptions o;
  o.tokens_per_batch = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tokens_per_batch")));
  o = WorkerOptions{};
  o.steps = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--steps")));
  o.duration = absl::Seconds(3);
  EXPECT_OK(ValidateWorkerOptions(o));
  o = WorkerOptions{};
  o.lengths = "lognormal:mean=0,sigma=1";
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lengths")));
  // Gradient accumulation is the step's micro-batch loop (--grad_accum_steps is an alias
  // of --microbatches): checked as --microbatches, at pp = 1 too.
  o = WorkerOptions{};
  o.microbatches = 4097;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--microbatches=4097 must be in [1, 4096]")));
  // The client's rules for the controller and the job id, by flag, before MPI starts (a
  // runtime error on every rank otherwise).
  o = WorkerOptions{};
  o.client.controller = "127.0.0.1:85136";
  o.client.job_id = "j";
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--controller: \"127.0.0.1:85136\" is not host:port")));
  o.client.controller = "127.0.0.1:50061";
  o.client.job_id = "bad!id";
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--job_id: \"bad!id\"")));
  o.client.job_id = "good-id";
  EXPECT_OK(ValidateWorkerOptions(o));
}

// Pipeline stages: the layers split evenly over the stages, the CPU backend, --verify per
// stage, and the native stage boundary only for a forced mode (every stage the same).
TEST(ValidationTest, PipelineOptionsNameTheFlags) {
  WorkerOptions o;
  o.pp = 2;
  o.microbatches = 4;
  EXPECT_OK(ValidateWorkerOptions(o));  // 2 layers over 2 stages
  o.pp = 3;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--layers=2 must be a multiple of --pp=3")));
  o.pp = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pp")));
  o.pp = 2;
  o.microbatches = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--microbatches")));
  o.microbatches = 4;
  o.backend = Backend::kNccl;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--backend=cpu")));
  o.backend = Backend::kCpu;
  o.verify = true;  // per stage: each micro-batch through the stage's layers in both modes
  EXPECT_OK(ValidateWorkerOptions(o));
  o.verify = false;
  o.native_stage_boundary = true;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--stage_boundary=native")));
  o.mode = ModeChoice::kTp;
  EXPECT_OK(ValidateWorkerOptions(o));
}

// The credential comes from the environment (never a flag), and is named by its variable;
// without a controller it is not used, so not checked.
TEST(ValidationTest, ALaunchCredentialIsCheckedWithAController) {
  WorkerOptions o;
  o.client.launch_credential = "short";
  EXPECT_OK(ValidateWorkerOptions(o));
  o.client.controller = "127.0.0.1:1";
  o.client.job_id = "j";
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "SPGATE_LAUNCH_CREDENTIAL: must be 16 to 128 characters, got 5"));
  o.client.launch_credential = "";  // world rank 0 makes one
  EXPECT_OK(ValidateWorkerOptions(o));
}

}  // namespace
}  // namespace spgate::runtime
