// RecordingDevice and CrashImages: power-loss testing of code that runs on Devices.
//
// A power cut is harsher than a killed process: the page cache and the device's write
// cache go with it, so writes not yet made durable by a sync may be lost, land in any
// order, or land torn (a sector of a write new, the next one still old). After the
// fault-injection environments of LevelDB/RocksDB and the record-and-replay of
// CrashMonkey/ALICE:
//   RecordingDevice  a memory device that appends every write (offset and bytes, one entry
//                    per IoOp) and every sync to a WriteRecord shared with the workload's
//                    other devices, so the record holds one global order of the I/O; the
//                    workload adds marks (e.g. "flush N returned") into the same order.
//   CrashImages      replays a record to build what each device may hold after a power cut
//                    just before any event of it: every write of a device before that
//                    device's last sync is durable; each write since (in flight) is lost,
//                    applied, or torn at sector granularity, in any order.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/device.h"

namespace mtrains {

struct RecordedEvent {
  enum class Kind : uint8_t { kWrite, kSync, kMark };
  Kind kind = Kind::kMark;
  uint32_t device = 0;         // kWrite, kSync: the device's id in the record
  uint64_t offset = 0;         // kWrite: byte offset on the device
  uint64_t mark = 0;           // kMark: the workload's value
  std::vector<uint8_t> bytes;  // kWrite: what was written
};

// The I/O of a workload's devices in one order. Thread-safe.
class WriteRecord {
 public:
  // Appends a workload event (e.g. the generation of a flush that returned).
  void Mark(uint64_t value) EXCLUDES(mu_);
  // A copy of the events so far, in order.
  std::vector<RecordedEvent> Events() const EXCLUDES(mu_);
  // Bytes of each registered device, by id.
  std::vector<uint64_t> DeviceSizes() const EXCLUDES(mu_);

 private:
  friend class RecordingDevice;
  uint32_t AddDevice(uint64_t size) EXCLUDES(mu_);
  void Append(RecordedEvent e) EXCLUDES(mu_);

  mutable Mutex mu_;
  std::vector<RecordedEvent> events_ GUARDED_BY(mu_);
  std::vector<uint64_t> sizes_ GUARDED_BY(mu_);
};

// A heap-backed device (reads as zeros until written) whose writes and syncs are also
// appended to a WriteRecord. Thread-safe.
class RecordingDevice final : public Device {
 public:
  // Registers with `record`, which must outlive the device.
  RecordingDevice(WriteRecord* record, uint64_t size, uint32_t alignment);
  uint32_t id() const { return id_; }
  std::string Describe() const override { return "recording memory"; }

 protected:
  Status ReadImpl(IoOp* ops, size_t n) override;
  Status WriteImpl(const IoOp* ops, size_t n) override;
  Status SyncImpl() override;

 private:
  WriteRecord* const record_;
  const uint32_t id_;
  MemoryDevice memory_;
};

// What happens to the writes in flight at the crash point.
enum class CrashMode {
  kSyncedOnly,  // all lost: the state as of each device's last sync
  kAllInOrder,  // all applied in issue order (what a killed process leaves)
  kRandom,      // a random order; each write lost, applied, or torn (each sector old or new)
};

// Builds crash images from a record. Not thread-safe. Crash points only move forward (AdvanceTo), so each
// device's durable state is kept and extended at its syncs rather than replayed per image.
class CrashImages {
 public:
  CrashImages(std::vector<RecordedEvent> events, std::vector<uint64_t> device_sizes,
              uint32_t sector_bytes = 512);

  const std::vector<RecordedEvent>& events() const { return events_; }
  // The crash point: the power goes just before event `point()` (events before it happened).
  size_t point() const { return point_; }
  // Moves the crash point to `point` (<= events().size(), not below the current one).
  void AdvanceTo(size_t point);
  // Writes of `device` issued since its last sync before the crash point.
  size_t InFlight(uint32_t device) const { return pending_[device].size(); }
  // Writes over the whole of `into` (a device of `device`'s size) the bytes `device` holds
  // after a power cut at the crash point under `mode` (`rng` draws kRandom's choices).
  // Returns a short description ("5 in flight: 2 lost, 1 torn, order 3 0 4 1 2").
  // InvalidArgument when `into` has another size; `into`'s write errors are returned.
  Status Build(uint32_t device, CrashMode mode, std::mt19937_64* rng, Device* into, std::string* how);

 private:
  // Copies sectors of write `e` into `image`: all of them, or each with probability 1/2.
  void Apply(const RecordedEvent& e, bool torn, std::mt19937_64* rng, uint8_t* image) const;

  const std::vector<RecordedEvent> events_;
  const std::vector<uint64_t> sizes_;
  const uint32_t sector_bytes_;
  size_t point_ = 0;
  std::vector<std::vector<uint8_t>> durable_;  // per device: writes before its last sync
  std::vector<std::vector<size_t>> pending_;   // per device: events in flight, in issue order
  AlignedBuffer scratch_;                      // the image being built
};

}  // namespace mtrains
