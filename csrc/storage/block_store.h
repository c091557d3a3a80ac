// BlockStore: embedding rows (weights + optimizer state) on a block device.
//
// Dense row ids in [0, num_rows) need no index: a row's latest version is found through a
// direct-mapped location map into a log of fixed-size, crc32c-checked blocks (see
// segment_log.h and block_format.h). A write-back DRAM row cache sits in front. Rows never
// written read as deterministic uniform(init_range) weights and zero state (lazy_init.h),
// so creating a 1 TB table writes one header block.
//
// Thread-safety: every public method may be called from any thread; calls are serialised
// by one first-come, first-served mutex (each call is a batch whose device I/O runs at full
// queue depth; Exchange overlaps its writes and reads inside the call), so a writer or
// flusher waits behind at most one call of each thread that asked before it, however
// tightly readers loop.
// Ownership: a store opened for writing (Create, Open, OpenAdopted) holds an exclusive
// lock on its main file until Close (common/file_lock.h); a second such open of the file,
// in this process or another, is refused with IoError(EWOULDBLOCK) naming the holder.
// Errors: failures are returned as a Status naming the file and the offending value, bad
// options and table fields included (Create/Open return InvalidArgument, never throw).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "storage/block_format.h"
#include "storage/device.h"
#include "storage/env.h"
#include "storage/file_device.h"
#include "storage/row_cache.h"
#include "storage/segment_log.h"

namespace mtrains {

// How a store runs (not persisted): cache and I/O settings.
struct StoreRuntimeOptions {
  double dram_cache_mb = 64.0;  // MiB of row cache; 0 disables it
  bool direct_io = true;
  IoEngineKind engine = IoEngineKind::kAuto;
  uint32_t queue_depth = 64;
  uint32_t io_threads = 8;
  uint32_t read_chunk_blocks = 128;  // read buffers in flight or being verified (extents)
  // The files and devices the store lives on (not owned; must outlive the store). Null:
  // Env::Default(), POSIX files with direct I/O. Tests pass their own (csrc/testing/).
  Env* env = nullptr;
};

// What a new table looks like (persisted in its header).
struct TableOptions {
  uint64_t num_rows = 0;
  uint32_t dim = 0, state_dim = 1;
  DType dtype = DType::kFloat32;
  uint32_t block_size = 4096;
  uint64_t seed = 0;
  double init_lo = -0.01, init_hi = 0.01;
  uint32_t segment_blocks = 256;
  double overprovision = 0.5;  // log space beyond what all rows need, as a fraction
  std::vector<std::string> stripe_paths;  // spread the log over these files (several SSDs)
};

class BlockStore {
 public:
  // Creates a new table file at `path` (and its stripe files). Fails with EEXIST when a
  // file is there unless `overwrite`; with `overwrite`, EWOULDBLOCK when one of them is
  // the main file of a store open for writing (nothing is removed then).
  static Status Create(const std::string& path, const TableOptions& table,
                       const StoreRuntimeOptions& runtime, bool overwrite,
                       std::unique_ptr<BlockStore>* out);
  // Opens an existing table, validating its header, file sizes and location map.
  static Status Open(const std::string& path, const StoreRuntimeOptions& runtime,
                     std::unique_ptr<BlockStore>* out);
  // Opens an existing table (the same header and file checks as Open) to read row
  // versions by location only: the devices are opened read-only and the map is not
  // loaded. Only ReadLocations, Stats, the header accessors and Close work (the others
  // return InvalidArgument); Close writes nothing, so a live store may share the file
  // (it takes no lock: it reads pinned segments, which the live store never rewrites).
  static Status OpenReadOnly(const std::string& path, const StoreRuntimeOptions& runtime,
                             std::unique_ptr<BlockStore>* out);
  // Opens an existing table and makes its location map exactly the entries
  // (rows[i] -> locations[i], map values: slot + 1; rows strictly ascending), segments no
  // entry points into becoming free; pins the entries' segments under `pin_tag` and
  // commits, writing only the map entries that differ from the file's. Bad entries return
  // InvalidArgument with nothing written.
  static Status OpenAdopted(const std::string& path, const StoreRuntimeOptions& runtime,
                            const int64_t* rows, const uint64_t* locations, size_t n,
                            uint64_t pin_tag, std::unique_ptr<BlockStore>* out);
  // Flushes (best effort: errors go to stderr; call Close to see them).
  ~BlockStore();

