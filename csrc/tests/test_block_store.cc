// Standalone driver (no torch, no Python) for the storage core: devices, the segment log
// and BlockStore, run plain and under ASan/UBSan and TSan by scripts/sanitize.sh.
//
// Usage: test_block_store [scratch_dir]   (default: $TMPDIR or /tmp)
// Exits 0 when every case passes; a failed CHECK aborts with file, line and message.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned_buffer.h"
#include "storage/block_format.h"
#include "storage/block_store.h"
#include "storage/device.h"
#include "storage/file_device.h"
#include "storage/lazy_init.h"
#include "storage/location_map.h"
#include "storage/segment_log.h"
#include "testing/fault_injecting_device.h"
#include "testing/fault_injecting_env.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::CodeName;
using testing::Run;

std::string g_dir;

// Row contents: word 0 = row id, word 1 = version, the rest a hash of both, so any row
// read back can be checked on its own (a torn or misplaced row fails the check).
constexpr uint32_t kDim = 6, kStateDim = 2, kRowBytes = (kDim + kStateDim) * 4;

uint32_t Mix32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
void FillRow(uint64_t row, uint32_t version, uint8_t* out) {
  uint32_t w[kRowBytes / 4];
  w[0] = static_cast<uint32_t>(row);
  w[1] = version;
  for (uint32_t i = 2; i < kRowBytes / 4; ++i) w[i] = Mix32(row * 1000003 + version * 31 + i);
  std::memcpy(out, w, kRowBytes);
}
// Returns the row's version, or -1 if the bytes are not a row written by FillRow.
int64_t VersionOf(uint64_t row, const uint8_t* data) {
  uint8_t want[kRowBytes];
  uint32_t version;
  std::memcpy(&version, data + 4, 4);
  FillRow(row, version, want);
  return std::memcmp(want, data, kRowBytes) == 0 ? int64_t(version) : -1;
}

std::string Path(const std::string& name) { return g_dir + "/" + name; }
void RemoveTable(const std::string& path) {
  unlink(path.c_str());
  for (int i = 0; i < 4; ++i) unlink((path + ".stripe" + std::to_string(i)).c_str());
}

// ------------------------------------------------------------------ devices ------------

void TestMemoryAndFaultDevice() {
  auto fdev = std::make_unique<FaultInjectingDevice>(std::make_unique<MemoryDevice>(64 * 4096, 4096));
  AlignedBuffer a(8192, 4096), b(8192, 4096);
  std::memset(a.data(), 0xAB, 8192);
  IoOp w{4096, a.data(), 8192};
  CHECK_OK(fdev->Write(&w, 1));
  IoOp r{4096, b.data(), 8192};
  CHECK_OK(fdev->Read(&r, 1));
  CHECK(std::memcmp(a.data(), b.data(), 8192) == 0) << "memory device lost a write";
  // Misaligned, past-the-end and overflowing extents are refused, not performed.
  IoOp bad{100, b.data(), 4096};
  CHECK_CODE(fdev->Read(&bad, 1), kInvalidArgument);
  IoOp past{63 * 4096, b.data(), 8192};
  CHECK_CODE(fdev->Read(&past, 1), kInvalidArgument);
  IoOp wrap{~0ull - 4095, b.data(), 8192};
  CHECK_CODE(fdev->Write(&wrap, 1), kInvalidArgument);
  // Scripted faults surface as statuses with the errno, then the device recovers.
  fdev->Arm(FaultKind::kWriteError, 1, 1, ENOSPC);
  CHECK_OK(fdev->Write(&w, 1));
  Status st = fdev->Write(&w, 1);
  CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == ENOSPC) << st.message();
  CHECK_OK(fdev->Write(&w, 1));
  fdev->Arm(FaultKind::kReadError, 0, 2, EIO);
  CHECK(fdev->Read(&r, 1).sys_errno() == EIO);
  CHECK(fdev->Read(&r, 1).sys_errno() == EIO);
  CHECK_OK(fdev->Read(&r, 1));
  fdev->Arm(FaultKind::kSyncError, 0, 1, EIO);
  CHECK_CODE(fdev->Sync(), kIoError);
  CHECK_OK(fdev->Sync());
  fdev->Arm(FaultKind::kCorruptRead, 0, 1, 0);
  CHECK_OK(fdev->Read(&r, 1));
  CHECK(std::memcmp(a.data(), b.data(), 8192) != 0) << "kCorruptRead did not flip a byte";
  // Streamed reads deliver every extent once, also with a fault armed (window path).
  std::vector<uint64_t> offs{0, 4096, 8192, 12288};
  for (int armed = 0; armed < 2; ++armed) {
    if (armed) fdev->Arm(FaultKind::kReadError, 100, 1, EIO);
    std::vector<int> seen(offs.size(), 0);
    CHECK_OK(fdev->ReadStream(offs.data(), offs.size(), 4096, 2, [&](size_t i, const uint8_t*) {
      ++seen[i];
      return Status::Ok();
    }));
    for (int s : seen) CHECK(s == 1);
    fdev->Disarm();
  }
}

// io_uring read streams over one file and over two striped ones: every block comes back
// with its own bytes, through the files and kept buffers the device registered with the
// kernel (where the kernel refuses, the device says why), also after a larger window made
// it allocate and register a larger pool.
void TestUringReadStream(bool striped) {
  constexpr uint64_t kBlocks = 96, kBlock = 4096;
  const std::string base = Path(striped ? "stream_striped" : "stream");
  std::vector<std::string> paths;
  for (int f = 0; f < (striped ? 2 : 1); ++f) paths.push_back(base + (striped ? ".stripe" + std::to_string(f) : ""));
  for (const std::string& path : paths) {
    const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0644);
    CHECK(fd >= 0 && ftruncate(fd, kBlocks * kBlock) == 0) << path;
    close(fd);
  }
  FileDeviceOptions o;
  o.paths = paths;
  o.size = kBlocks * kBlock;
  o.stripe_unit = striped ? 2 * kBlock : 0;
  o.engine = IoEngineKind::kUring;
  o.queue_depth = 8;
  FileDeviceOpenResult opened = OpenFileDevice(o);
  CHECK_OK(opened.status);
  AlignedBuffer data(kBlocks * kBlock, 4096);
  for (uint64_t i = 0; i < kBlocks * kBlock / 8; ++i) {
    const uint64_t word = Mix32(i) * 0x9E3779B97F4A7C15ull + i;
    std::memcpy(data.data() + i * 8, &word, 8);
  }
  IoOp all{0, data.data(), kBlocks * kBlock};
  CHECK_OK(opened.device->Write(&all, 1));
  std::vector<uint64_t> offsets;
  for (uint64_t b = 0; b < kBlocks; ++b) offsets.push_back(b * kBlock);
  std::shuffle(offsets.begin(), offsets.end(), std::mt19937_64(3));
  for (uint32_t window : {4u, 64u}) {
    std::vector<int> seen(kBlocks, 0);
    CHECK_OK(opened.device->ReadStream(offsets.data(), offsets.size(), kBlock, window,
                                       [&](size_t i, const uint8_t* block) {
                                         ++seen[i];
                                         CHECK(std::memcmp(block, data.data() + offsets[i], kBlock) == 0)
                                             << "block at " << offsets[i] << " read back wrong (window " << window
                                             << ")";
                                         return Status::Ok();
                                       }));
    for (int s : seen) CHECK(s == 1);
  }
  const std::string described = opened.device->Describe();
  const bool registered = described.find("fixed files, registered buffers)") != std::string::npos;
  const bool refused_by_a_limit = described.find("Operation not permitted") != std::string::npos ||
                                  described.find("Cannot allocate memory") != std::string::npos;
  CHECK(registered || refused_by_a_limit) << described;
  std::fprintf(stderr, "  %s\n", described.c_str());
  opened.device.reset();
  RemoveTable(base);
}

