// A mutex and condition variable ThreadSanitizer can see. Debian's Abseil is not built with TSan, so
// absl::Mutex's synchronisation happens inside an uninstrumented library and every
// access it guards would look racy. Under TSan this swaps in std::shared_mutex
// (pthread_rwlock, which TSan intercepts) and std::condition_variable_any; otherwise they
// are absl::Mutex and absl::CondVar themselves. Both carry Abseil's thread-safety
// annotations, so -Wthread-safety checks the same code.
//
// Usage:
//   spgate::Mutex mu_;
//   int x_ ABSL_GUARDED_BY(mu_);
//   { spgate::MutexLock lock(&mu_); ++x_; }
//   { spgate::ReaderMutexLock lock(&mu_); return x_; }
#ifndef SPGATE_COMMON_MUTEX_H_
#define SPGATE_COMMON_MUTEX_H_

#include <condition_variable>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace spgate {

#if defined(__SANITIZE_THREAD__)
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  explicit Mutex(absl::ConstInitType) {}
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  std::shared_mutex& native() { return mu_; }

 private:
  std::shared_mutex mu_;
};

class CondVar {
 public:
  // Returns true on timeout, like absl::CondVar.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    return cv_.wait_until(mu->native(), absl::ToChronoTime(deadline)) == std::cv_status::timeout;
  }
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    return WaitWithDeadline(mu, absl::Now() + timeout);
  }
  void Wait(Mutex* mu) { cv_.wait(mu->native()); }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};
#else
using Mutex = absl::Mutex;
using CondVar = absl::CondVar;
#endif

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Turns off absl::Mutex's deadlock detection for the whole process. Abseil built without
// NDEBUG (Debian's is) leaves it on, and then every Lock records lock-order edges in one
// process-wide graph under a global spinlock — gRPC's locks included. spgate's binaries
// call this first thing in main (it was 4-6 % of spgated's and spgate-sim's CPU at 1,024
// ranks); tests keep detection on. A trainer embedding the client may call it too.
inline void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace spgate

#endif  // SPGATE_COMMON_MUTEX_H_
