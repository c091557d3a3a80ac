#include "storage/location_map.h"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace mtrains {
namespace {

constexpr uint64_t kAllocOverhead = 16;  // bytes malloc keeps per allocation (estimate)
constexpr uint32_t kFirstSparseCapacity = 4;

}  // namespace

LocationMap::LocationMap(uint64_t num_rows, uint64_t max_value) : num_rows_(num_rows) {
  while (bits_ < 64 && (max_value >> bits_) != 0) ++bits_;
  // One unaligned 8-byte load holds any value of up to 57 bits at any bit offset; wider
  // values take whole words (offsets then stay multiples of 64 bits).
  if (bits_ > 56) bits_ = 64;
  mask_ = bits_ == 64 ? ~0ull : (1ull << bits_) - 1;
  value_bytes_ = bits_ <= 32 ? 4 : 8;
  const uint64_t dense = (kChunkRows * bits_ + 7) / 8 + 8;
  sparse_max_ = static_cast<uint32_t>(std::max<uint64_t>(kFirstSparseCapacity, dense / 4 / (2 + value_bytes_)));
  dir_.assign((num_rows + kChunkRows - 1) >> kChunkShift, nullptr);
}

LocationMap::~LocationMap() {
  for (Chunk* c : dir_) std::free(c);
}

uint32_t LocationMap::RowsIn(uint64_t chunk) const {
  return static_cast<uint32_t>(std::min<uint64_t>(kChunkRows, num_rows_ - (chunk << kChunkShift)));
}

uint64_t LocationMap::SparseBytes(uint32_t capacity) const {
  return uint64_t(capacity) * 2 + uint64_t(capacity) * value_bytes_;
}

uint64_t LocationMap::SparseValue(const Chunk* c, uint32_t i) const {
  const uint8_t* v = c->data() + uint64_t(c->capacity) * 2 + uint64_t(i) * value_bytes_;
  if (value_bytes_ == 4) {
    uint32_t x;
    std::memcpy(&x, v, 4);
    return x;
  }
  uint64_t x;
  std::memcpy(&x, v, 8);
  return x;
}

void LocationMap::SetSparseValue(Chunk* c, uint32_t i, uint64_t v) const {
  uint8_t* p = c->data() + uint64_t(c->capacity) * 2 + uint64_t(i) * value_bytes_;
  if (value_bytes_ == 4) {
    const uint32_t x = static_cast<uint32_t>(v);
    std::memcpy(p, &x, 4);
  } else {
    std::memcpy(p, &v, 8);
  }
}

uint64_t LocationMap::FindSparse(const Chunk* c, uint32_t off) const {
  const uint16_t* offs = Offsets(c);
  const uint16_t* it = std::lower_bound(offs, offs + c->count, static_cast<uint16_t>(off));
  if (it == offs + c->count || *it != off) return 0;
  return SparseValue(c, static_cast<uint32_t>(it - offs));
}

LocationMap::Chunk* LocationMap::NewSparse(uint32_t capacity) {
  const uint64_t bytes = sizeof(Chunk) + SparseBytes(capacity);
  Chunk* c = static_cast<Chunk*>(std::malloc(bytes));
  if (c == nullptr) throw std::bad_alloc();
  c->count = 0;
  c->capacity = capacity;
  chunk_bytes_ += bytes + kAllocOverhead;
  ++sparse_chunks_;
  return c;
}

void LocationMap::Release(uint64_t chunk) {
  Chunk* c = dir_[chunk];
  if (c->capacity == 0) {
    chunk_bytes_ -= sizeof(Chunk) + DenseBytes(chunk) + kAllocOverhead;
    --dense_chunks_;
  } else {
    chunk_bytes_ -= sizeof(Chunk) + SparseBytes(c->capacity) + kAllocOverhead;
    --sparse_chunks_;
  }
  std::free(c);
  dir_[chunk] = nullptr;
}