// --------------------------------------------------------------- segment log -----------

// The segment log on memory devices: rewrites every row many times (forcing garbage
// collection in a log with little spare space), commits, and reads each row back through
// its location, verifying blocks as BlockStore does.
void TestSegmentLogOnMemoryDevice() {
  TableHeader h;
  h.num_rows = 3000;
  h.dim = kDim;
  h.state_dim = kStateDim;
  h.segment_blocks = 8;
  h.table_uuid = 0x1234;
  CHECK_OK(ComputeLayout(&h, 0.3));
  MemoryDevice meta(h.MainFileBytes(), 4096), log(h.LogBytes(), 4096);
  SegmentLog seg(h, &log, &meta);
  std::mt19937_64 rng(7);
  std::vector<uint32_t> version(h.num_rows, 0);
  uint8_t row[kRowBytes];
  const uint64_t chunk = std::min<uint64_t>(seg.MaxReserve(), 200);
  for (int round = 0; round < 40; ++round) {
    CHECK_OK(seg.Reserve(chunk));
    for (uint64_t i = 0; i < chunk; ++i) {
      const uint64_t r = round < 15 ? (round * chunk + i) % h.num_rows : rng() % h.num_rows;
      FillRow(r, ++version[r], row);
      seg.Append(r, row);
    }
    if (round % 3 == 2) CHECK_OK(seg.Commit());
  }
  CHECK_OK(seg.Commit());
  CHECK(seg.counters().gc_segments_freed > 0) << "the test did not exercise garbage collection";
  const uint32_t B = h.block_size;
  const BlockGeometry& g = h.geometry;
  AlignedBuffer blocks(uint64_t(B) * g.blocks_per_row, 4096);
  for (uint64_t r = 0; r < h.num_rows; ++r) {
    const uint64_t loc = seg.Location(r);
    if (version[r] == 0) {
      CHECK(loc == 0);
      continue;
    }
    CHECK(loc != 0) << "row " << r << " lost";
    uint8_t out[kRowBytes];
    if (!seg.CopyBufferedRow(loc - 1, r, out)) {
      const uint64_t blk = g.BlockOfSlot(loc - 1);
      IoOp op{blk * B, blocks.data(), B * g.blocks_per_row};
      CHECK_OK(log.Read(&op, 1));
      CHECK_OK(VerifyLogBlock(blocks.data(), B, h.table_uuid, blk));
      CHECK_OK(GetRow(g, blocks.data(), loc - 1, r, out));
    }
    CHECK(VersionOf(r, out) == version[r]) << "row " << r << " reads version " << VersionOf(r, out)
                                           << ", wrote " << version[r];
  }
  CHECK(seg.counters().map_checkpoints > 0 && seg.counters().map_journal_commits > 0)
      << "the test did not exercise both the journal and checkpoints: " << seg.counters().map_checkpoints << " " << seg.counters().map_journal_commits << " " << seg.counters().commits;
  // A second log over the same devices (a reopen): checkpoint + journal give the same map.
  SegmentLog again(h, &log, &meta);
  CHECK_OK(again.LoadMap());
  for (uint64_t r = 0; r < h.num_rows; ++r)
    CHECK(again.Location(r) == seg.Location(r)) << "row " << r << " after reload: " << again.Location(r)
                                                  << " != " << seg.Location(r);
  CHECK(again.live_rows() == seg.live_rows());
}

