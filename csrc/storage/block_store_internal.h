// Internal to the BlockStore's own files (block_store.cc, block_store_open.cc): what both
// the open path and the data path use.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace mtrains {
namespace block_store_internal {

inline constexpr uint32_t kAlignment = 4096;  // O_DIRECT buffer/offset alignment (bytes)

// An IoError with `err` and "what: strerror(err)".
inline Status Errno(int err, const std::string& what) {
  return Status::IoError(err, what + ": " + std::strerror(err));
}

inline constexpr char kWhat[] = "table file";  // what ownership errors call the main file

// Ok unless `path` is there and a store open for writing holds its lock (replacing the file
// would leave that store writing to an unlinked inode). In block_store_open.cc.
Status CheckNotOwned(const std::string& path);

}  // namespace block_store_internal
}  // namespace mtrains
