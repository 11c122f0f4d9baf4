// ProcessGrid and the MPI backend: blocking MPI collectives on host buffers, each timed
// from call to return (which includes waiting for the slowest peer).
#include "worker/runtime/mpi_communicator.h"

#include <chrono>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace spgate::runtime {

absl::Status MpiStatus(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(
      absl::StrCat(file, ":", line, ": ", call, ": ", std::string(text, len)));
}

absl::StatusOr<std::unique_ptr<ProcessGrid>> ProcessGrid::Create(MPI_Comm world, int tp, int pp) {
  std::unique_ptr<ProcessGrid> g(new ProcessGrid());
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(world, &g->world_rank_));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_size(world, &g->world_size_));
  if (tp < 1 || g->world_size_ % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tp=", tp, " must be >= 1 and divide the ",
                                                   g->world_size_, " ranks of the job"));
  }
  if (pp < 1 || g->world_size_ % (tp * pp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--pp=", pp, " must be >= 1 and --tp x --pp = ",
                                                   tp * pp, " divide the ", g->world_size_,
                                                   " ranks of the job"));
  }
  g->world_ = world;
  g->tp_ = tp;
  g->pp_ = pp;
  SPGATE_MPI_RETURN_IF_ERROR(
      MPI_Comm_split(world, g->group(), g->tp_rank(), &g->tp_comm_));
  // The replicas of one (stage, TP rank) reduce their gradients together.
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_split(world, g->stage() * tp + g->tp_rank(),
                                            g->dp_rank(), &g->dp_comm_));
  SPGATE_MPI_RETURN_IF_ERROR(
      MPI_Comm_split(world, g->dp_rank(), g->world_rank_, &g->replica_comm_));
  MPI_Comm node = MPI_COMM_NULL;
  SPGATE_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, g->world_rank_, MPI_INFO_NULL, &node));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(node, &g->local_rank_));
  MPI_Comm_free(&node);
  for (MPI_Comm c : {g->tp_comm_, g->dp_comm_, g->replica_comm_}) {
    SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  }
  return g;
}

ProcessGrid::~ProcessGrid() {
  if (tp_comm_ != MPI_COMM_NULL) MPI_Comm_free(&tp_comm_);
  if (dp_comm_ != MPI_COMM_NULL) MPI_Comm_free(&dp_comm_);
  if (replica_comm_ != MPI_COMM_NULL) MPI_Comm_free(&replica_comm_);
}

namespace {

absl::Status CheckCount(const char* op, int64_t count) {
  if (count >= 0 && count <= std::numeric_limits<int>::max()) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(op, ": count ", count, " exceeds MPI's int counts"));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size) {}
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace space() const override { return MemorySpace::kHost; }
  std::string name() const override { return "mpi"; }

  absl::Status AllGather(const float* send, float* recv, int64_t count,
                         CollectivePurpose purpose) override {
    if (absl::Status s = CheckCount("AllGather", count * size_); !s.ok()) return s;
    const bool in_place = send == recv + rank_ * count;
    return Timed(CollectiveOp::kAllGather, purpose, count * size_, [&] {
      return MPI_Allgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : static_cast<int>(count),
                           MPI_FLOAT, recv, static_cast<int>(count), MPI_FLOAT, comm_);
    }, "MPI_Allgather");
  }
  absl::Status ReduceScatter(const float* send, float* recv, int64_t count,
                             CollectivePurpose purpose) override {
    if (absl::Status s = CheckCount("ReduceScatter", count * size_); !s.ok()) return s;
    return Timed(CollectiveOp::kReduceScatter, purpose, count * size_, [&] {
      return MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                      comm_);
    }, "MPI_Reduce_scatter_block");
  }
  absl::Status AllReduce(float* data, int64_t count, CollectivePurpose purpose) override {
    if (absl::Status s = CheckCount("AllReduce", count); !s.ok()) return s;
    return Timed(CollectiveOp::kAllReduce, purpose, count, [&] {
      return MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                           comm_);
    }, "MPI_Allreduce");
  }
  absl::Status BroadcastHost(void* data, size_t bytes, int root) override {
    if (absl::Status s = CheckCount("BroadcastHost", static_cast<int64_t>(bytes)); !s.ok()) return s;
    return Timed(CollectiveOp::kBroadcast, CollectivePurpose::kControl, 0, [&] {
      return MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_);
    }, "MPI_Bcast");
  }
  absl::Status AllReduceMaxHost(double* data, int count) override {
    return Timed(CollectiveOp::kAllReduce, CollectivePurpose::kControl, 0, [&] {
      return MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_MAX, comm_);
    }, "MPI_Allreduce(MAX)");
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  template <typename F>
  absl::Status Timed(CollectiveOp op, CollectivePurpose purpose, int64_t floats, F&& f,
                     const char* call) {
    const auto start = std::chrono::steady_clock::now();
    const int rc = f();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    if (rc != MPI_SUCCESS) return MpiStatus(rc, call, __FILE__, __LINE__);
    stats_.Add(op, purpose, d.count(), static_cast<uint64_t>(floats) * sizeof(float));
    return absl::OkStatus();
  }

  MPI_Comm comm_;
  int rank_, size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &dup));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(dup, &rank));
  SPGATE_MPI_RETURN_IF_ERROR(MPI_Comm_size(dup, &size));
  return std::unique_ptr<Communicator>(new MpiCommunicator(dup, rank, size));
}

}  // namespace spgate::runtime