// The map journal across simulated crashes: commits that end in a torn block are dropped
// whole; a damaged block followed by a later commit is Corruption naming its offset; a
// checkpoint empties the journal.
void TestMapJournal() {
  TableHeader h;
  h.num_rows = 50000;
  h.dim = kDim;
  h.state_dim = kStateDim;
  h.segment_blocks = 8;
  h.table_uuid = 0x4321;
  CHECK_OK(ComputeLayout(&h, 1.0));
  MemoryDevice meta(h.MainFileBytes(), 4096), log(h.LogBytes(), 4096);
  auto block_at = [&](uint64_t pos) { return h.journal_offset + kJournalBlockBytes * (1 + pos); };
  auto flip = [&](uint64_t off) {
    AlignedBuffer b(4096, 4096);
    IoOp op{off / 4096 * 4096, b.data(), 4096};
    CHECK_OK(meta.Read(&op, 1));
    b.data()[off % 4096 + 100] ^= 0x20;
    CHECK_OK(meta.Write(&op, 1));
  };
  uint8_t row[kRowBytes];
  std::vector<uint64_t> expect(h.num_rows, 0), after_first(h.num_rows, 0);
  {
    SegmentLog seg(h, &log, &meta);
    // Commit 1: 10 rows (one block). Commit 2: 3000 rows (several blocks).
    CHECK_OK(seg.Reserve(10));
    for (uint64_t r = 0; r < 10; ++r) FillRow(r * 7, 1, row), seg.Append(r * 7, row);
    CHECK_OK(seg.Commit());
    for (uint64_t r = 0; r < h.num_rows; ++r) after_first[r] = seg.Location(r);
    CHECK_OK(seg.Reserve(3000));
    for (uint64_t r = 0; r < 3000; ++r) FillRow(r * 13 + 1, 1, row), seg.Append(r * 13 + 1, row);
    CHECK_OK(seg.Commit());
    CHECK(seg.counters().map_journal_commits == 2 && seg.counters().map_checkpoints == 0);
    CHECK(seg.journal_bytes() >= 3 * kJournalBlockBytes) << seg.journal_bytes();
    for (uint64_t r = 0; r < h.num_rows; ++r) expect[r] = seg.Location(r);
  }
  const uint64_t blocks = [&] {
    SegmentLog s(h, &log, &meta);
    CHECK_OK(s.LoadMap());
    for (uint64_t r = 0; r < h.num_rows; ++r) CHECK(s.Location(r) == expect[r]) << "row " << r;
    return s.journal_bytes() / kJournalBlockBytes;
  }();
  // A torn last block: commit 2 is dropped whole, commit 1 stays.
  flip(block_at(blocks - 1));
  {
    SegmentLog s(h, &log, &meta);
    CHECK_OK(s.LoadMap());
    for (uint64_t r = 0; r < h.num_rows; ++r)
      CHECK(s.Location(r) == after_first[r]) << "row " << r << " after a torn tail";
  }
  flip(block_at(blocks - 1));
  // Damage to commit 1's block, with commit 2 after it: Corruption naming the offset.
  flip(block_at(0));
  {
    SegmentLog s(h, &log, &meta);
    const Status st = s.LoadMap();
    CHECK(st.code() == StatusCode::kCorruption) << CodeName(st.code()) << " " << st.message();
    CHECK(st.message().find(std::to_string(block_at(0))) != std::string::npos) << st.message();
  }
  flip(block_at(0));
  // A damaged descriptor is Corruption too (it names the epoch).
  {
    AlignedBuffer d(4096, 4096);
    EncodeJournalDescriptor(d.data(), h.table_uuid, 1);
    d.data()[50] ^= 1;
    IoOp op{h.journal_offset, d.data(), 4096};
    CHECK_OK(meta.Write(&op, 1));
    SegmentLog s(h, &log, &meta);
    CHECK(s.LoadMap().code() == StatusCode::kCorruption);
    std::memset(d.data(), 0, 4096);
    CHECK_OK(meta.Write(&op, 1));
  }
  // Many small commits until a checkpoint: the journal empties, and the map survives.
  {
    SegmentLog s(h, &log, &meta);
    CHECK_OK(s.LoadMap());
    std::mt19937_64 rng(3);
    for (int c = 0; c < 400 && s.counters().map_checkpoints == 0; ++c) {
      CHECK_OK(s.Reserve(50));
      for (int i = 0; i < 50; ++i) {
        const uint64_t r = rng() % h.num_rows;
        FillRow(r, 2, row);
        s.Append(r, row);
      }
      CHECK_OK(s.Commit());
    }
    CHECK(s.counters().map_checkpoints == 1) << s.counters().map_checkpoints;
    CHECK_OK(s.Reserve(5));
    for (uint64_t r = 0; r < 5; ++r) FillRow(r, 3, row), s.Append(r, row);
    CHECK_OK(s.Commit());
    CHECK_OK(s.SealJournal());
    CHECK(s.journal_bytes() == 2 * kJournalBlockBytes) << s.journal_bytes();
    for (uint64_t r = 0; r < h.num_rows; ++r) expect[r] = s.Location(r);
  }
  SegmentLog s(h, &log, &meta);
  CHECK_OK(s.LoadMap());
  for (uint64_t r = 0; r < h.num_rows; ++r) CHECK(s.Location(r) == expect[r]) << "row " << r << " after a checkpoint";
}

// ---------------------------------------------------------------- BlockStore -----------

struct Model {
  std::map<uint64_t, uint32_t> version;  // rows written, with their latest version
};

TableOptions SmallTable(uint64_t rows) {
  TableOptions t;
  t.num_rows = rows;
  t.dim = kDim;
  t.state_dim = kStateDim;
  t.segment_blocks = 4;
  t.overprovision = 0.3;
  return t;
}

void WriteRows(BlockStore* s, const std::vector<int64_t>& ids, Model* m) {
  std::vector<uint8_t> rows(ids.size() * kRowBytes);
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t v = ++m->version[ids[i]];
    FillRow(ids[i], v, rows.data() + i * kRowBytes);
  }
  CHECK_OK(s->Write(ids.data(), ids.size(), rows.data()));
}

void CheckAgainstModel(BlockStore* s, const Model& m, const char* when) {
  std::vector<int64_t> ids;
  for (const auto& [row, v] : m.version) ids.push_back(static_cast<int64_t>(row));
  std::vector<uint8_t> out(ids.size() * kRowBytes);
  CHECK_OK(s->Read(ids.data(), ids.size(), out.data()));
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t got = VersionOf(ids[i], out.data() + i * kRowBytes);
    CHECK(got == m.version.at(ids[i])) << when << ": row " << ids[i] << " reads version " << got
                                       << ", wrote " << m.version.at(ids[i]);
  }
}

double Stat(BlockStore* s, const std::string& name) {
  for (const auto& [k, v] : s->Stats())
    if (k == name) return v;
  CHECK(false) << "no stat " << name;
  return 0;
}

// Create, write (small cache: evictions), read, flush, reopen, rewrite until the
// collector runs, snapshot and open the snapshot; for one engine and layout.
void TestStoreRoundTrip(IoEngineKind engine, bool striped, double cache_mb) {
  const std::string path = Path(std::string("rt_") + (engine == IoEngineKind::kUring ? "uring" : "threads") +
                                (striped ? "_striped" : "") + (cache_mb > 0 ? "_cached" : ""));
  RemoveTable(path);
  RemoveTable(path + ".snap");
  TableOptions t = SmallTable(5000);
  if (striped) t.stripe_paths = {path + ".stripe0", path + ".stripe1"};
  StoreRuntimeOptions rt;
  rt.engine = engine;
  rt.dram_cache_mb = cache_mb;
  rt.queue_depth = 8;
  rt.io_threads = 3;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, t, rt, false, &s));
  CHECK(s->engine() == (engine == IoEngineKind::kUring ? "io_uring" : "threads")) << s->engine();
  Model m;
  std::mt19937_64 rng(11);
  for (int round = 0; round < 30; ++round) {
    std::vector<int64_t> ids(300);
    for (auto& id : ids) id = static_cast<int64_t>(round < 10 ? rng() % 5000 : rng() % 800);
    WriteRows(s.get(), ids, &m);
    if (round % 5 == 4) CHECK_OK(s->Flush());
    if (round % 3 == 0) CheckAgainstModel(s.get(), m, "before reopen");
  }
  // Rows never written read as their deterministic initial values, twice alike.
  std::vector<int64_t> fresh;
  for (int64_t r = 0; r < 5000 && fresh.size() < 50; ++r)
    if (!m.version.count(r)) fresh.push_back(r);
  std::vector<uint8_t> a(fresh.size() * kRowBytes), b(fresh.size() * kRowBytes);
  CHECK_OK(s->Read(fresh.data(), fresh.size(), a.data()));
  CHECK_OK(s->Read(fresh.data(), fresh.size(), b.data()));
  CHECK(a == b);
  // Out-of-range ids are refused before anything is read.
  const int64_t bad[2] = {1, 5000};
  CHECK_CODE(s->Read(bad, 2, a.data()), kOutOfRange);
  CHECK(Stat(s.get(), "gc_segments_freed") > 0) << "the test did not exercise garbage collection";
  CHECK_OK(s->Snapshot(path + ".snap"));
  WriteRows(s.get(), {1, 2, 3}, &m);  // after the snapshot: not in it
  CHECK_OK(s->Close());
  CHECK_CODE(s->Read(bad, 1, a.data()), kClosed);
  s.reset();
  CHECK_OK(BlockStore::Open(path, rt, &s));
  CheckAgainstModel(s.get(), m, "after reopen");
  s.reset();
  std::unique_ptr<BlockStore> snap;
  CHECK_OK(BlockStore::Open(path + ".snap", rt, &snap));
  Model before = m;
  for (int64_t r : {1, 2, 3}) --before.version[r];
  for (auto it = before.version.begin(); it != before.version.end();)
    it = it->second == 0 ? before.version.erase(it) : std::next(it);
  CheckAgainstModel(snap.get(), before, "snapshot");
  snap.reset();
  RemoveTable(path);
  RemoveTable(path + ".snap");
}

