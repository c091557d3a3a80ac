// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with clang
// thread-safety annotations (common/thread_annotations.h), so that `-Wthread-safety` checks
// every GUARDED_BY member and REQUIRES function against the locks actually taken.
// FairMutex, FairMutexLock: the same for a first-come, first-served mutex.
#pragma once

#include <condition_variable>
#include <cstdint>
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

// A mutex granted in the order it was asked for (a ticket lock). std::mutex is not fair: a
// thread that unlocks and locks again in a loop usually wins the race against a thread
// already waiting, so callers in a tight loop can starve another for seconds or minutes.
// Here a waiter is granted the mutex after at most one turn of each thread that asked
// before it. Costs one more (uncontended) std::mutex round trip per Lock and Unlock.
class CAPABILITY("mutex") FairMutex {
 public:
  FairMutex() = default;
  FairMutex(const FairMutex&) = delete;
  FairMutex& operator=(const FairMutex&) = delete;

  // Takes the next ticket and waits until it is served. Returns the ticket: the number of
  // Lock calls that asked before this one (tests check the order of grants with it).
  uint64_t Lock() ACQUIRE() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t ticket = next_ticket_++;
    if (serving_ != ticket) {
      ++waiters_;
      turn_.wait(lock, [&] { return serving_ == ticket; });
      --waiters_;
    }
    return ticket;
  }
  // The number of Lock calls so far (granted or waiting): tests measure how many grants
  // go to others between a Lock call and its own grant.
  uint64_t TicketsIssued() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_ticket_;
  }
  void Unlock() RELEASE() {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++serving_;
      wake = waiters_ > 0;
    }
    // Every waiter checks its ticket; only the next one proceeds.
    if (wake) turn_.notify_all();
  }

 private:
  std::mutex mu_;  // guards the counters below (held only inside Lock and Unlock)
  std::condition_variable turn_;
  uint64_t next_ticket_ = 0, serving_ = 0;
  uint32_t waiters_ = 0;
};

// Holds `mu` for its lifetime.
class SCOPED_CAPABILITY FairMutexLock {
 public:
  explicit FairMutexLock(FairMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~FairMutexLock() RELEASE() { mu_->Unlock(); }
  FairMutexLock(const FairMutexLock&) = delete;
  FairMutexLock& operator=(const FairMutexLock&) = delete;

 private:
  FairMutex* const mu_;
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
