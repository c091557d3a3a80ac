// FaultInjectingDevice: a Device that fails or corrupts scripted operations, for tests.
//
// Not part of any store: a test hands one to the code under test, directly or through a
// FaultInjectingEnv (fault_injecting_env.h).
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/device.h"

namespace mtrains {

// Kinds of scripted faults.
enum class FaultKind { kReadError, kWriteError, kSyncError, kCorruptRead };

// The faults scripted for one device: after `after` successful operations of the fault's
// kind, the next `count` such operations fail with `sys_errno` (or, for kCorruptRead,
// succeed with one byte flipped in the first op's buffer). Shared by the device and
// whoever arms it. Thread-safe.
class FaultPlan {
 public:
  // `count` 0 disarms.
  void Arm(FaultKind kind, uint64_t after, uint64_t count, int sys_errno) EXCLUDES(mu_);
  void Disarm() EXCLUDES(mu_);
  bool armed() const EXCLUDES(mu_);
  // Returns true when the current operation of `kind` must fail (and consumes one fault),
  // setting `*sys_errno` to the errno it fails with.
  bool Trip(FaultKind kind, int* sys_errno) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  bool armed_ GUARDED_BY(mu_) = false;
  FaultKind kind_ GUARDED_BY(mu_) = FaultKind::kReadError;
  uint64_t skip_ GUARDED_BY(mu_) = 0, remaining_ GUARDED_BY(mu_) = 0;
  int errno_ GUARDED_BY(mu_) = EIO;
};

// Wraps a device and applies its FaultPlan; with no fault armed it only forwards.
// Thread-safe.
class FaultInjectingDevice final : public Device {
 public:
  explicit FaultInjectingDevice(std::unique_ptr<Device> inner,
                                std::shared_ptr<FaultPlan> plan = std::make_shared<FaultPlan>());
  void Arm(FaultKind kind, uint64_t after, uint64_t count, int sys_errno) {
    plan_->Arm(kind, after, count, sys_errno);
  }
  void Disarm() { plan_->Disarm(); }
  std::string Describe() const override { return inner_->Describe(); }
  Status DataExtents(uint64_t begin, uint64_t end,
                     std::vector<std::pair<uint64_t, uint64_t>>* out) const override {
    return inner_->DataExtents(begin, end, out);
  }
  // The wrapped device's: it times the real I/O.
  const LatencyHistogram& read_latency() const override { return inner_->read_latency(); }
  const LatencyHistogram& write_latency() const override { return inner_->write_latency(); }

 protected:
  Status ReadImpl(IoOp* ops, size_t n) override;
  Status WriteImpl(const IoOp* ops, size_t n) override;
  Status SyncImpl() override;
  Status ReadStreamImpl(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                        const ReadCallback& on_done) override;

 private:
  const std::unique_ptr<Device> inner_;
  const std::shared_ptr<FaultPlan> plan_;
};

}  // namespace mtrains
