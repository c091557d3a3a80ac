// RocksDB baseline for benchmarks/bench_store.py.
//
// A standalone program driven by torchrec_mtrains/benchmarks/baselines/rocksdb.py.
// It stores the same rows as the block store (key = 8-byte big-endian row id,
// value = one row: dim weights + state_dim state, `--value-bytes` bytes) and
// measures one phase per process, so every read phase starts with an empty block
// cache. With --direct-reads 1 the OS page cache cannot serve SST reads either.
//
// Build (the Python benchmark does this on demand into build/bench/):
//   g++ -O2 -std=c++17 rocksdb_bench.cc -o rocksdb_bench -lrocksdb -lpthread
//
// Phases:
//   load   Destroy + create the DB, write all rows in WriteBatches of --batch
//          rows (WAL disabled: a bulk load), then flush the memtable and run a
//          full manual compaction so reads see a steady-state LSM tree.
//   read   MultiGet of each --batch ids read from --ids-file (int64, native
//          endianness), each batch split into --threads contiguous slices, one
//          MultiGet per thread. Values are copied into one contiguous output
//          buffer (as the block store returns a tensor). Then, if
//          --warm-repeats R > 0, the last batch is read again R times
//          (served from the block cache as far as it holds it; with --row-cache-mb M
//          RocksDB's row cache of M MiB sits in front of the block cache).
//   write  One WriteBatch per --batch ids (values: fresh pseudo-random bytes),
//          WAL on. --sync-every-batch 1: WriteOptions.sync = true per batch
//          (durable per batch, like store.write + store.flush per batch);
//          0: unsynced writes, then one SyncWAL() at the end of the phase
//          (like writes followed by one store.flush). With --settle 1 the
//          memtable is then flushed and pending compactions are awaited;
//          that time and its bytes are reported separately (phase=write_settle).
//
// Output: one line per measurement, machine readable, e.g.
//   RESULT phase=read_cold rows=131072 batches=2 seconds=1.23 rows_per_s=... ...
// Errors go to stderr with exit status 1.

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/statistics.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

struct Args {
  std::string db;
  std::string phase;
  std::string ids_file;
  int64_t rows = 0;
  int64_t value_bytes = 516;
  int64_t batch = 65536;
  int threads = 8;
  double block_cache_mb = 52.0;
  double row_cache_mb = 0.0;
  int direct_reads = 1;
  int direct_io_flush = 1;
  int bloom_bits = 10;
  int warm_repeats = 0;
  int sync_every_batch = 1;
  int settle = 1;
  int verify = 1;
  uint64_t seed = 1;
};

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "rocksdb_bench: error: %s\n", msg.c_str());
  std::exit(1);
}

void Check(const rocksdb::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) Die("bad argument '" + k + "' (expected --key value)");
    kv[k.substr(2)] = argv[++i];
  }
  auto take = [&](const char* name, auto* dst) {
    auto it = kv.find(name);
    if (it == kv.end()) return;
    using T = std::remove_pointer_t<decltype(dst)>;
    try {
      if constexpr (std::is_same_v<T, std::string>) {
        *dst = it->second;
      } else if constexpr (std::is_same_v<T, double>) {
        *dst = std::stod(it->second);
      } else {
        *dst = static_cast<T>(std::stoll(it->second));
      }
    } catch (const std::exception&) {
      Die(std::string("bad value for --") + name + ": '" + it->second + "'");
    }
    kv.erase(it);
  };
  take("db", &a.db);
  take("phase", &a.phase);
  take("ids-file", &a.ids_file);
  take("rows", &a.rows);
  take("value-bytes", &a.value_bytes);
  take("batch", &a.batch);
  take("threads", &a.threads);
  take("block-cache-mb", &a.block_cache_mb);
  take("row-cache-mb", &a.row_cache_mb);
  take("direct-reads", &a.direct_reads);
  take("direct-io-flush", &a.direct_io_flush);
  take("bloom-bits", &a.bloom_bits);
  take("warm-repeats", &a.warm_repeats);
  take("sync-every-batch", &a.sync_every_batch);
  take("settle", &a.settle);
  take("verify", &a.verify);
  take("seed", &a.seed);
  if (!kv.empty()) Die("unknown option --" + kv.begin()->first);
  if (a.db.empty()) Die("--db is required");
  if (a.phase != "load" && a.phase != "read" && a.phase != "write")
    Die("--phase must be load|read|write, got '" + a.phase + "'");
  if (a.rows <= 0) Die("--rows must be > 0, got " + std::to_string(a.rows));
  if (a.value_bytes < 8) Die("--value-bytes must be >= 8, got " + std::to_string(a.value_bytes));
  if (a.batch <= 0) Die("--batch must be > 0, got " + std::to_string(a.batch));
  if (a.threads <= 0) Die("--threads must be > 0, got " + std::to_string(a.threads));
  if (a.phase != "load" && a.ids_file.empty()) Die("--ids-file is required for phase " + a.phase);
  return a;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds (user + system) of the whole process, all threads.
