// Device: the block device under a BlockStore (after CacheLib Navy's Device).
//
// The public Read/Write check alignment and bounds and count bytes, operations and
// per-operation latency; subclasses implement only the raw I/O. Implementations:
//   FileDevice (file_device.h)   direct-I/O files, io_uring or a pread/pwrite thread pool
//   MemoryDevice (below)         a heap buffer, for tests and sanitizer runs
// and, for tests only, those of csrc/testing/ (failing on command, recording every write).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/latency_histogram.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace mtrains {

// One contiguous transfer. `offset`, `len` and `buf` must be multiples of the device's
// alignment. Ownership of `buf` stays with the caller for the duration of the call.
struct IoOp {
  uint64_t offset = 0;
  void* buf = nullptr;
  uint32_t len = 0;
};

struct DeviceCounters {
  uint64_t reads = 0, writes = 0, syncs = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
};

class Device {
 public:
  Device(uint64_t size, uint32_t alignment);
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Reads all `ops` (they may run concurrently and complete in any order). On failure
  // returns the first error; the contents of all buffers are then unspecified.
  // Thread-safe: concurrent calls are allowed.
  Status Read(IoOp* ops, size_t n);
  // Writes all `ops`; same contract as Read. A failed write may have partially written.
  Status Write(const IoOp* ops, size_t n);
  // Makes completed writes durable (fdatasync).
  Status Sync();

  // Called as each streamed read completes with (extent index, its bytes); the bytes are
  // valid only during the call. A non-ok return stops the stream.
  using ReadCallback = std::function<Status(size_t, const uint8_t*)>;
  // Reads `n` extents of `len` bytes at `offsets`, keeping up to `window` in flight, and
  // hands each to `on_done` in the calling thread as it completes (in any order), so the
  // caller's CPU work overlaps the device's. Stops at the first failure.
  Status ReadStream(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                    const ReadCallback& on_done);

  // Extents [first, second) of [begin, end), ascending, that may hold data; the rest has
  // never been written and reads as zeros. Lets a reader skip the holes of a sparse file.
  // Default: the whole range.
  virtual Status DataExtents(uint64_t begin, uint64_t end,
                             std::vector<std::pair<uint64_t, uint64_t>>* out) const;

  uint64_t size() const { return size_; }
  uint32_t alignment() const { return alignment_; }
  // A short human-readable description ("io_uring qd=64 on /path", ...).
  virtual std::string Describe() const = 0;

  DeviceCounters counters() const;
  // Per-operation latencies of the device doing the I/O (a wrapper reports its inner one's).
  virtual const LatencyHistogram& read_latency() const { return read_latency_; }
  virtual const LatencyHistogram& write_latency() const { return write_latency_; }

 protected:
  // Raw I/O, called after validation. Implementations call RecordLatency per operation.
  virtual Status ReadImpl(IoOp* ops, size_t n) = 0;
  virtual Status WriteImpl(const IoOp* ops, size_t n) = 0;
  virtual Status SyncImpl() = 0;
  // Default: reads `window` extents at a time through ReadImpl.
  virtual Status ReadStreamImpl(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                                const ReadCallback& on_done);
  void RecordReadLatency(uint64_t nanos) { read_latency_.Record(nanos); }
  void RecordWriteLatency(uint64_t nanos) { write_latency_.Record(nanos); }

 private:
  Status Validate(const IoOp* ops, size_t n, const char* what) const;
  Status ValidateExtent(uint64_t offset, uint64_t len, const char* what) const;

  const uint64_t size_;
  const uint32_t alignment_;
  std::atomic<uint64_t> reads_{0}, writes_{0}, syncs_{0}, bytes_read_{0}, bytes_written_{0};
  LatencyHistogram read_latency_, write_latency_;
};

// A device backed by a heap buffer that reads as zeros until written. Thread-safe.
class MemoryDevice final : public Device {
 public:
  MemoryDevice(uint64_t size, uint32_t alignment);
  std::string Describe() const override { return "memory"; }

 protected:
  Status ReadImpl(IoOp* ops, size_t n) override;
  Status WriteImpl(const IoOp* ops, size_t n) override;
  Status SyncImpl() override { return Status::Ok(); }

 private:
  Mutex mu_;
  std::vector<uint8_t> data_ GUARDED_BY(mu_);
};

}  // namespace mtrains
