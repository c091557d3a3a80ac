// Zeroed tensors on transparent huge pages (torch.ops.mtrains.huge_page_zeros), for the cache's
// weights and optimizer state and the DRAM tier's tables (torchrec_mtrains/huge_pages.py): a
// step reads and writes their rows at random, so on 4 KiB pages
// nearly every row costs a TLB miss per tensor (a page walk, dearer still under a VM's nested
// paging). On 2 MiB pages the Adam family's update of 26K random rows of a 1M x 128 table ran
// 25% faster on this VM (docs/results/benchmarks.md).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <new>

#include "common/huge_page_allocator.h"

namespace mtrains {
namespace {

at::Tensor HugePageZeros(int64_t numel, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(numel >= 0, "huge_page_zeros: numel must be >= 0, got ", numel);
  const size_t element = at::elementSize(dtype);
  TORCH_CHECK_VALUE(size_t(numel) <= size_t(-1) / element, "huge_page_zeros: ", numel, " elements overflow");
  const size_t bytes = size_t(numel) * element;
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  // Below a huge page the advice buys nothing and the rounding would waste memory.
  if (bytes < HugePageAllocator<char>::kHugePage) return at::zeros({numel}, options);
  char* data = nullptr;
  try {
    data = HugePageAllocator<char>().allocate(bytes);
  } catch (const std::bad_alloc&) {
    TORCH_CHECK(false, "huge_page_zeros: cannot allocate ", bytes, " bytes");
  }
  std::memset(data, 0, bytes);  // the first touch, after the advice: the pages fault in as 2 MiB ones
  return at::from_blob(
      data, {numel}, [bytes](void* p) { HugePageAllocator<char>().deallocate(static_cast<char*>(p), bytes); },
      options);
}

}  // namespace
}  // namespace mtrains

// No tensor argument to dispatch on: one kernel for every key.
TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("huge_page_zeros(int numel, ScalarType dtype) -> Tensor", &mtrains::HugePageZeros);
}