double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Bytes this process caused to be read from / written to the block layer (/proc/self/io).
struct ProcIo {
  int64_t read_bytes = 0;
  int64_t write_bytes = 0;
};

ProcIo ReadProcIo() {
  ProcIo io;
  std::ifstream f("/proc/self/io");
  std::string key;
  int64_t val = 0;
  while (f >> key >> val) {
    if (key == "read_bytes:") io.read_bytes = val;
    if (key == "write_bytes:") io.write_bytes = val;
  }
  return io;
}

void EncodeKey(int64_t id, char* out) {
  uint64_t v = static_cast<uint64_t>(id);
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

// Value of a row: the row id (8 bytes, native) then pseudo-random bytes.
void FillValue(int64_t id, uint64_t salt, char* out, int64_t n) {
  std::memcpy(out, &id, 8);
  uint64_t x = (static_cast<uint64_t>(id) + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
  for (int64_t i = 8; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out + i, &x, std::min<int64_t>(8, n - i));
  }
}

std::vector<int64_t> ReadIds(const Args& a) {
  std::ifstream f(a.ids_file, std::ios::binary | std::ios::ate);
  if (!f) Die("cannot open --ids-file '" + a.ids_file + "'");
  std::streamsize size = f.tellg();
  if (size % 8 != 0) Die("--ids-file '" + a.ids_file + "' size is not a multiple of 8");
  std::vector<int64_t> ids(size / 8);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(ids.data()), size);
  for (int64_t id : ids)
    if (id < 0 || id >= a.rows) Die("id " + std::to_string(id) + " out of range [0, --rows)");
  if (ids.size() < static_cast<size_t>(a.batch))
    Die("--ids-file holds " + std::to_string(ids.size()) + " ids, fewer than one --batch");
  return ids;
}

struct Db {
  std::unique_ptr<rocksdb::DB> db;
  std::shared_ptr<rocksdb::Statistics> stats;
  std::shared_ptr<rocksdb::Cache> cache;
};

Db OpenDb(const Args& a, bool fresh) {
  rocksdb::Options o;
  o.create_if_missing = fresh;
  o.error_if_exists = fresh;
  o.compression = rocksdb::kNoCompression;  // fp32 rows do not compress; the store does not compress
  o.use_direct_reads = a.direct_reads != 0;
  o.use_direct_io_for_flush_and_compaction = a.direct_io_flush != 0;
  o.max_open_files = -1;  // all table readers (index + filter) stay open: no table-cache misses
  o.max_background_jobs = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  o.IncreaseParallelism(std::max(2, static_cast<int>(std::thread::hardware_concurrency())));
  o.statistics = rocksdb::CreateDBStatistics();
  if (a.row_cache_mb > 0) o.row_cache = rocksdb::NewLRUCache(static_cast<size_t>(a.row_cache_mb * 1024.0 * 1024.0));
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 4096;
  auto cache_bytes = static_cast<size_t>(a.block_cache_mb * 1024.0 * 1024.0);
  t.block_cache = rocksdb::NewLRUCache(std::max<size_t>(cache_bytes, 1 << 20));
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(a.bloom_bits, false));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  if (fresh) {
    rocksdb::Status s = rocksdb::DestroyDB(a.db, o);
    if (!s.ok() && !s.IsNotFound()) Check(s, "DestroyDB " + a.db);
  }
  rocksdb::DB* raw = nullptr;
  Check(rocksdb::DB::Open(o, a.db, &raw), "DB::Open " + a.db);
  Db d;
  d.db.reset(raw);
  d.stats = o.statistics;
  d.cache = t.block_cache;
  return d;
}

void PrintResult(const std::string& phase, const std::vector<std::pair<std::string, double>>& fields) {
  std::printf("RESULT phase=%s", phase.c_str());
  for (const auto& [k, v] : fields) std::printf(" %s=%.9g", k.c_str(), v);
  std::printf("\n");
  std::fflush(stdout);
}

