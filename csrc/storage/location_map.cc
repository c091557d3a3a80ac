#include "storage/location_map.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace mtrains {
namespace {

constexpr uint32_t kFirstSparseCapacity = 4;
constexpr uint64_t kSlabBytes = 1 << 20;  // a mapping's least size
// The least free bytes of a size worth moving its blocks: well above the block or two a
// table written in row order keeps free (each chunk fills before the next starts, reusing
// the blocks the last one left), so such a table never compacts.
constexpr uint64_t kLeastCompaction = 64 << 10;

}  // namespace

ChunkPool::~ChunkPool() {
  for (const Class& c : classes_) Unmap(c.slabs);
}

ChunkPool::Class& ChunkPool::ClassOf(uint64_t size) {
  for (Class& c : classes_)
    if (c.size == size) return c;
  classes_.push_back({size, nullptr, nullptr, nullptr, 0, 0, {}});
  return classes_.back();
}

const ChunkPool::Class* ChunkPool::Find(uint64_t size) const {
  for (const Class& c : classes_)
    if (c.size == size) return &c;
  return nullptr;
}

void* ChunkPool::Alloc(uint64_t bytes) {
  Class& c = ClassOf(ClassSize(bytes));
  if (c.free_list != nullptr) {
    void* p = c.free_list;
    std::memcpy(&c.free_list, p, sizeof(void*));
    c.free -= c.size;
    return p;
  }
  if (c.bump == nullptr || c.bump + c.size > c.end) {
    const uint64_t n = std::max<uint64_t>(kSlabBytes, (16 * c.size + 4095) / 4096 * 4096);
    void* slab = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (slab == MAP_FAILED) throw std::bad_alloc();
    c.slabs.emplace_back(slab, n);
    c.bump = static_cast<uint8_t*>(slab);
    c.end = c.bump + n;
  }
  void* p = c.bump;
  c.bump += c.size;
  c.carved += c.size;
  carved_ += c.size;
  return p;
}

void ChunkPool::Free(void* p, uint64_t bytes) {
  Class& c = ClassOf(ClassSize(bytes));
  std::memcpy(p, &c.free_list, sizeof(void*));
  c.free_list = p;
  c.free += c.size;
}

uint64_t ChunkPool::free_bytes(uint64_t bytes) const {
  const Class* c = Find(ClassSize(bytes));
  return c == nullptr ? 0 : c->free;
}

uint64_t ChunkPool::live_bytes(uint64_t bytes) const {
  const Class* c = Find(ClassSize(bytes));
  return c == nullptr ? 0 : c->carved - c->free;
}

ChunkPool::Slabs ChunkPool::Retire(uint64_t bytes) {
  Class& c = ClassOf(ClassSize(bytes));
  Slabs out;
  out.swap(c.slabs);
  carved_ -= c.carved;
  c.free_list = nullptr;
  c.bump = c.end = nullptr;
  c.carved = c.free = 0;
  return out;
}

void ChunkPool::Unmap(const Slabs& slabs) {
  for (const auto& [p, n] : slabs) munmap(p, n);
}

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

LocationMap::~LocationMap() = default;  // the pool unmaps every chunk

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
  Chunk* c = static_cast<Chunk*>(pool_.Alloc(sizeof(Chunk) + SparseBytes(capacity)));
  c->count = 0;
  c->capacity = capacity;
  ++sparse_chunks_;
  return c;
}

uint64_t LocationMap::ChunkBytes(uint64_t chunk) const {
  const Chunk* c = dir_[chunk];
  return sizeof(Chunk) + (c->capacity == 0 ? DenseBytes(chunk) : SparseBytes(c->capacity));
}

uint64_t LocationMap::Release(uint64_t chunk) {
  Chunk* c = dir_[chunk];
  const uint64_t bytes = ChunkBytes(chunk);
  if (c->capacity == 0) {
    --dense_chunks_;
  } else {
    --sparse_chunks_;
  }
  pool_.Free(c, bytes);  // overwrites the header with the free list's link
  dir_[chunk] = nullptr;
  return bytes;
}

// Chunks grow together when rows are written across the table, so the blocks they leave
// behind are seldom wanted again: without this, a map whose chunks doubled up to capacity C
// would hold C's blocks plus nearly as many bytes of smaller free ones. Once a size's free
// blocks outweigh its live ones (and kLeastCompaction), its live blocks move to fresh
// mappings and its old ones are handed back. Each move copies at most the size's live
// bytes, which at least halve between moves of one size, so the copying is linear in the
// bytes ever carved; the transient is one size's live bytes.
void LocationMap::MaybeCompact(uint64_t bytes) {
  const uint64_t free = pool_.free_bytes(bytes), live = pool_.live_bytes(bytes);
  if (free < kLeastCompaction || free <= live) return;
  const uint64_t size = ChunkPool::ClassSize(bytes);
  const ChunkPool::Slabs old = pool_.Retire(bytes);
  for (uint64_t k = 0; k < dir_.size(); ++k) {
    if (dir_[k] == nullptr || ChunkPool::ClassSize(ChunkBytes(k)) != size) continue;
    void* moved = pool_.Alloc(size);
    std::memcpy(moved, dir_[k], size);
    dir_[k] = static_cast<Chunk*>(moved);
  }
  ChunkPool::Unmap(old);
}

void LocationMap::GrowSparse(uint64_t chunk, uint32_t capacity) {
  const Chunk* old = dir_[chunk];
  Chunk* c = NewSparse(capacity);
  c->count = old->count;
  std::memcpy(Offsets(c), Offsets(old), uint64_t(old->count) * 2);
  std::memcpy(c->data() + uint64_t(capacity) * 2, old->data() + uint64_t(old->capacity) * 2,
              uint64_t(old->count) * value_bytes_);
  const uint64_t freed = Release(chunk);
  dir_[chunk] = c;
  MaybeCompact(freed);
}

void LocationMap::MakeDense(uint64_t chunk) {
  const Chunk* old = dir_[chunk];
  const uint64_t bytes = sizeof(Chunk) + DenseBytes(chunk);
  Chunk* c = static_cast<Chunk*>(pool_.Alloc(bytes));
  std::memset(c, 0, bytes);
  for (uint32_t i = 0; i < old->count; ++i)
    Store(c->data(), uint64_t(Offsets(old)[i]) * bits_, SparseValue(old, i));
  const uint64_t freed = Release(chunk);
  dir_[chunk] = c;
  ++dense_chunks_;
  MaybeCompact(freed);
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
