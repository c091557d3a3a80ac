// LocationMap: the in-memory location map of a SegmentLog (row -> slot + 1, 0 = never
// written), sized by the rows actually written rather than by the table.
//
// Rows are grouped in chunks of kChunkRows. A chunk is absent (no row written), sparse (a
// sorted array of (offset in chunk, value) pairs) or dense (one bit-packed value per row,
// of the fewest bits that hold the largest value). A chunk turns dense once its sparse form
// would cost more than a quarter of the dense one, so memory per logical row is at most the
// packed width (e.g. 30 bits for a log of under 2^30 slots) plus a pointer per chunk, and a
// sparse table costs about (2 + 4) bytes per written row.
//
// Not thread-safe (the owning SegmentLog is serialised by its BlockStore).
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace mtrains {

// Fixed-size blocks for the map's chunks, carved from anonymous mappings of 1 MiB or more
// and recycled per size: the map's many small, growing arrays stay off the process heap,
// where they would pin the memory of freed large buffers (e.g. the caller's tensors).
// Each mapping holds blocks of one size, so a size's mappings can be handed back whole
// (Retire) once its live blocks have moved out.
class ChunkPool {
 public:
  using Slabs = std::vector<std::pair<void*, uint64_t>>;
  ChunkPool() = default;
  ~ChunkPool();
  ChunkPool(const ChunkPool&) = delete;
  ChunkPool& operator=(const ChunkPool&) = delete;
  void* Alloc(uint64_t bytes);            // uninitialised; throws std::bad_alloc
  void Free(void* p, uint64_t bytes);     // `bytes` as passed to Alloc
  // Bytes handed out (live blocks and recycled ones): what is resident. The untouched rest
  // of a mapping costs address space only.
  uint64_t carved_bytes() const { return carved_; }
  // Of a size's carved bytes, those on its free list.
  uint64_t free_bytes(uint64_t bytes) const;
  uint64_t live_bytes(uint64_t bytes) const;
  // Detaches the mappings of `bytes`' size: the pool forgets them (later Allocs of that size
  // carve new ones), and the caller copies the live blocks out, then Unmap()s them.
  Slabs Retire(uint64_t bytes);
  static void Unmap(const Slabs& slabs);
  // The block size that holds `bytes` (blocks of one size share a free list).
  static uint64_t ClassSize(uint64_t bytes) { return (bytes + 15) / 16 * 16; }

 private:
  struct Class {
    uint64_t size;
    void* free_list;
    uint8_t* bump;
    uint8_t* end;
    uint64_t carved;  // bytes carved from this size's mappings
    uint64_t free;    // of them, on the free list
    Slabs slabs;
  };
  Class& ClassOf(uint64_t size);
  const Class* Find(uint64_t size) const;
  std::vector<Class> classes_;
  uint64_t carved_ = 0;
};

class LocationMap {
 public:
  static constexpr uint32_t kChunkShift = 12;
  static constexpr uint64_t kChunkRows = 1ull << kChunkShift;

  // A map of `num_rows` rows whose values lie in [0, max_value].
  LocationMap(uint64_t num_rows, uint64_t max_value);
  ~LocationMap();
  LocationMap(const LocationMap&) = delete;
  LocationMap& operator=(const LocationMap&) = delete;

  // The value of `row` (< num_rows): 0 when never set.
  uint64_t Get(uint64_t row) const {
    const Chunk* c = dir_[row >> kChunkShift];
    if (c == nullptr) return 0;
    const uint32_t off = static_cast<uint32_t>(row & (kChunkRows - 1));
    if (c->capacity == 0) return Load(c->data(), uint64_t(off) * bits_);
    return FindSparse(c, off);
  }
  // Sets `row` (< num_rows) to `value` (<= max_value; 0 clears it to never-written).
  void Set(uint64_t row, uint64_t value);

  // Asks for the cache lines Get(row) reads, for a loop over rows at random: first
  // PrefetchEntry (the directory's line), some rows later PrefetchValue (which reads that
  // entry, then asks for the chunk's header and the row's value, or a sparse chunk's
  // offsets). `row` must be < num_rows.
  void PrefetchEntry(uint64_t row) const { __builtin_prefetch(dir_.data() + (row >> kChunkShift)); }
  void PrefetchValue(uint64_t row) const {
    const Chunk* c = dir_[row >> kChunkShift];
    if (c == nullptr) return;
    __builtin_prefetch(c);
    const uint32_t off = static_cast<uint32_t>(row & (kChunkRows - 1));
    if (c->capacity == 0) {
      __builtin_prefetch(c->data() + ((uint64_t(off) * bits_) >> 3));
    } else {
      __builtin_prefetch(Offsets(c) + c->count / 2);  // the binary search's first probe
    }
  }
  // Writes the values of rows [first, first + n) to out[0..n) (zeros where never set).
  void Fill(uint64_t first, uint64_t n, uint64_t* out) const;
  // Calls f(row, value) for every row with a non-zero value, in row order.
  template <typename F>
  void ForEach(F&& f) const;

  // Bytes held: the chunk pool's blocks (live chunks and recycled ones) and the directory.
  uint64_t MemoryBytes() const { return pool_.carved_bytes() + dir_.capacity() * sizeof(Chunk*); }
  uint32_t value_bits() const { return bits_; }
  uint64_t dense_chunks() const { return dense_chunks_; }
  uint64_t sparse_chunks() const { return sparse_chunks_; }

 private:
  // Followed in the same allocation by the data: dense, ceil(rows * bits / 8) + 8 bytes
  // (the padding lets every value be read with one unaligned 8-byte load); sparse,
  // `capacity` u16 offsets then `capacity` values of value_bytes_ each.
  struct Chunk {
    uint32_t count;     // sparse: entries in use
    uint32_t capacity;  // sparse: entries allocated; 0 marks a dense chunk
    uint8_t* data() { return reinterpret_cast<uint8_t*>(this + 1); }
    const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(this + 1); }
  };

  uint64_t Load(const uint8_t* p, uint64_t bitpos) const {
    uint64_t w;
    std::memcpy(&w, p + (bitpos >> 3), 8);
    w >>= (bitpos & 7);
    return w & mask_;
  }
  void Store(uint8_t* p, uint64_t bitpos, uint64_t v) const {
    uint64_t w;
    std::memcpy(&w, p + (bitpos >> 3), 8);
    const uint32_t shift = bitpos & 7;
    w = (w & ~(mask_ << shift)) | (v << shift);
    std::memcpy(p + (bitpos >> 3), &w, 8);
  }
  const uint16_t* Offsets(const Chunk* c) const { return reinterpret_cast<const uint16_t*>(c->data()); }
  uint16_t* Offsets(Chunk* c) const { return reinterpret_cast<uint16_t*>(c->data()); }
  uint64_t SparseValue(const Chunk* c, uint32_t i) const;
  void SetSparseValue(Chunk* c, uint32_t i, uint64_t v) const;
  uint64_t FindSparse(const Chunk* c, uint32_t off) const;
  uint32_t RowsIn(uint64_t chunk) const;
  uint64_t DenseBytes(uint64_t chunk) const { return (uint64_t(RowsIn(chunk)) * bits_ + 7) / 8 + 8; }
  uint64_t SparseBytes(uint32_t capacity) const;
  Chunk* NewSparse(uint32_t capacity);
  uint64_t ChunkBytes(uint64_t chunk) const;  // the pool block size of dir_[chunk]
  uint64_t Release(uint64_t chunk);            // frees dir_[chunk]; returns its block size
  void MaybeCompact(uint64_t bytes);
  void MakeDense(uint64_t chunk);
  void GrowSparse(uint64_t chunk, uint32_t capacity);

  const uint64_t num_rows_;
  uint32_t bits_ = 1;         // packed width of a dense value
  uint64_t mask_ = 1;         // low bits_ bits set
  uint32_t value_bytes_ = 4;  // width of a sparse value (4 or 8)
  uint32_t sparse_max_ = 4;   // entries of a full-size sparse chunk before it turns dense
  std::vector<Chunk*> dir_;
  ChunkPool pool_;
  uint64_t dense_chunks_ = 0, sparse_chunks_ = 0;
};

template <typename F>
void LocationMap::ForEach(F&& f) const {
  for (uint64_t k = 0; k < dir_.size(); ++k) {
    const Chunk* c = dir_[k];
    if (c == nullptr) continue;
    const uint64_t row0 = k << kChunkShift;
    if (c->capacity == 0) {
      const uint32_t rows = RowsIn(k);
      for (uint32_t i = 0; i < rows; ++i) {
        const uint64_t v = Load(c->data(), uint64_t(i) * bits_);
        if (v != 0) f(row0 + i, v);
      }
    } else {
      for (uint32_t i = 0; i < c->count; ++i) {
        const uint64_t v = SparseValue(c, i);
        if (v != 0) f(row0 + Offsets(c)[i], v);
      }
    }
  }
}

}  // namespace mtrains