  // Copies rows `ids[0..n)` into `out` (n * row_bytes). Ids are checked first: an id
  // outside [0, num_rows) returns OutOfRange and nothing is read or changed.
  Status Read(const int64_t* ids, size_t n, uint8_t* out) EXCLUDES(mu_);
  // Stores rows (n * row_bytes at `rows`); for a repeated id the last one wins. On a
  // device error the rows already accepted stay in memory and are written by a later
  // Flush: nothing accepted is lost.
  Status Write(const int64_t* ids, size_t n, const uint8_t* rows) EXCLUDES(mu_);
  // Write(write_ids, nw, write_rows) then Read(read_ids, nr, out) in one call, with the
  // device writes of the first overlapping the device reads of the second: the written
  // rows are accepted into memory (row cache or log head) before any read is looked up,
  // so a row both written and read here reads its new value; the full log segments they
  // fill go to the device on a helper thread while this one streams the reads. Both id
  // lists are checked first: an id outside [0, num_rows) returns OutOfRange and nothing
  // is written or read. A failed read returns its error (the rows in `out` are then
  // unspecified; the writes were still accepted); a failed segment write with good reads
  // returns the write's error, the rows staying in memory for a later Flush as in Write.
  // `write_rows` and `out` must not overlap.
  Status Exchange(const int64_t* write_ids, size_t nw, const uint8_t* write_rows,
                  const int64_t* read_ids, size_t nr, uint8_t* out) EXCLUDES(mu_);
  // Writes every dirty row and the location map, then fsyncs.
  Status Flush() EXCLUDES(mu_);
  // Flushes, then writes a point-in-time copy of the table to `dst` (stripes beside it).
  // EWOULDBLOCK, nothing copied, when `dst` is the main file of a store open for writing.
  Status Snapshot(const std::string& dst) EXCLUDES(mu_);
  // Flushes and releases the files; further calls return Closed.
  Status Close() EXCLUDES(mu_);

  // Sets `out` to the rows in [first, first + count), ascending, that may differ from their
  // initial value: rows the location map points into the log (appended since the table
  // was created, durable or not yet) and rows dirty in the DRAM cache that never reached
  // the log. Every other row reads as LazyInitRow. Memory is O(count), whatever the
  // table's size. A range past num_rows returns OutOfRange.
  Status WrittenRows(uint64_t first, uint64_t count, std::vector<int64_t>* out) EXCLUDES(mu_);

  // Pins: segments a checkpoint (a hard link of the file and the map entries) needs are
  // never reused while pinned (segment_log.h).
  // Flushes like Flush, then pins under `tag` every segment holding live rows (the ones
  // the map points into), replacing the tag's set if it was pinned.
  Status PinSnapshot(uint64_t tag) EXCLUDES(mu_);
  // The map entries with row in [first, first + count), ascending (locations: map values),
  // as of PinSnapshot(tag): InvalidArgument unless `tag` was pinned by PinSnapshot and
  // nothing was appended to the log since. OutOfRange past num_rows. Memory O(count).
  Status SnapshotEntries(uint64_t tag, uint64_t first, uint64_t count, std::vector<int64_t>* rows,
                         std::vector<uint64_t>* locations) EXCLUDES(mu_);
  // Adds to `tag`'s pins the segments of these map values (in [1, LogSlots]; free ones are
  // taken out of the free list). Refused once anything was appended since the store was
  // opened (a freed segment may have been reused).
  Status PinLocations(uint64_t tag, const uint64_t* locations, size_t n) EXCLUDES(mu_);
  // Drops `tag`'s pins (unknown tag: no-op); dead segments no longer pinned are freed at
  // the next commit.
  void UnpinSnapshot(uint64_t tag) EXCLUDES(mu_);
  std::vector<uint64_t> PinTags() EXCLUDES(mu_);
  // Reads the row versions at map values `locations[i]` into `out` (n * row_bytes), each
  // block verified and holding row `rows[i]` (Corruption naming the row and location
  // otherwise). Location 0 or past the log: InvalidArgument; a row outside [0, num_rows):
  // OutOfRange. Works on read-only stores.
  Status ReadLocations(const int64_t* rows, const uint64_t* locations, size_t n, uint8_t* out)
      EXCLUDES(mu_);

  // Sets `order` (n entries) to the permutation of [0, n) in which rows `ids` read fastest:
  // first the rows held in memory (the DRAM cache) or never written, in the order given,
  // then the others by their place in the log. Read in that order, in batches, the rows of
  // a stretch of the log come off the device in long sequential runs (Read and
  // ReadLocations read a dense stretch whole) instead of one random block each: what a
  // checkpoint saving many rows wants. Ids are checked first (OutOfRange); the order is
  // the log's as of the call (a later write or garbage collection may move rows).
  Status StorageOrder(const int64_t* ids, size_t n, int64_t* order) EXCLUDES(mu_);

  // Counters and latency percentiles (name, value).
  std::vector<std::pair<std::string, double>> Stats() EXCLUDES(mu_);

  const TableHeader& header() const { return h_; }
  const std::string& path() const { return path_; }
  const std::string& engine() const { return engine_; }
  bool direct_io() const { return direct_io_; }
  bool read_only() const { return read_only_; }
  const std::string& warning() const { return warning_; }