// Rows read in StorageOrder come off the log in runs (dense stretches read whole) and read
// exactly as the model says; sparse reads go block by block; damage inside a run reads as
// Corruption, never as rows.
void TestStorageOrderReads(IoEngineKind engine, bool striped) {
  const std::string path = Path(std::string("order_") + (engine == IoEngineKind::kUring ? "uring" : "threads") +
                                (striped ? "_striped" : ""));
  RemoveTable(path);
  constexpr int64_t kRows = 20000, kWritten = 19000;
  TableOptions t = SmallTable(kRows);
  t.segment_blocks = 32;  // runs of 16 blocks fit in a segment
  if (striped) t.stripe_paths = {path + ".stripe0", path + ".stripe1"};
  StoreRuntimeOptions rt;
  rt.engine = engine;
  rt.dram_cache_mb = 0;
  rt.queue_depth = 8;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, t, rt, false, &s));
  std::vector<int64_t> all(kRows);
  for (int64_t r = 0; r < kRows; ++r) all[r] = r;
  std::vector<int64_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(3));
  Model m;
  for (int64_t at = 0; at < kWritten; at += 1000)
    WriteRows(s.get(), std::vector<int64_t>(shuffled.begin() + at, shuffled.begin() + at + 1000), &m);
  CHECK_OK(s->Flush());

  std::vector<int64_t> order(kRows);
  CHECK_OK(s->StorageOrder(all.data(), all.size(), order.data()));
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == all) << "not a permutation";
  for (int64_t i = 0; i < kRows - kWritten; ++i)
    CHECK(!m.version.count(all[order[i]])) << "a written row before the unwritten ones at " << i;
  // The written rows follow in the order they were written (their places in the log).
  for (int64_t i = kRows - kWritten; i < kRows; ++i)
    CHECK(all[order[i]] == shuffled[i - (kRows - kWritten)]) << "position " << i;

  const double reads0 = Stat(s.get(), "device_reads"), runs0 = Stat(s.get(), "disk_run_reads");
  std::vector<uint8_t> out(2000 * kRowBytes);
  for (int64_t at = kRows - kWritten; at < kRows; at += 2000) {
    std::vector<int64_t> ids;
    for (int64_t i = at; i < std::min(kRows, at + 2000); ++i) ids.push_back(all[order[i]]);
    CHECK_OK(s->Read(ids.data(), ids.size(), out.data()));
    for (size_t i = 0; i < ids.size(); ++i)
      CHECK(VersionOf(ids[i], out.data() + i * kRowBytes) == m.version.at(ids[i])) << "row " << ids[i];
  }
  const uint64_t blocks = kWritten / s->header().geometry.rows_per_block;
  const double reads = Stat(s.get(), "device_reads") - reads0, runs = Stat(s.get(), "disk_run_reads") - runs0;
  CHECK(runs > 0 && reads * 4 < blocks) << reads << " device reads (" << runs << " runs) for " << blocks << " blocks";
  // One row of each stretch of 16 blocks: none dense enough for a run.
  std::vector<int64_t> sparse;
  const int64_t stride = 16 * int64_t(s->header().geometry.rows_per_block);
  for (int64_t i = 0; i < kWritten; i += stride) sparse.push_back(shuffled[i]);
  std::vector<uint8_t> sparse_out(sparse.size() * kRowBytes);
  const double runs1 = Stat(s.get(), "disk_run_reads");
  CHECK_OK(s->Read(sparse.data(), sparse.size(), sparse_out.data()));
  CHECK(Stat(s.get(), "disk_run_reads") == runs1);
  for (size_t i = 0; i < sparse.size(); ++i)
    CHECK(VersionOf(sparse[i], sparse_out.data() + i * kRowBytes) == m.version.at(sparse[i])) << "row " << sparse[i];
  const int64_t bad = kRows;
  CHECK_CODE(s->StorageOrder(&bad, 1, order.data()), kOutOfRange);

  // One flipped byte in a block inside a run: Corruption naming the file.
  const TableHeader h = s->header();
  CHECK_OK(s->Close());
  s.reset();
  if (!striped) {
    const int fd = open(path.c_str(), O_RDWR);
    CHECK(fd >= 0);
    const uint64_t off = h.log_offset + 40 * uint64_t(h.block_size) + 17;
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, off) == 1);
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, off) == 1);
    close(fd);
    CHECK_OK(BlockStore::Open(path, rt, &s));
    std::vector<int64_t> ordered(kWritten);
    CHECK_OK(s->StorageOrder(shuffled.data(), kWritten, order.data()));
    for (int64_t i = 0; i < kWritten; ++i) ordered[i] = shuffled[order[i]];
    std::vector<uint8_t> everything(kWritten * kRowBytes);
    const Status st = s->Read(ordered.data(), ordered.size(), everything.data());
    CHECK(st.code() == StatusCode::kCorruption && st.message().find(path) != std::string::npos)
        << CodeName(st.code()) << " " << st.message();
    CHECK(Stat(s.get(), "disk_run_reads") > 0);
    s.reset();
  }
  RemoveTable(path);
}

