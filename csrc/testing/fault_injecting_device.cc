#include "testing/fault_injecting_device.h"

namespace mtrains {

void FaultPlan::Arm(FaultKind kind, uint64_t after, uint64_t count, int sys_errno) {
  MutexLock lock(&mu_);
  armed_ = count > 0;
  kind_ = kind;
  skip_ = after;
  remaining_ = count;
  errno_ = sys_errno;
}

void FaultPlan::Disarm() {
  MutexLock lock(&mu_);
  armed_ = false;
}

bool FaultPlan::armed() const {
  MutexLock lock(&mu_);
  return armed_;
}

bool FaultPlan::Trip(FaultKind kind, int* sys_errno) {
  MutexLock lock(&mu_);
  if (!armed_ || kind_ != kind) return false;
  if (skip_ > 0) {
    --skip_;
    return false;
  }
  if (--remaining_ == 0) armed_ = false;
  *sys_errno = errno_;
  return true;
}

FaultInjectingDevice::FaultInjectingDevice(std::unique_ptr<Device> inner, std::shared_ptr<FaultPlan> plan)
    : Device(inner->size(), inner->alignment()), inner_(std::move(inner)), plan_(std::move(plan)) {}

Status FaultInjectingDevice::ReadImpl(IoOp* ops, size_t n) {
  int err = 0;
  if (plan_->Trip(FaultKind::kReadError, &err)) {
    return Status::IoError(err, "injected read error at offset " + std::to_string(ops[0].offset));
  }
  MTRAINS_RETURN_IF_ERROR(inner_->Read(ops, n));
  if (n > 0 && plan_->Trip(FaultKind::kCorruptRead, &err)) {
    static_cast<uint8_t*>(ops[0].buf)[ops[0].len / 2] ^= 0x40;
  }
  return Status::Ok();
}

Status FaultInjectingDevice::ReadStreamImpl(const uint64_t* offsets, size_t n, uint32_t len,
                                            uint32_t window, const ReadCallback& on_done) {
  // Scripted faults apply through ReadImpl, one window at a time.
  if (plan_->armed()) return Device::ReadStreamImpl(offsets, n, len, window, on_done);
  return inner_->ReadStream(offsets, n, len, window, on_done);
}

Status FaultInjectingDevice::WriteImpl(const IoOp* ops, size_t n) {
  int err = 0;
  if (plan_->Trip(FaultKind::kWriteError, &err)) {
    return Status::IoError(err, "injected write error at offset " + std::to_string(ops[0].offset));
  }
  return inner_->Write(ops, n);
}

Status FaultInjectingDevice::SyncImpl() {
  int err = 0;
  if (plan_->Trip(FaultKind::kSyncError, &err)) return Status::IoError(err, "injected sync error");
  return inner_->Sync();
}

}  // namespace mtrains
