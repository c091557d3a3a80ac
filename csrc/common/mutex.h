// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with clang
// thread-safety annotations (common/thread_annotations.h), so that `-Wthread-safety` checks
// every GUARDED_BY member and REQUIRES function against the locks actually taken.
#pragma once

#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace mtrains {

// A non-recursive mutex the analysis knows about.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its lifetime.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with one Mutex. Wait is called with the mutex held and returns
// with it held (released while blocked, as std::condition_variable::wait); the caller
// loops on its condition, which the analysis then checks like any access under the lock.
class CondVar {
 public:
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // the caller still holds mu
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace mtrains