// Device errors surface as statuses and lose nothing; on-disk damage reads as Corruption,
// never as rows.
void TestStoreFaults(IoEngineKind engine) {
  const std::string path = Path(std::string("faults_") + (engine == IoEngineKind::kUring ? "uring" : "threads"));
  RemoveTable(path);
  FaultInjectingEnv env(Env::Default());  // the store's devices fail on command
  StoreRuntimeOptions rt;
  rt.engine = engine;
  rt.dram_cache_mb = 0;  // every read goes to the device
  rt.env = &env;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, SmallTable(2000), rt, false, &s));
  auto arm = [&](FaultKind kind, uint64_t after, uint64_t count, int err, bool on_map) {
    CHECK_OK(env.Arm(path, on_map ? DeviceRole::kMeta : DeviceRole::kLog, kind, after, count, err));
  };
  Model m;
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < 2000; r += 3) ids.push_back(r);
  WriteRows(s.get(), ids, &m);
  CHECK_OK(s->Flush());
  // A full disk on the log: the write or flush fails with ENOSPC, and after the disk has
  // room again, a flush persists everything that was accepted.
  arm(FaultKind::kWriteError, 0, 1000000, ENOSPC, false);
  Status st;
  for (int i = 0; i < 20 && st.ok(); ++i) {
    std::vector<int64_t> some(ids.begin(), ids.begin() + 200);
    std::vector<uint8_t> rows(some.size() * kRowBytes);
    for (size_t k = 0; k < some.size(); ++k) FillRow(some[k], ++m.version[some[k]], rows.data() + k * kRowBytes);
    st = s->Write(some.data(), some.size(), rows.data());
    if (st.ok()) st = s->Flush();
  }
  CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == ENOSPC) << CodeName(st.code()) << " " << st.message();
  CHECK(st.message().find(path) != std::string::npos) << "error does not name the file: " << st.message();
  arm(FaultKind::kWriteError, 0, 0, 0, false);  // count 0: disarm
  CHECK_OK(s->Flush());
  CheckAgainstModel(s.get(), m, "after ENOSPC");
  // A failing map write and a failing sync fail the flush; a retry succeeds.
  WriteRows(s.get(), {5, 6}, &m);
  arm(FaultKind::kWriteError, 0, 1, EIO, true);
  CHECK_CODE(s->Flush(), kIoError);
  CHECK_OK(s->Flush());
  WriteRows(s.get(), {7}, &m);
  arm(FaultKind::kSyncError, 0, 1, EIO, false);
  CHECK_CODE(s->Flush(), kIoError);
  CHECK_OK(s->Flush());
  // Read errors and corrupted reads.
  uint8_t out[kRowBytes];
  const int64_t one = 0;
  arm(FaultKind::kReadError, 0, 1, EIO, false);
  st = s->Read(&one, 1, out);
  CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == EIO) << st.message();
  arm(FaultKind::kCorruptRead, 0, 1, 0, false);
  CHECK_CODE(s->Read(&one, 1, out), kCorruption);
  CheckAgainstModel(s.get(), m, "after read faults");
  const TableHeader h = s->header();
  CHECK_OK(s->Close());
  s.reset();
  // Flip one byte of every data block of the log (it ends where the map journal starts): a
  // reopened store reports corruption for rows there and never returns their bytes.
  {
    const int fd = open(path.c_str(), O_RDWR);
    CHECK(fd >= 0);
    for (uint64_t off = h.log_offset; off + h.block_size <= h.journal_offset; off += h.block_size) {
      uint8_t byte;
      CHECK(pread(fd, &byte, 1, off + 17) == 1);
      byte ^= 0x10;
      CHECK(pwrite(fd, &byte, 1, off + 17) == 1);
    }
    close(fd);
  }
  CHECK_OK(BlockStore::Open(path, rt, &s));
  for (const auto& [row, v] : m.version) {
    const int64_t id = static_cast<int64_t>(row);
    st = s->Read(&id, 1, out);
    CHECK(st.code() == StatusCode::kCorruption) << "row " << row << ": " << CodeName(st.code());
    CHECK(st.message().find(path) != std::string::npos) << st.message();
  }
  s.reset();
  // Damage to the header or a map page is caught at open.
  for (uint64_t where : {uint64_t(100), h.map_offset + 8}) {
    const int fd = open(path.c_str(), O_RDWR);
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, where) == 1);
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, where) == 1);
    st = BlockStore::Open(path, rt, &s);
    CHECK(st.code() == StatusCode::kCorruption) << "flip at " << where << ": " << CodeName(st.code()) << " " << st.message();
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, where) == 1);
    close(fd);
  }
  // Truncated: a format error naming the file.
  CHECK(truncate(path.c_str(), h.log_offset / 2) == 0);
  st = BlockStore::Open(path, rt, &s);
  CHECK(st.code() == StatusCode::kFormatError && st.message().find(path) != std::string::npos) << st.message();
  RemoveTable(path);
}

