// HugePageAllocator: a std::allocator for large arrays read at random (the row cache's index),
// whose blocks of 2 MiB or more are 2 MiB-aligned and advised to the kernel as transparent
// huge pages (madvise MADV_HUGEPAGE, before their first touch). A random read of a 32 MiB array
// on 4 KiB pages misses the TLB almost every time; on 2 MiB pages the array is 16 entries.
// Where the kernel has no transparent huge pages (or only "never") the advice is ignored and
// the block is an ordinary one. Smaller blocks come from operator new. Stateless: every
// instance can free what another allocated.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace mtrains {

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  // Throws std::bad_alloc.
  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return static_cast<T*>(::operator new(bytes));
    void* p = nullptr;
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    if (posix_memalign(&p, kHugePage, rounded) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: a kernel without THP keeps 4 KiB pages
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePage)
      ::operator delete(p);
    else
      std::free(p);
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept { return false; }
};

}  // namespace mtrains
