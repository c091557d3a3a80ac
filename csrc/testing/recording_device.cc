#include "testing/recording_device.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace mtrains {

void WriteRecord::Mark(uint64_t value) {
  RecordedEvent e;
  e.kind = RecordedEvent::Kind::kMark;
  e.mark = value;
  Append(std::move(e));
}

std::vector<RecordedEvent> WriteRecord::Events() const {
  MutexLock lock(&mu_);
  return events_;
}

std::vector<uint64_t> WriteRecord::DeviceSizes() const {
  MutexLock lock(&mu_);
  return sizes_;
}

uint32_t WriteRecord::AddDevice(uint64_t size) {
  MutexLock lock(&mu_);
  sizes_.push_back(size);
  return static_cast<uint32_t>(sizes_.size() - 1);
}

void WriteRecord::Append(RecordedEvent e) {
  MutexLock lock(&mu_);
  events_.push_back(std::move(e));
}

RecordingDevice::RecordingDevice(WriteRecord* record, uint64_t size, uint32_t alignment)
    : Device(size, alignment), record_(record), id_(record->AddDevice(size)), memory_(size, alignment) {}

Status RecordingDevice::ReadImpl(IoOp* ops, size_t n) { return memory_.Read(ops, n); }

Status RecordingDevice::WriteImpl(const IoOp* ops, size_t n) {
  MTRAINS_RETURN_IF_ERROR(memory_.Write(ops, n));
  // One event per op: the ops of one call may complete in any order.
  for (size_t i = 0; i < n; ++i) {
    RecordedEvent e;
    e.kind = RecordedEvent::Kind::kWrite;
    e.device = id_;
    e.offset = ops[i].offset;
    const uint8_t* p = static_cast<const uint8_t*>(ops[i].buf);
    e.bytes.assign(p, p + ops[i].len);
    record_->Append(std::move(e));
  }
  return Status::Ok();
}

Status RecordingDevice::SyncImpl() {
  RecordedEvent e;
  e.kind = RecordedEvent::Kind::kSync;
  e.device = id_;
  record_->Append(std::move(e));
  return Status::Ok();
}

CrashImages::CrashImages(std::vector<RecordedEvent> events, std::vector<uint64_t> device_sizes,
                         uint32_t sector_bytes)
    : events_(std::move(events)), sizes_(std::move(device_sizes)), sector_bytes_(sector_bytes),
      pending_(sizes_.size()) {
  if (sector_bytes_ == 0) throw std::invalid_argument("CrashImages: sector_bytes must be positive");
  for (const RecordedEvent& e : events_) {
    if (e.kind != RecordedEvent::Kind::kMark && e.device >= sizes_.size())
      throw std::invalid_argument("CrashImages: an event names device " + std::to_string(e.device) +
                                  " of " + std::to_string(sizes_.size()));
    if (e.kind == RecordedEvent::Kind::kWrite && e.offset + e.bytes.size() > sizes_[e.device])
      throw std::invalid_argument("CrashImages: a write at offset " + std::to_string(e.offset) +
                                  " is past the end of device " + std::to_string(e.device));
  }
  for (uint64_t size : sizes_) durable_.emplace_back(size, 0);
}

void CrashImages::AdvanceTo(size_t point) {
  if (point < point_ || point > events_.size())
    throw std::invalid_argument("CrashImages::AdvanceTo(" + std::to_string(point) + "): the crash point is " +
                                std::to_string(point_) + " of " + std::to_string(events_.size()));
  for (; point_ < point; ++point_) {
    const RecordedEvent& e = events_[point_];
    if (e.kind == RecordedEvent::Kind::kWrite) {
      pending_[e.device].push_back(point_);
    } else if (e.kind == RecordedEvent::Kind::kSync) {
      for (size_t i : pending_[e.device]) {
        const RecordedEvent& w = events_[i];
        std::memcpy(durable_[e.device].data() + w.offset, w.bytes.data(), w.bytes.size());
      }
      pending_[e.device].clear();
    }
  }
}

void CrashImages::Apply(const RecordedEvent& e, bool torn, std::mt19937_64* rng, uint8_t* image) const {
  if (!torn) {
    std::memcpy(image + e.offset, e.bytes.data(), e.bytes.size());
    return;
  }
  for (size_t at = 0; at < e.bytes.size(); at += sector_bytes_) {
    if ((*rng)() & 1) continue;  // this sector keeps its old bytes
    const size_t len = std::min<size_t>(sector_bytes_, e.bytes.size() - at);
    std::memcpy(image + e.offset + at, e.bytes.data() + at, len);
  }
}

Status CrashImages::Build(uint32_t device, CrashMode mode, std::mt19937_64* rng, Device* into,
                          std::string* how) {
  if (device >= sizes_.size())
    return Status::InvalidArgument("crash image of device " + std::to_string(device) + " of " +
                                   std::to_string(sizes_.size()));
  const uint64_t size = sizes_[device];
  if (into->size() != size)
    return Status::InvalidArgument("crash image of " + std::to_string(size) + " bytes into a device of " +
                                   std::to_string(into->size()));
  if (scratch_.size() < size) scratch_ = AlignedBuffer(size, 4096);
  uint8_t* image = scratch_.data();
  std::memcpy(image, durable_[device].data(), size);
  const std::vector<size_t>& pending = pending_[device];
  std::vector<size_t> order(pending.size());
  std::iota(order.begin(), order.end(), 0);
  size_t lost = 0, torn_writes = 0;
  if (mode == CrashMode::kAllInOrder) {
    for (size_t i : pending) Apply(events_[i], false, rng, image);
  } else if (mode == CrashMode::kRandom) {
    std::shuffle(order.begin(), order.end(), *rng);
    for (size_t k : order) {
      const uint64_t choice = (*rng)() % 3;  // lost, applied, torn
      if (choice == 0) {
        ++lost;
        continue;
      }
      torn_writes += choice == 2;
      Apply(events_[pending[k]], choice == 2, rng, image);
    }
  } else {
    lost = pending.size();
  }
  if (how != nullptr) {
    *how = std::to_string(pending.size()) + " in flight: " + std::to_string(lost) + " lost, " +
           std::to_string(torn_writes) + " torn";
    if (mode == CrashMode::kRandom && !order.empty()) {
      *how += ", order";
      for (size_t k : order) *how += " " + std::to_string(k);
    }
  }
  constexpr uint64_t kChunk = 1u << 30;  // an IoOp's length is 32 bits
  for (uint64_t at = 0; at < size; at += kChunk) {
    IoOp op{at, image + at, static_cast<uint32_t>(std::min(kChunk, size - at))};
    MTRAINS_RETURN_IF_ERROR(into->Write(&op, 1));
  }
  return Status::Ok();
}

}  // namespace mtrains