// Readers, a writer, a flusher and a stats poller on one store at once (the store's one
// mutex serialises them; TSan checks the devices, the cache and the log underneath).
void TestStoreConcurrent(IoEngineKind engine) {
  const std::string path = Path(std::string("conc_") + (engine == IoEngineKind::kUring ? "uring" : "threads"));
  RemoveTable(path);
  StoreRuntimeOptions rt;
  rt.engine = engine;
  rt.dram_cache_mb = 0.02;  // ~500 rows of 2000: reads evict and write back
  rt.io_threads = 4;
  constexpr uint64_t kRows = 2000;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, SmallTable(kRows), rt, false, &s));
  std::vector<int64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = static_cast<int64_t>(r);
  std::vector<uint8_t> rows(kRows * kRowBytes);
  for (uint64_t r = 0; r < kRows; ++r) FillRow(r, 1, rows.data() + r * kRowBytes);
  CHECK_OK(s->Write(all.data(), kRows, rows.data()));
  // The writer publishes the latest version of each row after its write returns; a
  // reader must then see at least that version (never an older one, never a torn row).
  std::vector<std::atomic<uint32_t>> published(kRows);
  for (auto& p : published) p.store(1);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, writes{0}, flushes{0};
  auto reader = [&](int seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> ids(64);
    std::vector<uint8_t> out(ids.size() * kRowBytes);
    std::vector<uint32_t> floor(ids.size());
    while (!stop.load()) {
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int64_t>(rng() % kRows);
        floor[i] = published[ids[i]].load();
      }
      CHECK_OK(s->Read(ids.data(), ids.size(), out.data()));
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t v = VersionOf(ids[i], out.data() + i * kRowBytes);
        CHECK(v >= int64_t(floor[i])) << "row " << ids[i] << " read version " << v << " < published " << floor[i];
      }
      reads.fetch_add(1);
      // No pause: the store's mutex is first-come, first-served, so three readers in a
      // tight loop cannot starve the writer (with std::mutex they did, for minutes).
    }
  };
  std::thread writer([&] {
    std::mt19937_64 rng(99);
    std::vector<uint32_t> version(kRows, 1);
    std::vector<int64_t> ids(50);
    std::vector<uint8_t> buf(ids.size() * kRowBytes);
    for (int it = 0; it < 400; ++it) {
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int64_t>(rng() % kRows);
        FillRow(ids[i], ++version[ids[i]], buf.data() + i * kRowBytes);
      }
      CHECK_OK(s->Write(ids.data(), ids.size(), buf.data()));
      for (size_t i = 0; i < ids.size(); ++i) {
        uint32_t cur = published[ids[i]].load();
        const uint32_t v = version[ids[i]];
        while (cur < v && !published[ids[i]].compare_exchange_weak(cur, v)) {
        }
      }
      writes.fetch_add(1);
    }
    stop.store(true);
  });
  std::thread flusher([&] {
    while (!stop.load()) {
      CHECK_OK(s->Flush());
      flushes.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::thread poller([&] {
    while (!stop.load()) {
      CHECK(!s->Stats().empty());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::thread r1(reader, 1), r2(reader, 2), r3(reader, 3);
  writer.join();
  flusher.join();
  poller.join();
  r1.join();
  r2.join();
  r3.join();
  CHECK(reads.load() > 0 && flushes.load() > 0);
  std::fprintf(stderr, "         %llu reads, %llu writes, %llu flushes\n", (unsigned long long)reads.load(),
               (unsigned long long)writes.load(), (unsigned long long)flushes.load());
  // After a close and reopen, every row holds its last version.
  CHECK_OK(s->Close());
  s.reset();
  CHECK_OK(BlockStore::Open(path, rt, &s));
  std::vector<uint8_t> out(kRows * kRowBytes);
  CHECK_OK(s->Read(all.data(), kRows, out.data()));
  for (uint64_t r = 0; r < kRows; ++r)
    CHECK(VersionOf(r, out.data() + r * kRowBytes) == published[r].load()) << "row " << r;
  s.reset();
  RemoveTable(path);
}

// WrittenRows lists exactly the rows written (in the location map, dirty in the cache, or
// both), ascending, over ranges crossing the map's chunk boundaries; the rows it leaves out
// read as their initial values.
void CheckWrittenRows(BlockStore* s, const Model& m, uint64_t rows, const char* when) {
  constexpr uint64_t C = LocationMap::kChunkRows;
  const std::pair<uint64_t, uint64_t> ranges[] = {
      {0, 0}, {rows, rows}, {0, rows}, {C - 1, C + 1}, {C - 5, 2 * C + 5}, {2 * C, 3 * C}, {rows - 3, rows}};
  std::vector<int64_t> got;
  for (const auto& [lo, hi] : ranges) {
    CHECK_OK(s->WrittenRows(lo, hi - lo, &got));
    std::vector<int64_t> want;
    for (auto it = m.version.lower_bound(lo); it != m.version.end() && it->first < hi; ++it)
      want.push_back(static_cast<int64_t>(it->first));
    CHECK(got == want) << when << ": [" << lo << ", " << hi << ") lists " << got.size() << " rows, want "
                       << want.size();
  }
  CHECK_OK(s->WrittenRows(0, rows, &got));
  std::vector<int64_t> fresh;
  for (uint64_t r = 0, k = 0; r < rows; ++r) {
    if (k < got.size() && uint64_t(got[k]) == r) {
      ++k;
    } else {
      fresh.push_back(static_cast<int64_t>(r));
    }
  }
  std::vector<uint8_t> out(fresh.size() * kRowBytes), init(kRowBytes);
  CHECK_OK(s->Read(fresh.data(), fresh.size(), out.data()));
  const TableHeader& h = s->header();
  for (size_t i = 0; i < fresh.size(); ++i) {
    LazyInitRow(h.seed, fresh[i], h.init_lo, h.init_hi, h.dim, h.state_dim, h.dtype, init.data());
    CHECK(std::memcmp(init.data(), out.data() + i * kRowBytes, kRowBytes) == 0)
        << when << ": unlisted row " << fresh[i] << " does not read as its initial value";
  }
}

// `cache_mb`: 0 (rows only in the map), small (both), large (only in the cache until the
// flush). A range past the table is OutOfRange; a closed store, Closed.
void TestWrittenRows(double cache_mb) {
  const std::string path = Path("written_" + std::to_string(static_cast<int>(cache_mb * 100)));
  RemoveTable(path);
  constexpr uint64_t kRows = 3 * LocationMap::kChunkRows + 500;
  StoreRuntimeOptions rt;
  rt.dram_cache_mb = cache_mb;
  rt.io_threads = 2;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, SmallTable(kRows), rt, false, &s));
  Model m;
  CheckWrittenRows(s.get(), m, kRows, "new table");
  std::mt19937_64 rng(5);
  auto write_some = [&](size_t n) {
    std::vector<int64_t> ids(n);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % kRows);
    ids.insert(ids.end(), {0, int64_t(LocationMap::kChunkRows), int64_t(kRows - 1), ids[0], ids[1]});
    WriteRows(s.get(), ids, &m);
  };
  write_some(1500);
  CHECK((Stat(s.get(), "cache_dirty_rows") > 0) == (cache_mb > 0));
  CheckWrittenRows(s.get(), m, kRows, "written");
  CHECK_OK(s->Flush());
  CheckWrittenRows(s.get(), m, kRows, "flushed");
  write_some(800);
  CheckWrittenRows(s.get(), m, kRows, "rewritten");
  std::vector<int64_t> got;
  CHECK_CODE(s->WrittenRows(kRows - 2, 3, &got), kOutOfRange);
  CHECK_CODE(s->WrittenRows(kRows + 1, 0, &got), kOutOfRange);
  CHECK_CODE(s->WrittenRows(5, ~uint64_t(0), &got), kOutOfRange);
  CHECK_OK(s->Close());
  CHECK_CODE(s->WrittenRows(0, 1, &got), kClosed);
  s.reset();
  CHECK_OK(BlockStore::Open(path, rt, &s));
  CheckWrittenRows(s.get(), m, kRows, "reopened");
  s.reset();
  RemoveTable(path);
}


// Versions of rows `ids` read back at `locations` (ReadLocations), -1 where not FillRow's.
std::vector<int64_t> VersionsAt(BlockStore* s, const std::vector<int64_t>& ids,
                                const std::vector<uint64_t>& locations) {
  std::vector<uint8_t> out(ids.size() * kRowBytes);
  CHECK_OK(s->ReadLocations(ids.data(), locations.data(), ids.size(), out.data()));
  std::vector<int64_t> v(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) v[i] = VersionOf(ids[i], out.data() + i * kRowBytes);
  return v;
}

std::string FileBytes(const std::string& path) {
  std::string bytes;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CHECK(fd >= 0) << path;
  char buf[1 << 16];
  for (ssize_t r; (r = read(fd, buf, sizeof(buf))) > 0;) bytes.append(buf, static_cast<size_t>(r));
  close(fd);
  return bytes;
}

// A pinned snapshot survives rewrites with the collector running and unpinning gives its
// space back; a read-only reader writes nothing; OpenAdopted restores a snapshot.
void TestPinnedSnapshot() {
  const std::string path = Path("pins");
  RemoveTable(path);
  constexpr uint64_t kRows = 2000;
  TableOptions t = SmallTable(kRows);
  t.segment_blocks = 2;
  t.overprovision = 2.0;
  StoreRuntimeOptions rt;
  rt.dram_cache_mb = 0;
  rt.io_threads = 2;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, t, rt, false, &s));
  Model m;
  std::vector<int64_t> all(kRows);
  for (uint64_t r = 0; r < kRows; ++r) all[r] = static_cast<int64_t>(r);
  WriteRows(s.get(), all, &m);  // version 1
  CHECK_OK(s->PinSnapshot(1));
  std::vector<int64_t> ids, scratch_ids;
  std::vector<uint64_t> locs, scratch_locs;
  CHECK_OK(s->SnapshotEntries(1, 0, kRows, &ids, &locs));
  CHECK(ids == all) << ids.size();
  CHECK_CODE(s->SnapshotEntries(1, 1, kRows, &scratch_ids, &scratch_locs), kOutOfRange);
  CHECK_CODE(s->SnapshotEntries(2, 0, kRows, &scratch_ids, &scratch_locs), kInvalidArgument);
  for (int round = 0; round < 4; ++round) {
    WriteRows(s.get(), all, &m);
    CHECK_OK(s->Flush());
  }
  const Status refused = s->SnapshotEntries(1, 0, kRows, &scratch_ids, &scratch_locs);
  CHECK(refused.code() == StatusCode::kInvalidArgument && refused.message().find("tag 1") != std::string::npos)
      << refused.message();
  CHECK(Stat(s.get(), "gc_segments_freed") > 0) << "the collector did not run";
  CHECK(Stat(s.get(), "retained_segments") > 0 && Stat(s.get(), "pinned_segments") > 0);
  for (int64_t v : VersionsAt(s.get(), ids, locs)) CHECK(v == 1) << "a pinned row reads version " << v;
  std::vector<int64_t> bad_ids = ids;
  bad_ids[3] = 4;
  std::vector<uint8_t> out(kRows * kRowBytes);
  const Status wrong = s->ReadLocations(bad_ids.data(), locs.data(), kRows, out.data());
  CHECK(wrong.code() == StatusCode::kCorruption &&
        wrong.message().find("row 4 at location " + std::to_string(locs[3])) != std::string::npos)
      << wrong.message();
  uint64_t zero = 0;
  CHECK_CODE(s->ReadLocations(ids.data(), &zero, 1, out.data()), kInvalidArgument);

  // Unpinned, the retained segments are free after the next commit.
  const double free_before = Stat(s.get(), "free_segments");
  s->UnpinSnapshot(1);
  CHECK(s->PinTags().empty());
  CHECK_OK(s->Flush());
  CHECK(Stat(s.get(), "retained_segments") == 0 && Stat(s.get(), "pinned_segments") == 0);
  CHECK(Stat(s.get(), "free_segments") > free_before);

  // A snapshot of the current rows, then rewrites of half of them; a read-only reader
  // of the closed file sees the snapshot and leaves the file as it was.
  CHECK_OK(s->PinSnapshot(7));
  std::vector<uint32_t> snap_version(kRows);
  for (uint64_t r = 0; r < kRows; ++r) snap_version[r] = m.version[r];
  CHECK_OK(s->SnapshotEntries(7, 0, kRows, &ids, &locs));
  std::vector<int64_t> half(all.begin(), all.begin() + kRows / 2);
  for (int round = 0; round < 3; ++round) {
    WriteRows(s.get(), half, &m);
    CHECK_OK(s->Flush());
  }
  CHECK_OK(s->Close());
  s.reset();
  const std::string before = FileBytes(path);
  CHECK_OK(BlockStore::OpenReadOnly(path, rt, &s));
  std::vector<int64_t> got = VersionsAt(s.get(), ids, locs);
  for (uint64_t r = 0; r < kRows; ++r) CHECK(got[r] == snap_version[r]) << "row " << r;
  CHECK_CODE(s->Write(all.data(), 1, out.data()), kInvalidArgument);
  CHECK_CODE(s->Read(all.data(), 1, out.data()), kInvalidArgument);
  CHECK_CODE(s->PinSnapshot(1), kInvalidArgument);
  CHECK_OK(s->Close());
  s.reset();
  CHECK(FileBytes(path) == before) << "the read-only reader changed the file";

  // Adopting the snapshot: the entries, and only them, after a plain Open too.
  std::vector<int64_t> unsorted = ids;
  std::swap(unsorted[0], unsorted[1]);
  CHECK_CODE(BlockStore::OpenAdopted(path, rt, unsorted.data(), locs.data(), kRows, 7, &s), kInvalidArgument);
  CHECK(FileBytes(path) == before);
  const size_t keep = kRows - 10;  // the last rows go back to never written
  CHECK_OK(BlockStore::OpenAdopted(path, rt, ids.data(), locs.data(), keep, 7, &s));
  CHECK(s->PinTags() == std::vector<uint64_t>{7});
  for (int round = 0; round < 3; ++round) {  // writes go on without touching the snapshot
    WriteRows(s.get(), half, &m);
    CHECK_OK(s->Flush());
  }
  got = VersionsAt(s.get(), std::vector<int64_t>(ids.begin(), ids.begin() + keep),
                   std::vector<uint64_t>(locs.begin(), locs.begin() + keep));
  for (uint64_t r = 0; r < keep; ++r) CHECK(got[r] == snap_version[r]) << "row " << r;
  s.reset();
  CHECK_OK(BlockStore::OpenAdopted(path, rt, ids.data(), locs.data(), keep, 7, &s));
  s.reset();
  CHECK_OK(BlockStore::Open(path, rt, &s));
  std::vector<int64_t> written;
  CHECK_OK(s->WrittenRows(0, kRows, &written));
  CHECK(written == std::vector<int64_t>(all.begin(), all.begin() + keep)) << written.size();
  CHECK_OK(s->Read(all.data(), kRows, out.data()));
  for (uint64_t r = 0; r < keep; ++r)
    CHECK(VersionOf(r, out.data() + r * kRowBytes) == snap_version[r]) << "row " << r;
  s.reset();
  RemoveTable(path);
}

