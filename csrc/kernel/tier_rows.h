// TierRows: where one table's rows live below the kernel's cache, as the step mover
// (step_mover.h) moves them: evicted dirty rows out of the cache slots, missing rows into
// them, without staging the rows in tensors between the two.
//
// Implementations: MappedTierRows (rows addressable in memory: the DRAM tier's tensor, the
// SCM tier's mapping) and BlockStoreTierRows (the SSD tier's BlockStore).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernel/slot_rows.h"

namespace mtrains {

// CPU time (the calling thread's, in ns) a move spent in each stage. A tier that cannot
// separate two stages counts them in the first (BlockStoreTierRows: its store verifies the
// blocks it reads, so verify is inside read).
struct StageCpu {
  uint64_t write_back_ns = 0;  // evicted rows out of their slots and into the tier
  uint64_t read_ns = 0;        // missing rows found and read (device I/O submitted, completed)
  uint64_t verify_ns = 0;      // their checksums checked
  uint64_t copy_ns = 0;        // rows read copied into their slots
  uint64_t lazy_rows = 0;      // rows read that were never written (their initial value made)

  StageCpu& operator+=(const StageCpu& o) {
    write_back_ns += o.write_back_ns;
    read_ns += o.read_ns;
    verify_ns += o.verify_ns;
    copy_ns += o.copy_ns;
    lazy_rows += o.lazy_rows;
    return *this;
  }
};

// The calling thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID).
uint64_t ThreadCpuNs();

class TierRows {
 public:
  virtual ~TierRows() = default;

  // Bytes of a row in the tier (the slots' weight + state bytes).
  virtual size_t row_bytes() const = 0;

  // Writes the rows of slots `evict_slots[0..nw)` back as rows `evict_ids`, then puts rows
  // `load_ids[0..nr)` into slots `load_slots` (all below slots.slots). A row both written
  // and loaded loads its new value. Ids outside the table return OutOfRange before
  // anything is written; a failed or corrupt read returns its error (the loaded slots are
  // then unspecified; the written rows were accepted).
  virtual Status Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
                      const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) = 0;

  // Reads rows `ids[0..n)` into `out` (n * row_bytes()), verified.
  virtual Status Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) = 0;
};

}  // namespace mtrains