 private:
  BlockStore(std::string path, TableHeader h, Env* env);
  // Opens the devices, the log and the cache of a store not yet returned to the caller.
  Status OpenDevices(const StoreRuntimeOptions& runtime, bool read_only = false) REQUIRES(mu_);
  // Open and OpenReadOnly: the header and file checks, then the devices (and the map).
  static Status OpenExisting(const std::string& path, const StoreRuntimeOptions& runtime,
                             bool read_only, std::unique_ptr<BlockStore>* out);
  // Closed, or InvalidArgument on a read-only store: what a method needing the map says.
  Status CheckUsable() const REQUIRES(mu_);
  // OutOfRange unless [first, first + count) is inside [0, num_rows).
  Status CheckRowRange(uint64_t first, uint64_t count) const;
  // Appends the rows in [first, first + count) the location map names, ascending, to
  // `rows` (and their locations to `locations` unless null), a window of the map at a time.
  void MapEntries(uint64_t first, uint64_t count, std::vector<int64_t>* rows,
                  std::vector<uint64_t>* locations) const REQUIRES(mu_);
  // Releases the files without writing anything (a store that failed to open).
  void Abandon() EXCLUDES(mu_);
  // Drops the log, cache and devices and marks the store closed (writes nothing).
  void ReleaseLocked() REQUIRES(mu_);
  Status CheckIds(const int64_t* ids, size_t n) const;
  // `flush_beside`: write the log's queued segments on a helper thread while the disk
  // reads run, leaving the write's status there (Ok when nothing was queued).
  Status ReadLocked(const int64_t* ids, size_t n, uint8_t* out, Status* flush_beside = nullptr)
      REQUIRES(mu_);
  // `name_locations`: errors name the row and location (map value) they concern.
  Status ReadFromDisk(std::vector<std::pair<uint64_t, uint64_t>>* wanted,
                      const std::vector<uint8_t*>& dest, bool name_locations = false) REQUIRES(mu_);
  // How ReadFromDisk reads `blocks` (distinct, ascending): runs of `blocks` blocks
  // (aligned, inside one segment) read whole where enough of their blocks are wanted,
  // the other blocks one by one.
  struct LogRuns {
    uint32_t blocks = 0;  // blocks per run
    std::vector<uint64_t> offsets;  // byte offset of each run in the log
    std::vector<std::pair<size_t, size_t>> members;  // each run's [first, end) in `blocks`
    std::vector<size_t> singles;  // indexes in `blocks` read on their own
  };
  // Blocks per run (64 KiB of 4 KiB blocks): long enough for the device's sequential
  // bandwidth, short enough that a run a quarter wanted is worth reading whole.
  static constexpr uint32_t kRunBlocks = 16;
  LogRuns PlanLogRuns(const std::vector<uint64_t>& blocks) const REQUIRES(mu_);
  Status WriteLocked(const int64_t* ids, size_t n, const uint8_t* rows) REQUIRES(mu_);
  // In a loop at position i of n over rows at random (row_at(j): the row at position j),
  // asks for the location map's lines a few rows ahead (SegmentLog::PrefetchLocation):
  // each row's location is two dependent cache misses in a map of a large table.
  template <typename RowAt>
  void PrefetchLocations(size_t n, size_t i, RowAt row_at) const REQUIRES(mu_) {
    constexpr size_t kNear = 8, kFar = 16;
    if (i + kFar < n) {
      seg_log_->PrefetchLocation(row_at(i + kFar), row_at(i + kNear));
    } else if (i + kNear < n) {
      seg_log_->PrefetchLocation(row_at(i + kNear), row_at(i + kNear));
    }
  }
  Status FlushLocked() REQUIRES(mu_);
  Status InsertIntoCache(uint64_t row, const uint8_t* data, bool dirty) REQUIRES(mu_);

  const std::string path_;
  const TableHeader h_;
  Env* const env_;
  // Set by OpenDevices before Create/Open return the store; constant afterwards.
  std::string engine_, warning_;
  bool direct_io_ = false;
  bool read_only_ = false;

  FairMutex mu_;
  bool closed_ GUARDED_BY(mu_) = false;
  std::unique_ptr<FileLock> lock_ GUARDED_BY(mu_);  // a writable store's ownership lock
  std::unique_ptr<Device> meta_ GUARDED_BY(mu_), log_ GUARDED_BY(mu_);
  std::unique_ptr<SegmentLog> seg_log_ GUARDED_BY(mu_);
  std::unique_ptr<RowCache> cache_ GUARDED_BY(mu_);
  uint32_t read_window_ GUARDED_BY(mu_) = 128;  // extents in the read pipeline (buffers)
  std::vector<uint8_t*> hit_ptrs_ GUARDED_BY(mu_);  // scratch of ReadLocked
  uint64_t rows_read_ GUARDED_BY(mu_) = 0, rows_written_ GUARDED_BY(mu_) = 0;
  uint64_t cache_hits_ GUARDED_BY(mu_) = 0, cache_misses_ GUARDED_BY(mu_) = 0;
  uint64_t lazy_rows_ GUARDED_BY(mu_) = 0, disk_rows_ GUARDED_BY(mu_) = 0;
  uint64_t run_reads_ GUARDED_BY(mu_) = 0;  // dense stretches of the log read whole
  // Tags pinned by PinSnapshot -> the log's append count then (their entries are the
  // map's until anything is appended).
  std::map<uint64_t, uint64_t> snapshot_appends_ GUARDED_BY(mu_);
};

}  // namespace mtrains