// Pins that keep every dead segment leave the collector no victim: writes go on in
// never-used segments, and only a log with none left fails (ENOSPC naming the pins).
void TestPinsFillTheLog() {
  const std::string path = Path("pins_full");
  RemoveTable(path);
  constexpr uint64_t kRows = 3000;
  TableOptions t = SmallTable(kRows);
  t.segment_blocks = 2;
  t.overprovision = 1.0;
  StoreRuntimeOptions rt;
  rt.dram_cache_mb = 0;
  rt.io_threads = 2;
  std::unique_ptr<BlockStore> s;
  CHECK_OK(BlockStore::Create(path, t, rt, false, &s));
  std::vector<int64_t> hot(300);
  for (size_t i = 0; i < hot.size(); ++i) hot[i] = static_cast<int64_t>(i * 7);
  std::vector<uint8_t> rows(hot.size() * kRowBytes);
  Status st;
  uint64_t tag = 0;
  for (; tag < 10000; ++tag) {
    for (size_t i = 0; i < hot.size(); ++i) FillRow(hot[i], static_cast<uint32_t>(tag), rows.data() + i * kRowBytes);
    st = s->Write(hot.data(), hot.size(), rows.data());
    if (!st.ok()) break;
    CHECK_OK(s->PinSnapshot(tag));
  }
  CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == ENOSPC) << st.message();
  CHECK(st.message().find("pinned") != std::string::npos) << st.message();
  const double segments = Stat(s.get(), "log_segments");
  CHECK(Stat(s.get(), "free_segments") <= 2 && Stat(s.get(), "pinned_segments") >= segments - 4)
      << "gave up with " << Stat(s.get(), "free_segments") << " free segments of " << segments;
  for (uint64_t k = 0; k < tag; ++k) s->UnpinSnapshot(k);
  CHECK_OK(s->Flush());
  CHECK_OK(s->Write(hot.data(), hot.size(), rows.data()));
  CHECK_OK(s->Close());
  s.reset();
  RemoveTable(path);
}

