// Internal to the BlockStore's own files (block_store.cc, block_store_open.cc): what both
// the open path and the data path use.
#pragma once

#include <cstdint>

namespace mtrains {
namespace block_store_internal {

inline constexpr uint32_t kAlignment = 4096;  // O_DIRECT buffer/offset alignment (bytes)

inline constexpr char kWhat[] = "table file";  // what ownership errors call the main file

}  // namespace block_store_internal
}  // namespace mtrains
