#include "storage/device.h"

#include <algorithm>
#include <cstring>

#include "common/aligned_buffer.h"

namespace mtrains {

Device::Device(uint64_t size, uint32_t alignment) : size_(size), alignment_(alignment) {}

Status Device::ValidateExtent(uint64_t offset, uint64_t len, const char* what) const {
  if (offset % alignment_ != 0 || len % alignment_ != 0) {
    return Status::InvalidArgument(std::string(what) + " at offset " + std::to_string(offset) +
                                   " of " + std::to_string(len) + " bytes is not aligned to " +
                                   std::to_string(alignment_));
  }
  if (offset + len > size_ || offset + len < offset) {
    return Status::InvalidArgument(std::string(what) + " at offset " + std::to_string(offset) +
                                   " of " + std::to_string(len) +
                                   " bytes is past the device end " + std::to_string(size_));
  }
  return Status::Ok();
}

Status Device::Validate(const IoOp* ops, size_t n, const char* what) const {
  for (size_t i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(ops[i].buf) % alignment_ != 0)
      return Status::InvalidArgument(std::string(what) + " buffer is not aligned to " +
                                     std::to_string(alignment_));
    MTRAINS_RETURN_IF_ERROR(ValidateExtent(ops[i].offset, ops[i].len, what));
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

Status Device::ReadStream(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                          const ReadCallback& on_done) {
  for (size_t i = 0; i < n; ++i) MTRAINS_RETURN_IF_ERROR(ValidateExtent(offsets[i], len, "read"));
  Status st = ReadStreamImpl(offsets, n, len, std::max<uint32_t>(window, 1), on_done);
  if (st.ok()) {
    reads_.fetch_add(n, std::memory_order_relaxed);
    bytes_read_.fetch_add(uint64_t(n) * len, std::memory_order_relaxed);
  }
  return st;
}

Status Device::ReadStreamImpl(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                              const ReadCallback& on_done) {
  AlignedBuffer buf(size_t(std::min<size_t>(window, n)) * len, alignment_);
  std::vector<IoOp> ops;
  for (size_t start = 0; start < n; start += window) {
    const size_t k = std::min<size_t>(window, n - start);
    ops.clear();
    for (size_t i = 0; i < k; ++i) ops.push_back({offsets[start + i], buf.data() + i * len, len});
    MTRAINS_RETURN_IF_ERROR(ReadImpl(ops.data(), k));
    for (size_t i = 0; i < k; ++i) MTRAINS_RETURN_IF_ERROR(on_done(start + i, buf.data() + i * len));
  }
  return Status::Ok();
}

Status Device::Sync() {
  Status st = SyncImpl();
  if (st.ok()) syncs_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

Status Device::DataExtents(uint64_t begin, uint64_t end,
                           std::vector<std::pair<uint64_t, uint64_t>>* out) const {
  out->clear();
  if (begin < end) out->emplace_back(begin, end);
  return Status::Ok();
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
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = NowNanos();
    std::memcpy(ops[i].buf, data_.data() + ops[i].offset, ops[i].len);
    RecordReadLatency(NowNanos() - t0);
  }
  return Status::Ok();
}

Status MemoryDevice::WriteImpl(const IoOp* ops, size_t n) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = NowNanos();
    std::memcpy(data_.data() + ops[i].offset, ops[i].buf, ops[i].len);
    RecordWriteLatency(NowNanos() - t0);
  }
  return Status::Ok();
}

}  // namespace mtrains
