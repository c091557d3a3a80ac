// AlignedBuffer: an owned, zero-initialised heap buffer aligned for direct I/O.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace mtrains {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates `size` bytes aligned to `alignment` (a power of two); throws std::bad_alloc.
  AlignedBuffer(size_t size, size_t alignment) : size_(size) {
    if (size == 0) return;
    void* p = nullptr;
    if (posix_memalign(&p, alignment, size) != 0) throw std::bad_alloc();
    std::memset(p, 0, size);
    data_ = static_cast<uint8_t*>(p);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mtrains
