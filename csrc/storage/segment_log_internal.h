// Internal to SegmentLog's files (segment_log.cc: construction, the append head and commit;
// segment_log_map.cc: the map's persistence; segment_log_space.cc: segment liveness, pins and
// garbage collection): the tuning constants more than one of them uses.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mtrains {
namespace segment_log_internal {

inline constexpr uint64_t kMinFreeSegments = 1;      // a collector's victim needs one to move into
inline constexpr uint64_t kMaxGcBatchSegments = 64;  // segments a collection frees beyond the need
inline constexpr uint64_t kMapChunkBytes = 8 << 20;  // map bytes per batched I/O (buffer size)
inline constexpr size_t kSpareBuffers = 4;           // segment buffers kept for reuse
inline constexpr uint64_t kJournalPerCheckpoint = 2;  // journal bytes per checkpoint byte before one

}  // namespace segment_log_internal
}  // namespace mtrains