// ------------------------------------------------------------------ ownership ----------

// A store open for writing owns its main file: a second writable open, an overwriting
// Create and a Snapshot onto it are refused with EWOULDBLOCK naming the file and this
// process, and leave the rows intact; a read-only reader shares the file; Close frees it.
void TestOwnership() {
  const std::string path = Path("owned"), other = Path("owned_other");
  RemoveTable(path);
  RemoveTable(other);
  StoreRuntimeOptions rt;
  rt.engine = IoEngineKind::kThreads;
  std::unique_ptr<BlockStore> s, again;
  CHECK_OK(BlockStore::Create(path, SmallTable(100), rt, false, &s));
  std::vector<int64_t> ids{3, 7};
  std::vector<uint8_t> rows(ids.size() * kRowBytes), out(rows.size());
  for (size_t i = 0; i < ids.size(); ++i) FillRow(ids[i], 5, rows.data() + i * kRowBytes);
  CHECK_OK(s->Write(ids.data(), ids.size(), rows.data()));
  const std::string pid = "this process (pid " + std::to_string(getpid()) + ")";
  auto refused = [&](const Status& st, const char* what) {
    CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == EWOULDBLOCK)
        << what << ": " << CodeName(st.code()) << " errno " << st.sys_errno() << ": " << st.message();
    CHECK(st.message().find(path) != std::string::npos && st.message().find(pid) != std::string::npos)
        << what << ": " << st.message();
  };
  refused(BlockStore::Open(path, rt, &again), "second open");
  CHECK(again == nullptr);
  refused(BlockStore::Create(path, SmallTable(100), rt, true, &again), "overwriting create");
  std::unique_ptr<BlockStore> o;
  CHECK_OK(BlockStore::Create(other, SmallTable(100), rt, false, &o));
  refused(o->Snapshot(path), "snapshot onto it");
  CHECK_OK(BlockStore::OpenReadOnly(path, rt, &again));  // readers share the file
  CHECK_OK(again->Close());
  again.reset();
  CHECK_OK(s->Read(ids.data(), ids.size(), out.data()));
  CHECK(out == rows);
  CHECK_OK(s->Close());  // frees the file
  CHECK_OK(BlockStore::Open(path, rt, &again));
  CHECK_OK(again->Read(ids.data(), ids.size(), out.data()));
  CHECK(out == rows);
  refused(BlockStore::Create(path, SmallTable(100), rt, true, &s), "overwrite after reopen");
  again.reset();  // the destructor closes, which frees it too
  CHECK_OK(BlockStore::Create(path, SmallTable(100), rt, true, &s));
  s.reset();
  o.reset();
  RemoveTable(path);
  RemoveTable(other);
}

}  // namespace
}  // namespace mtrains

int main(int argc, char** argv) {
  using namespace mtrains;
  const char* tmp = std::getenv("TMPDIR");
  g_dir = argc > 1 ? argv[1] : (tmp != nullptr ? tmp : "/tmp");
  Run("devices: memory + fault injection", TestMemoryAndFaultDevice);
  Run("segment log on memory devices (GC)", TestSegmentLogOnMemoryDevice);
  Run("map journal: torn tail, damage, checkpoint", TestMapJournal);
  Run("written rows, no cache", [] { TestWrittenRows(0); });
  Run("written rows, small cache", [] { TestWrittenRows(0.05); });
  Run("written rows, large cache", [] { TestWrittenRows(4); });
  Run("pinned snapshot: rewrites, unpin, read-only reader, adopt", TestPinnedSnapshot);
  Run("pins fill the log", TestPinsFillTheLog);
  Run("ownership: one writable open per table file", TestOwnership);
  Run("io_uring read stream, registered files and buffers", [] { TestUringReadStream(false); });
  Run("io_uring read stream, registered, striped", [] { TestUringReadStream(true); });
  for (IoEngineKind e : {IoEngineKind::kUring, IoEngineKind::kThreads}) {
    const char* name = e == IoEngineKind::kUring ? "io_uring" : "threads";
    std::fprintf(stderr, "--- engine %s\n", name);
    Run("store round trip", [&] { TestStoreRoundTrip(e, false, 0.05); });
    Run("store round trip, no cache", [&] { TestStoreRoundTrip(e, false, 0); });
    Run("store round trip, striped", [&] { TestStoreRoundTrip(e, true, 0.05); });
    Run("store faults", [&] { TestStoreFaults(e); });
    Run("storage-order reads: runs, sparse reads, damage", [&] { TestStorageOrderReads(e, false); });
    Run("storage-order reads, striped", [&] { TestStorageOrderReads(e, true); });
    Run("store concurrent readers/writer/flusher", [&] { TestStoreConcurrent(e); });
  }
  std::fprintf(stderr, "test_block_store: all passed\n");
  return 0;
}
