// CollectiveStats bookkeeping and the one-rank communicator.
#include "worker/runtime/communicator.h"

#include <chrono>
#include <cstring>

namespace spgate::runtime {

std::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kBroadcast: return "broadcast";
  }
  return "unknown";
}

double CollectiveStats::Seconds(CollectiveOp op) const {
  double s = 0;
  for (double v : seconds[static_cast<int>(op)]) s += v;
  return s;
}

double CollectiveStats::Seconds(CollectivePurpose purpose) const {
  double s = 0;
  for (const auto& row : seconds) s += row[static_cast<int>(purpose)];
  return s;
}

void CollectiveStats::Add(CollectiveOp op, CollectivePurpose purpose, double s, uint64_t b) {
  const int o = static_cast<int>(op), p = static_cast<int>(purpose);
  seconds[o][p] += s;
  calls[o][p] += 1;
  bytes[o][p] += b;
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Device* device) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  MemorySpace space() const override { return device_->space(); }
  std::string name() const override { return "local"; }

  absl::Status AllGather(const float* send, float* recv, int64_t count,
                         CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kAllGather, purpose, count,
                 [&] { return device_->Copy(recv, send, count); });
  }
  absl::Status ReduceScatter(const float* send, float* recv, int64_t count,
                             CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kReduceScatter, purpose, count,
                 [&] { return device_->Copy(recv, send, count); });
  }
  absl::Status AllReduce(float*, int64_t count, CollectivePurpose purpose) override {
    return Timed(CollectiveOp::kAllReduce, purpose, count, [] { return absl::OkStatus(); });
  }
  absl::Status BroadcastHost(void*, size_t, int root) override {
    if (root != 0) return absl::InvalidArgumentError("BroadcastHost: root out of range");
    return absl::OkStatus();
  }
  absl::Status AllReduceMaxHost(double*, int) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return device_->Synchronize(); }

 private:
  template <typename F>
  absl::Status Timed(CollectiveOp op, CollectivePurpose purpose, int64_t count, F&& f) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = f();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    stats_.Add(op, purpose, d.count(), static_cast<uint64_t>(count) * sizeof(float));
    return s;
  }
  Device* device_;
};

}  // namespace

std::unique_ptr<Communicator> CreateLocalCommunicator(Device* device) {
  return std::make_unique<LocalCommunicator>(device);
}

}  // namespace spgate::runtime