void LocationMap::GrowSparse(uint64_t chunk, uint32_t capacity) {
  const Chunk* old = dir_[chunk];
  Chunk* c = NewSparse(capacity);
  c->count = old->count;
  std::memcpy(Offsets(c), Offsets(old), uint64_t(old->count) * 2);
  std::memcpy(c->data() + uint64_t(capacity) * 2, old->data() + uint64_t(old->capacity) * 2,
              uint64_t(old->count) * value_bytes_);
  Release(chunk);
  dir_[chunk] = c;
}

void LocationMap::MakeDense(uint64_t chunk) {
  const Chunk* old = dir_[chunk];
  const uint64_t bytes = sizeof(Chunk) + DenseBytes(chunk);
  Chunk* c = static_cast<Chunk*>(std::calloc(1, bytes));
  if (c == nullptr) throw std::bad_alloc();
  c->capacity = 0;
  for (uint32_t i = 0; i < old->count; ++i)
    Store(c->data(), uint64_t(Offsets(old)[i]) * bits_, SparseValue(old, i));
  Release(chunk);
  dir_[chunk] = c;
  chunk_bytes_ += bytes + kAllocOverhead;
  ++dense_chunks_;
}

void LocationMap::Set(uint64_t row, uint64_t value) {
  const uint64_t k = row >> kChunkShift;
  const uint32_t off = static_cast<uint32_t>(row & (kChunkRows - 1));
  Chunk* c = dir_[k];
  if (c == nullptr) {
    if (value == 0) return;
    dir_[k] = c = NewSparse(std::min(kFirstSparseCapacity, sparse_max_));
  }
  if (c->capacity == 0) {
    Store(c->data(), uint64_t(off) * bits_, value);
    return;
  }
  uint16_t* offs = Offsets(c);
  uint32_t i = static_cast<uint32_t>(std::lower_bound(offs, offs + c->count, static_cast<uint16_t>(off)) - offs);
  if (i < c->count && offs[i] == off) {
    SetSparseValue(c, i, value);
    return;
  }
  if (value == 0) return;
  if (c->count == c->capacity) {
    // A short last chunk turns dense sooner: its dense form is smaller.
    const uint64_t limit = std::min<uint64_t>(sparse_max_, DenseBytes(k) / 4 / (2 + value_bytes_));
    if (c->count >= limit) {
      MakeDense(k);
      Store(dir_[k]->data(), uint64_t(off) * bits_, value);
      return;
    }
    GrowSparse(k, static_cast<uint32_t>(std::min<uint64_t>(uint64_t(c->capacity) * 2, std::max<uint64_t>(limit, c->capacity + 1))));
    c = dir_[k];
    offs = Offsets(c);
  }
  uint8_t* vals = c->data() + uint64_t(c->capacity) * 2;
  std::memmove(offs + i + 1, offs + i, uint64_t(c->count - i) * 2);
  std::memmove(vals + uint64_t(i + 1) * value_bytes_, vals + uint64_t(i) * value_bytes_,
               uint64_t(c->count - i) * value_bytes_);
  offs[i] = static_cast<uint16_t>(off);
  ++c->count;
  SetSparseValue(c, i, value);
}

void LocationMap::Fill(uint64_t first, uint64_t n, uint64_t* out) const {
  std::memset(out, 0, n * sizeof(uint64_t));
  const uint64_t end = first + n;
  for (uint64_t k = first >> kChunkShift; k < dir_.size() && (k << kChunkShift) < end; ++k) {
    const Chunk* c = dir_[k];
    if (c == nullptr) continue;
    const uint64_t row0 = k << kChunkShift;
    const uint64_t lo = std::max(first, row0), hi = std::min(end, row0 + RowsIn(k));
    if (c->capacity == 0) {
      for (uint64_t r = lo; r < hi; ++r) out[r - first] = Load(c->data(), (r - row0) * bits_);
      continue;
    }
    const uint16_t* offs = Offsets(c);
    uint32_t i = static_cast<uint32_t>(
        std::lower_bound(offs, offs + c->count, static_cast<uint16_t>(lo - row0)) - offs);
    for (; i < c->count && row0 + offs[i] < hi; ++i) out[row0 + offs[i] - first] = SparseValue(c, i);
  }
}

}  // namespace mtrains
