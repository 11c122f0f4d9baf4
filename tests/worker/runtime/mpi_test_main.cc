// gtest main for tests run under mpirun: MPI_Init before the tests, MPI_Finalize after.
// Every rank runs every test (the tests are collectives); only rank 0 keeps gtest's
// default printer, so the log reads like a single-process run while failures on any
// rank are still printed (with the rank) and fail the run through the exit status.
#include <mpi.h>

#include <iostream>
#include <string_view>

#include "gtest/gtest.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":"
              << r.line_number() << ": " << r.summary() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  // Listing the cases (ctest's per-case discovery) needs no MPI; starting MPI there would
  // need mpirun's environment (e.g. OpenMPI's consent to run as root) for no reason.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--gtest_list_tests") {
      ::testing::InitGoogleTest(&argc, argv);
      return RUN_ALL_TESTS();
    }
  }
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  int any = rc != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