void WaitForCompactions(rocksdb::DB* db) {
  for (;;) {
    uint64_t pending = 0, running = 0, flushes = 0;
    db->GetIntProperty("rocksdb.compaction-pending", &pending);
    db->GetIntProperty("rocksdb.num-running-compactions", &running);
    db->GetIntProperty("rocksdb.num-running-flushes", &flushes);
    if (pending == 0 && running == 0 && flushes == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PhaseLoad(const Args& a) {
  Db d = OpenDb(a, /*fresh=*/true);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  std::vector<char> key(8), val(a.value_bytes);
  double t0 = Now(), c0 = CpuSeconds();
  for (int64_t start = 0; start < a.rows; start += a.batch) {
    rocksdb::WriteBatch wb;
    int64_t end = std::min(a.rows, start + a.batch);
    for (int64_t id = start; id < end; ++id) {
      EncodeKey(id, key.data());
      FillValue(id, a.seed, val.data(), a.value_bytes);
      wb.Put(rocksdb::Slice(key.data(), 8), rocksdb::Slice(val.data(), a.value_bytes));
    }
    Check(d.db->Write(wo, &wb), "Write (load)");
  }
  double t_put = Now() - t0;
  Check(d.db->Flush(rocksdb::FlushOptions()), "Flush (load)");
  rocksdb::CompactRangeOptions cro;
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  Check(d.db->CompactRange(cro, nullptr, nullptr), "CompactRange (load)");
  WaitForCompactions(d.db.get());
  double secs = Now() - t0;
  uint64_t sst_bytes = 0;
  d.db->GetIntProperty("rocksdb.total-sst-files-size", &sst_bytes);
  PrintResult("load", {{"rows", static_cast<double>(a.rows)},
                       {"seconds", secs},
                       {"put_seconds", t_put},
                       {"rows_per_s", a.rows / secs},
                       {"cpu_s", CpuSeconds() - c0},
                       {"sst_bytes", static_cast<double>(sst_bytes)}});
}

// Reads one batch with `threads` concurrent MultiGets; copies values into `out`.
// Returns the number of keys not found or with a wrong value (must be 0).
int64_t ReadBatch(const Args& a, rocksdb::DB* db, const int64_t* ids, int64_t n, char* out) {
  std::atomic<int64_t> errors{0};
  std::atomic<bool> hard_error{false};
  std::string first_error;
  auto work = [&](int64_t lo, int64_t hi) {
    int64_t m = hi - lo;
    if (m <= 0) return;
    std::vector<char> keybuf(m * 8);
    std::vector<rocksdb::Slice> keys(m);
    std::vector<rocksdb::PinnableSlice> vals(m);
    std::vector<rocksdb::Status> st(m);
    for (int64_t i = 0; i < m; ++i) {
      EncodeKey(ids[lo + i], keybuf.data() + 8 * i);
      keys[i] = rocksdb::Slice(keybuf.data() + 8 * i, 8);
    }
    rocksdb::ReadOptions ro;
    ro.verify_checksums = true;
    db->MultiGet(ro, db->DefaultColumnFamily(), m, keys.data(), vals.data(), st.data(), false);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (!st[i].ok() || vals[i].size() != static_cast<size_t>(a.value_bytes)) {
        ++bad;
        if (!st[i].ok() && !st[i].IsNotFound() && !hard_error.exchange(true)) first_error = st[i].ToString();
        continue;
      }
      char* dst = out + (lo + i) * a.value_bytes;
      std::memcpy(dst, vals[i].data(), a.value_bytes);
      if (a.verify) {
        int64_t got;
        std::memcpy(&got, dst, 8);
        if (got != ids[lo + i]) ++bad;
      }
    }
    errors += bad;
  };
  int t = static_cast<int>(std::min<int64_t>(a.threads, n));
  std::vector<std::thread> pool;
  int64_t per = (n + t - 1) / t;
  for (int i = 1; i < t; ++i) pool.emplace_back(work, i * per, std::min(n, (i + 1) * per));
  work(0, std::min(n, per));
  for (auto& th : pool) th.join();
  if (hard_error) Die("MultiGet: " + first_error);
  return errors;
}

void PhaseRead(const Args& a) {
  std::vector<int64_t> ids = ReadIds(a);
  int64_t nb = static_cast<int64_t>(ids.size()) / a.batch;
  double o0 = Now();
  Db d = OpenDb(a, /*fresh=*/false);
  double open_s = Now() - o0;
  std::vector<char> out(a.batch * a.value_bytes);
  auto* st = d.stats.get();
  auto measure = [&](const std::string& phase, int64_t first, int64_t count, bool repeat_same) {
    uint64_t h0 = st->getTickerCount(rocksdb::BLOCK_CACHE_DATA_HIT);
    uint64_t m0 = st->getTickerCount(rocksdb::BLOCK_CACHE_DATA_MISS);
    uint64_t rh0 = st->getTickerCount(rocksdb::ROW_CACHE_HIT);
    ProcIo io0 = ReadProcIo();
    double c0 = CpuSeconds(), t0 = Now(), best = 1e30;
    int64_t errors = 0;
    for (int64_t b = 0; b < count; ++b) {
      int64_t bi = repeat_same ? first : first + b;
      double tb = Now();
      errors += ReadBatch(a, d.db.get(), ids.data() + bi * a.batch, a.batch, out.data());
      best = std::min(best, Now() - tb);
    }
    double secs = Now() - t0;
    ProcIo io1 = ReadProcIo();
    uint64_t h = st->getTickerCount(rocksdb::BLOCK_CACHE_DATA_HIT) - h0;
    uint64_t m = st->getTickerCount(rocksdb::BLOCK_CACHE_DATA_MISS) - m0;
    uint64_t rh = st->getTickerCount(rocksdb::ROW_CACHE_HIT) - rh0;
    double rows = static_cast<double>(count * a.batch);
    PrintResult(phase, {{"rows", rows},
                        {"batches", static_cast<double>(count)},
                        {"seconds", secs},
                        {"rows_per_s", rows / secs},
                        {"best_batch_rows_per_s", a.batch / best},
                        {"cpu_s", CpuSeconds() - c0},
                        {"block_cache_hits", static_cast<double>(h)},
                        {"block_cache_misses", static_cast<double>(m)},
                        {"row_cache_hits", static_cast<double>(rh)},
                        {"row_cache_mb", a.row_cache_mb},
                        {"device_read_bytes", static_cast<double>(io1.read_bytes - io0.read_bytes)},
                        {"errors", static_cast<double>(errors)},
                        {"threads", static_cast<double>(a.threads)},
                        {"open_s", open_s}});
  };
  measure("read_cold", 0, nb, false);
  if (a.warm_repeats > 0) measure("read_warm", nb - 1, a.warm_repeats, true);
}

void PhaseWrite(const Args& a) {
  std::vector<int64_t> ids = ReadIds(a);
  int64_t nb = static_cast<int64_t>(ids.size()) / a.batch;
  Db d = OpenDb(a, /*fresh=*/false);
  auto* st = d.stats.get();
  auto ticker_bytes = [&]() {
    return st->getTickerCount(rocksdb::WAL_FILE_BYTES) + st->getTickerCount(rocksdb::FLUSH_WRITE_BYTES) +
           st->getTickerCount(rocksdb::COMPACT_WRITE_BYTES);
  };
  rocksdb::WriteOptions wo;
  wo.sync = a.sync_every_batch != 0;
  std::vector<char> key(8), val(a.value_bytes);
  uint64_t b0 = ticker_bytes();
  ProcIo io0 = ReadProcIo();
  double c0 = CpuSeconds(), t0 = Now();
  for (int64_t b = 0; b < nb; ++b) {
    rocksdb::WriteBatch wb;
    for (int64_t i = 0; i < a.batch; ++i) {
      int64_t id = ids[b * a.batch + i];
      EncodeKey(id, key.data());
      FillValue(id, a.seed + 1 + b, val.data(), a.value_bytes);
      wb.Put(rocksdb::Slice(key.data(), 8), rocksdb::Slice(val.data(), a.value_bytes));
    }
    Check(d.db->Write(wo, &wb), "Write");
  }
  if (!wo.sync) Check(d.db->SyncWAL(), "SyncWAL");
  double secs = Now() - t0, cpu = CpuSeconds() - c0;
  ProcIo io1 = ReadProcIo();
  uint64_t b1 = ticker_bytes();
  double rows = static_cast<double>(nb * a.batch);
  double payload = rows * a.value_bytes;
  PrintResult("write", {{"rows", rows},
                        {"batches", static_cast<double>(nb)},
                        {"seconds", secs},
                        {"rows_per_s", rows / secs},
                        {"cpu_s", cpu},
                        {"sync_every_batch", static_cast<double>(a.sync_every_batch)},
                        {"rocksdb_bytes_written", static_cast<double>(b1 - b0)},
                        {"device_write_bytes", static_cast<double>(io1.write_bytes - io0.write_bytes)},
                        {"write_amplification", (io1.write_bytes - io0.write_bytes) / payload}});
  if (a.settle) {
    double t1 = Now(), c1 = CpuSeconds();
    Check(d.db->Flush(rocksdb::FlushOptions()), "Flush (settle)");
    WaitForCompactions(d.db.get());
    double settle_s = Now() - t1;
    ProcIo io2 = ReadProcIo();
    uint64_t b2 = ticker_bytes();
    PrintResult("write_settle",
                {{"rows", rows},
                 {"seconds", settle_s},
                 {"total_seconds", secs + settle_s},
                 {"rows_per_s_incl_settle", rows / (secs + settle_s)},
                 {"cpu_s", CpuSeconds() - c1},
                 {"rocksdb_bytes_written", static_cast<double>(b2 - b0)},
                 {"device_write_bytes", static_cast<double>(io2.write_bytes - io0.write_bytes)},
                 {"write_amplification", (io2.write_bytes - io0.write_bytes) / payload}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a = ParseArgs(argc, argv);
  if (a.phase == "load") PhaseLoad(a);
  if (a.phase == "read") PhaseRead(a);
  if (a.phase == "write") PhaseWrite(a);
  return 0;
}
