// What the group session's telemetry costs the training thread, collective included
// (docs/design.md §2), on MPI ranks of one TP group. Per step, timed on every rank with
// steady_clock and reported for the leader (rank 0) and the slowest rank:
//   baseline  — MPI_Allreduce(MAX) of one double: what spgate-worker ran before, to hand
//               the leader the group's reduce-scatter wait share;
//   group     — GroupDecider::ReportTelemetry with MPI_Allreduce(MAX) of the 16-double
//               TelemetryWire and the ranks' busy times (one double a rank): pack, reduce,
//               and on the leader decode the group record and its straggler delay, feed
//               its fallback and queue the record (a local-only client: no daemon, the
//               queueing is the same code).
// The variants alternate in rounds so machine noise hits both; ratios are to baseline.
//
//   mpirun -np 8 --oversubscribe build/bench/group_reduce_bench --steps=2000 --rounds=5
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"

ABSL_FLAG(int, steps, 2000, "Measured steps per variant and round");
ABSL_FLAG(int, rounds, 5, "Alternating rounds");
ABSL_FLAG(std::string, out, "", "Rank 0 writes the figures as JSON here");

namespace {

using Clock = std::chrono::steady_clock;
using spgate::client::GroupDecider;
using spgate::client::StepTelemetryInput;
using spgate::client::TelemetryWire;

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int rounds = absl::GetFlag(FLAGS_rounds);

  std::unique_ptr<spgate::client::GateClient> client;
  if (rank == 0) {
    spgate::client::GateClientOptions o;
    o.job_id = "group-reduce-bench";
    o.group_size = size;
    auto c = spgate::client::GateClient::Create(o);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    client = *std::move(c);
  }
  auto decider = GroupDecider::Create(
      client.get(), rank,
      [](std::span<uint8_t> b, int root) {
        return MPI_Bcast(b.data(), static_cast<int>(b.size()), MPI_BYTE, root, MPI_COMM_WORLD) ==
                       MPI_SUCCESS
                   ? absl::OkStatus()
                   : absl::InternalError("MPI_Bcast");
      },
      [](std::span<double> w, int) {
        return MPI_Allreduce(MPI_IN_PLACE, w.data(), static_cast<int>(w.size()), MPI_DOUBLE,
                             MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS
                   ? absl::OkStatus()
                   : absl::InternalError("MPI_Allreduce");
      });
  if (!decider.ok()) {
    std::fprintf(stderr, "%s\n", decider.status().ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  std::vector<double> base_ns, group_ns;
  int64_t step = 0;
  for (int round = 0; round < rounds; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < steps; ++i) {
      double share = 0.01 * (rank + 1);
      const auto t0 = Clock::now();
      MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const auto t1 = Clock::now();
      if (rank == 0) {
        const absl::Status s =
            client->ObserveGroupRsWaitShare(step, spgate::Mode::kSequenceParallel, share);
        if (!s.ok()) {
          std::fprintf(stderr, "wait share: %s\n", s.ToString().c_str());
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      base_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < steps; ++i, ++step) {
      const StepTelemetryInput t{.step = step, .step_time_s = 0.5 + 0.001 * rank,
                                 .rs_wait_s = 0.01 * (rank + 1), .all_gather_s = 0.002,
                                 .effective_tokens = 65536,
                                 .peak_memory_bytes = (40ull << 30) + static_cast<uint64_t>(rank)};
      const auto t0 = Clock::now();
      const absl::Status s = (*decider)->ReportTelemetry(t);
      const auto t1 = Clock::now();
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d step %lld: %s\n", rank, static_cast<long long>(step),
                     s.ToString().c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      group_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
  }
  // Every rank's medians to rank 0: the leader's and the slowest rank's.
  double mine[4] = {Quantile(base_ns, 0.5), Quantile(group_ns, 0.5), Quantile(base_ns, 0.99),
                    Quantile(group_ns, 0.99)};
  std::vector<double> all(static_cast<size_t>(4 * size));
  MPI_Gather(mine, 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double worst_base = 0, worst_group = 0;
    for (int r = 0; r < size; ++r) {
      worst_base = std::max(worst_base, all[4 * r]);
      worst_group = std::max(worst_group, all[4 * r + 1]);
    }
    const int64_t reported = client->stats().telemetry_reported;
    std::printf("%d ranks, %d steps x %d rounds per variant; the leader queued %lld group records\n\n",
                size, steps, rounds, static_cast<long long>(reported));
    std::printf("| variant | leader median ns | leader p99 ns | slowest rank's median ns | x baseline (leader median) |\n");
    std::printf("|---|---:|---:|---:|---:|\n");
    std::printf("| baseline: allreduce of 1 double | %.0f | %.0f | %.0f | 1.00 |\n", mine[0], mine[2],
                worst_base);
    std::printf("| group: ReportTelemetry, allreduce of %d | %.0f | %.0f | %.0f | %.2f |\n",
                TelemetryWire::kSlots + size, mine[1], mine[3], worst_group, mine[1] / mine[0]);
    if (reported != static_cast<int64_t>(steps) * rounds) {
      std::fprintf(stderr, "expected %lld group records\n",
                   static_cast<long long>(steps) * rounds);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const std::string out = absl::GetFlag(FLAGS_out);
    if (!out.empty()) {
      std::ofstream(out) << absl::StrFormat(
          "{\"benchmark\": \"group_reduce\", \"baseline\": \"allreduce_1_double\", \"ranks\": %d,\n"
          " \"steps\": %d, \"rounds\": %d,\n"
          " \"baseline_leader_median_ns\": %.0f, \"baseline_leader_p99_ns\": %.0f,\n"
          " \"group_leader_median_ns\": %.0f, \"group_leader_p99_ns\": %.0f,\n"
          " \"baseline_slowest_rank_median_ns\": %.0f, \"group_slowest_rank_median_ns\": %.0f,\n"
          " \"ratio_to_baseline\": %.3f}\n",
          size, steps, rounds, mine[0], mine[2], mine[1], mine[3], worst_base, worst_group,
          mine[1] / mine[0]);
    }
  }
  decider->reset();
  client.reset();
  MPI_Finalize();
  return 0;
}
