// ClientRuntime: a timer heap and one thread; see client_runtime.h.
#include "worker/client/client_runtime.h"

#include <algorithm>
#include <queue>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace spgate::client::internal {

struct ClientRuntime::State {
  struct Entry {
    absl::Time when;
    uint64_t seq;  // FIFO among equal times
    mutable Task task;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  spgate::Mutex mu;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue ABSL_GUARDED_BY(mu);
  std::vector<Task> deferred ABSL_GUARDED_BY(mu);
  absl::Time last_deferred ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool polling ABSL_GUARDED_BY(mu) = false;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;
  bool stop ABSL_GUARDED_BY(mu) = false;
  // While the loop sleeps, until when: only a task due earlier needs the (syscall-priced)
  // wake-up.
  bool sleeping ABSL_GUARDED_BY(mu) = false;
  absl::Time sleeping_until ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  spgate::CondVar cv;
};

std::shared_ptr<ClientRuntime> ClientRuntime::Get() {
  static spgate::Mutex mu(absl::kConstInit);
  static auto* current = new std::weak_ptr<ClientRuntime>();
  spgate::MutexLock lock(&mu);
  std::shared_ptr<ClientRuntime> rt = current->lock();
  if (rt == nullptr) {
    rt = std::make_shared<ClientRuntime>();
    *current = rt;
  }
  return rt;
}

ClientRuntime::ClientRuntime() : state_(std::make_shared<State>()) {
  thread_ = std::thread([s = state_] { Loop(s); });
}

ClientRuntime::~ClientRuntime() {
  {
    spgate::MutexLock lock(&state_->mu);
    state_->stop = true;
    state_->cv.Signal();
  }
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void ClientRuntime::RunAt(absl::Time when, Task task) {
  State& s = *state_;
  spgate::MutexLock lock(&s.mu);
  s.queue.push(State::Entry{when, s.next_seq++, std::move(task)});
  if (s.sleeping && when < s.sleeping_until) {
    s.sleeping = false;
    s.cv.Signal();
  }
}

void ClientRuntime::Defer(Task task) {
  State& s = *state_;
  spgate::MutexLock lock(&s.mu);
  s.deferred.push_back(std::move(task));
  if (s.sleeping && !s.polling) {
    s.sleeping = false;
    s.cv.Signal();
  }
}

void ClientRuntime::Loop(std::shared_ptr<State> state) {
  State& s = *state;
  std::vector<Task> batch;
  s.mu.Lock();
  while (!s.stop) {
    const absl::Time now = absl::Now();
    if (!s.deferred.empty()) {
      batch.swap(s.deferred);
      s.last_deferred = now;
      s.mu.Unlock();
      for (Task& task : batch) std::move(task)();
      batch.clear();  // captures are released outside the lock
      s.mu.Lock();
      continue;
    }
    if (!s.queue.empty() && s.queue.top().when <= now) {
      Task task = std::move(s.queue.top().task);
      s.queue.pop();
      s.mu.Unlock();
      std::move(task)();
      task = nullptr;  // captures are released outside the lock
      s.mu.Lock();
      continue;
    }
    s.sleeping_until = s.queue.empty() ? absl::InfiniteFuture() : s.queue.top().when;
    s.polling = now - s.last_deferred < kPollLinger;
    if (s.polling) s.sleeping_until = std::min(s.sleeping_until, now + kPollInterval);
    s.sleeping = true;
    s.cv.WaitWithDeadline(&s.mu, s.sleeping_until);
    s.sleeping = false;
  }
  // Drop pending tasks outside the lock: their captures may own clients.
  auto pending = std::move(s.queue);
  s.queue = {};
  std::vector<Task> deferred = std::move(s.deferred);
  s.mu.Unlock();
  while (!pending.empty()) pending.pop();
  deferred.clear();
}

}  // namespace spgate::client::internal
