#include "kernel/mapped_tier_rows.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "storage/lazy_init.h"

namespace mtrains {
namespace {

constexpr size_t kAhead = 8;  // rows between a row's prefetch and its copy
// Rows copied before their checksums are checked: checking a row right after copying it
// stalls on the copy's stores (13K rows of 516 bytes: 3.5 ms -> 0.9 ms on the dev VM).
constexpr size_t kVerifyChunk = 64;

// A row's checksum word: crc32c of its bytes, 0 (kept for "never written") mapped to 1.
inline uint32_t SumWord(uint32_t crc) { return crc ? crc : 1u; }

}  // namespace

MappedTierRows::MappedTierRows(Layout layout)
    : layout_(std::move(layout)),
      row_bytes_(size_t(layout_.dim + layout_.state_dim) * DTypeBytes(layout_.dtype)) {
  if (layout_.rows == nullptr || layout_.num_rows == 0 || row_bytes_ == 0)
    throw std::invalid_argument("mapped tier rows need a table of at least one non-empty row");
  if ((layout_.kind == Words::kNone) != (layout_.words == nullptr))
    throw std::invalid_argument("mapped tier rows: per-row words must be given exactly when their kind is");
}

Status MappedTierRows::CheckIds(const int64_t* ids, size_t n) const {
  for (size_t i = 0; i < n; ++i)
    if (ids[i] < 0 || uint64_t(ids[i]) >= layout_.num_rows)
      return Status::OutOfRange(layout_.name + ": row id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " + std::to_string(layout_.num_rows) + ")");
  return Status::Ok();
}

Status MappedTierRows::CorruptRow(int64_t id) const {
  return Status::Corruption(layout_.name + ": row " + std::to_string(id) + " (byte offset " +
                            std::to_string(layout_.first_row_offset + uint64_t(id) * row_bytes_) +
                            "): crc32c mismatch, the row's bytes or its checksum are damaged (write the row "
                            "again or restore a checkpoint)");
}

uint32_t MappedTierRows::Word(int64_t id) const {
  switch (layout_.kind) {
    case Words::kNone: return 1;
    case Words::kWrittenFlags: return static_cast<const uint8_t*>(layout_.words)[id];
    case Words::kChecksums: return static_cast<const uint32_t*>(layout_.words)[id];
  }
  return 1;
}

void MappedTierRows::SetWord(int64_t id, uint32_t crc) {
  if (layout_.kind == Words::kWrittenFlags) static_cast<uint8_t*>(layout_.words)[id] = 1;
  if (layout_.kind == Words::kChecksums) static_cast<uint32_t*>(layout_.words)[id] = SumWord(crc);
}

void MappedTierRows::LazyRow(int64_t id, uint8_t* out) const {
  LazyInitRow(layout_.seed, uint64_t(id), layout_.init_lo, layout_.init_hi, layout_.dim, layout_.state_dim,
              layout_.dtype, out);
}

Status MappedTierRows::Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots,
                            size_t nw, const int64_t* load_ids, const int64_t* load_slots, size_t nr,
                            StageCpu* cpu) {
  if (slots.row_bytes() != row_bytes_)
    return Status::InvalidArgument(layout_.name + ": cache slots hold rows of " + std::to_string(slots.row_bytes()) +
                                   " bytes; the tier's are " + std::to_string(row_bytes_));
  Status st = CheckIds(evict_ids, nw);
  if (st.ok()) st = CheckIds(load_ids, nr);
  if (!st.ok()) return st;
  uint64_t t0 = ThreadCpuNs();
  const bool sums = layout_.kind == Words::kChecksums;
  for (size_t i = 0; i < nw; ++i) {
    if (i + kAhead < nw) {
      slots.Prefetch<SlotRows::kMoveLocality>(evict_slots[i + kAhead], false);
      SlotRows::PrefetchBytes<SlotRows::kMoveLocality>(Row(evict_ids[i + kAhead]), row_bytes_, true);
    }
    uint8_t* row = Row(evict_ids[i]);
    slots.CopyOut(evict_slots[i], row);
    // From the slot, not the mapping: the bytes just written would stall the reads.
    SetWord(evict_ids[i], sums ? slots.Crc(evict_slots[i]) : 0);
  }
  uint64_t t1 = ThreadCpuNs();
  cpu->write_back_ns += t1 - t0;
  // Loads, a chunk at a time: copy each row into its slot (or make its initial value
  // there), then check the chunk's copies against their words.
  std::vector<uint8_t> lazy(row_bytes_);
  uint32_t want[kVerifyChunk];
  uint64_t verify_ns = 0;
  for (size_t lo = 0; lo < nr; lo += kVerifyChunk) {
    const size_t hi = std::min(nr, lo + kVerifyChunk);
    for (size_t i = lo; i < hi; ++i) {
      if (i + kAhead < nr) {
        SlotRows::PrefetchBytes<SlotRows::kMoveLocality>(Row(load_ids[i + kAhead]), row_bytes_, false);
        slots.Prefetch<SlotRows::kMoveLocality>(load_slots[i + kAhead], true);
      }
      want[i - lo] = Word(load_ids[i]);
      if (want[i - lo] == 0) {
        LazyRow(load_ids[i], lazy.data());
        slots.CopyIn(lazy.data(), load_slots[i]);
        ++cpu->lazy_rows;
      } else {
        slots.CopyIn(Row(load_ids[i]), load_slots[i]);
      }
    }
    if (sums) {
      const uint64_t v0 = ThreadCpuNs();
      for (size_t i = lo; i < hi; ++i)
        if (want[i - lo] != 0 && SumWord(slots.Crc(load_slots[i])) != want[i - lo]) return CorruptRow(load_ids[i]);
      verify_ns += ThreadCpuNs() - v0;
    }
  }
  const uint64_t t2 = ThreadCpuNs();
  // One copy moves each row from the mapping into its slot: reading it and copying it are
  // one stage here.
  cpu->read_ns += t2 - t1 - verify_ns;
  cpu->verify_ns += verify_ns;
  return Status::Ok();
}

Status MappedTierRows::Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) {
  Status st = CheckIds(ids, n);
  if (!st.ok()) return st;
  const uint64_t t0 = ThreadCpuNs();
  for (size_t i = 0; i < n; ++i) {
    uint8_t* o = out + i * row_bytes_;
    const uint32_t want = Word(ids[i]);
    if (want == 0) {
      LazyRow(ids[i], o);
      ++cpu->lazy_rows;
      continue;
    }
    std::memcpy(o, Row(ids[i]), row_bytes_);
    if (layout_.kind == Words::kChecksums && SumWord(Crc32c(0, o, row_bytes_)) != want) return CorruptRow(ids[i]);
  }
  cpu->read_ns += ThreadCpuNs() - t0;
  return Status::Ok();
}

}  // namespace mtrains
