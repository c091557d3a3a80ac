#include "storage/device.h"

#include <cstring>

namespace mtrains {

Device::Device(uint64_t size, uint32_t alignment) : size_(size), alignment_(alignment) {}

Status Device::Validate(const IoOp* ops, size_t n, const char* what) const {
  for (size_t i = 0; i < n; ++i) {
    const IoOp& op = ops[i];
    if (op.offset % alignment_ != 0 || op.len % alignment_ != 0 ||
        reinterpret_cast<uintptr_t>(op.buf) % alignment_ != 0) {
      return Status::InvalidArgument(std::string(what) + " at offset " +
                                     std::to_string(op.offset) + " of " +
                                     std::to_string(op.len) + " bytes is not aligned to " +
                                     std::to_string(alignment_));
    }
    if (op.offset + op.len > size_ || op.offset + op.len < op.offset) {
      return Status::InvalidArgument(std::string(what) + " at offset " +
                                     std::to_string(op.offset) + " of " +
                                     std::to_string(op.len) + " bytes is past the device end " +
                                     std::to_string(size_));
    }
  }
  return Status::Ok();
}

Status Device::Read(IoOp* ops, size_t n) {
  MTRAINS_RETURN_IF_ERROR(Validate(ops, n, "read"));
  Status st = ReadImpl(ops, n);
  if (st.ok()) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += ops[i].len;
    reads_.fetch_add(n, std::memory_order_relaxed);
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  }
  return st;
}

Status Device::Write(const IoOp* ops, size_t n) {
  MTRAINS_RETURN_IF_ERROR(Validate(ops, n, "write"));
  Status st = WriteImpl(ops, n);
  if (st.ok()) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += ops[i].len;
    writes_.fetch_add(n, std::memory_order_relaxed);
    bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  }
  return st;
}

Status Device::Sync() {
  Status st = SyncImpl();
  if (st.ok()) syncs_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

DeviceCounters Device::counters() const {
  DeviceCounters c;
  c.reads = reads_.load(std::memory_order_relaxed);
  c.writes = writes_.load(std::memory_order_relaxed);
  c.syncs = syncs_.load(std::memory_order_relaxed);
  c.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  c.bytes_written = bytes_written_.load(std::memory_order_relaxed);
  return c;
}

MemoryDevice::MemoryDevice(uint64_t size, uint32_t alignment)
    : Device(size, alignment), data_(size, 0) {}

Status MemoryDevice::ReadImpl(IoOp* ops, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = NowNanos();
    std::memcpy(ops[i].buf, data_.data() + ops[i].offset, ops[i].len);
    RecordReadLatency(NowNanos() - t0);
  }
  return Status::Ok();
}

Status MemoryDevice::WriteImpl(const IoOp* ops, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = NowNanos();
    std::memcpy(data_.data() + ops[i].offset, ops[i].buf, ops[i].len);
    RecordWriteLatency(NowNanos() - t0);
  }
  return Status::Ok();
}

FaultInjectingDevice::FaultInjectingDevice(std::unique_ptr<Device> inner)
    : Device(inner->size(), inner->alignment()), inner_(std::move(inner)) {}

void FaultInjectingDevice::Arm(FaultKind kind, uint64_t after, uint64_t count, int sys_errno) {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = count > 0;
  kind_ = kind;
  skip_ = after;
  remaining_ = count;
  errno_ = sys_errno;
}

void FaultInjectingDevice::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

bool FaultInjectingDevice::Trip(FaultKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_ || kind_ != kind) return false;
  if (skip_ > 0) {
    --skip_;
    return false;
  }
  if (--remaining_ == 0) armed_ = false;
  return true;
}

Status FaultInjectingDevice::ReadImpl(IoOp* ops, size_t n) {
  if (Trip(FaultKind::kReadError)) {
    return Status::IoError(errno_, "injected read error at offset " + std::to_string(ops[0].offset));
  }
  MTRAINS_RETURN_IF_ERROR(inner_->Read(ops, n));
  if (n > 0 && Trip(FaultKind::kCorruptRead)) {
    static_cast<uint8_t*>(ops[0].buf)[ops[0].len / 2] ^= 0x40;
  }
  return Status::Ok();
}

Status FaultInjectingDevice::WriteImpl(const IoOp* ops, size_t n) {
  if (Trip(FaultKind::kWriteError)) {
    return Status::IoError(errno_,
                           "injected write error at offset " + std::to_string(ops[0].offset));
  }
  return inner_->Write(ops, n);
}

Status FaultInjectingDevice::SyncImpl() {
  if (Trip(FaultKind::kSyncError)) return Status::IoError(errno_, "injected sync error");
  return inner_->Sync();
}

}  // namespace mtrains
