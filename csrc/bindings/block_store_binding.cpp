// TorchScript binding of BlockStore: torch.classes.mtrains.BlockStore.
//
// Data-path methods return a status tuple (code, errno, message) that
// torchrec_mtrains/storage/block_store.py turns into ValueError / IndexError / OSError /
// CorruptionError. Settings arrive as one Dict[str, str] built from a Python dataclass, so
// the boundary never carries a long positional list; unknown keys are rejected.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>

#include <unistd.h>

#include "bindings/block_store_handle.h"
#include "bindings/store_env.h"
#include "storage/block_store.h"
#include "storage/lazy_init.h"

namespace mtrains {
namespace {

using StatusTuple = std::tuple<int64_t, int64_t, std::string>;
using Config = c10::Dict<std::string, std::string>;

StatusTuple ToTuple(const Status& st) {
  return {static_cast<int64_t>(st.code()), st.sys_errno(), st.message()};
}

// Reads typed values out of a config dict, remembering the first error.
class ConfigReader {
 public:
  explicit ConfigReader(const Config& c) : c_(c) {}
  template <typename T>
  void Number(const char* key, T* out) {
    used_.push_back(key);
    auto it = c_.find(key);
    if (it == c_.end()) return;
    const std::string& v = it->value();
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
    if (ec != std::errc() || ptr != v.data() + v.size())
      Fail(std::string(key) + "='" + v + "' is not a valid number");
  }
  void Real(const char* key, double* out) {
    used_.push_back(key);
    auto it = c_.find(key);
    if (it == c_.end()) return;
    try {
      size_t pos = 0;
      *out = std::stod(it->value(), &pos);
      if (pos != it->value().size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      Fail(std::string(key) + "='" + it->value() + "' is not a valid number");
    }
  }
  void Flag(const char* key, bool* out) {
    uint32_t v = *out ? 1 : 0;
    Number(key, &v);
    *out = v != 0;
  }
  std::string Text(const char* key, const std::string& def) {
    used_.push_back(key);
    auto it = c_.find(key);
    return it == c_.end() ? def : it->value();
  }
  // Returns the first error, including keys that no reader asked for.
  Status Finish() {
    if (!status_.ok()) return status_;
    for (auto it = c_.begin(); it != c_.end(); ++it) {
      if (std::find(used_.begin(), used_.end(), it->key()) == used_.end())
        return Status::InvalidArgument("unknown setting '" + it->key() + "'");
    }
    return Status::Ok();
  }
  void Fail(const std::string& msg) {
    if (status_.ok()) status_ = Status::InvalidArgument(msg);
  }

 private:
  const Config& c_;
  std::vector<std::string> used_;
  Status status_;
};

void ReadRuntime(ConfigReader& r, StoreRuntimeOptions* o) {
  o->env = BindingStoreEnv();
  r.Real("dram_cache_mb", &o->dram_cache_mb);
  r.Flag("direct_io", &o->direct_io);
  const std::string engine = r.Text("io_engine", "auto");
  if (engine == "auto") o->engine = IoEngineKind::kAuto;
  else if (engine == "uring") o->engine = IoEngineKind::kUring;
  else if (engine == "threads") o->engine = IoEngineKind::kThreads;
  else r.Fail("io_engine='" + engine + "' must be 'auto', 'uring' or 'threads'");
  r.Number("queue_depth", &o->queue_depth);
  r.Number("io_threads", &o->io_threads);
  r.Number("read_chunk_blocks", &o->read_chunk_blocks);
}

// A config of runtime settings only (the opens of an existing table): every key used.
Status RuntimeOnly(const Config& config, StoreRuntimeOptions* o) {
  ConfigReader r(config);
  ReadRuntime(r, o);
  return r.Finish();
}

void ReadTable(ConfigReader& r, TableOptions* t) {
  r.Number("num_rows", &t->num_rows);
  r.Number("dim", &t->dim);
  r.Number("state_dim", &t->state_dim);
  const std::string dtype = r.Text("dtype", "float32");
  if (dtype == "float32") t->dtype = DType::kFloat32;
  else if (dtype == "float16") t->dtype = DType::kFloat16;
  else if (dtype == "bfloat16") t->dtype = DType::kBFloat16;
  else r.Fail("dtype='" + dtype + "' must be float32, float16 or bfloat16");
  r.Number("block_size", &t->block_size);
  r.Number("seed", &t->seed);
  r.Real("init_lo", &t->init_lo);
  r.Real("init_hi", &t->init_hi);
  r.Number("segment_blocks", &t->segment_blocks);
  r.Real("overprovision", &t->overprovision);
  const std::string stripes = r.Text("stripe_paths", "");
  t->stripe_paths.clear();
  size_t start = 0;
  while (start < stripes.size()) {  // newline-separated
    size_t end = stripes.find('\n', start);
    if (end == std::string::npos) end = stripes.size();
    t->stripe_paths.push_back(stripes.substr(start, end - start));
    start = end + 1;
  }
}

// Shortest text that parses back to exactly `v` (std::to_string keeps 6 decimals).
std::string ExactText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

at::ScalarType ScalarTypeOf(DType d) {
  switch (d) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
  }
  return at::kFloat;
}

class BlockStoreHandle : public torch::CustomClassHolder {
 public:
  // A store's I/O threads, io_uring rings, queued writes and file lock belong to the process
  // that opened it. A child forked from it (os.fork, a fork-started worker) gets a copy of
  // this object whose destructor would flush and commit through the parent's rings and join
  // threads the child does not have: the copy is leaked there instead, untouched.
  ~BlockStoreHandle() override {
    if (store_ != nullptr && getpid() != owner_pid_) (void)store_.release();
  }

  StatusTuple create(const std::string& path, Config config, bool overwrite) {
    ConfigReader r(config);
    TableOptions table;
    StoreRuntimeOptions runtime;
    ReadTable(r, &table);
    ReadRuntime(r, &runtime);
    Status st = r.Finish();
    if (st.ok()) st = BlockStore::Create(path, table, runtime, overwrite, &store_);
    return ToTuple(st);
  }

  StatusTuple open(const std::string& path, Config config) {
    StoreRuntimeOptions runtime;
    Status st = RuntimeOnly(config, &runtime);
    if (st.ok()) st = BlockStore::Open(path, runtime, &store_);
    return ToTuple(st);
  }

  StatusTuple open_read_only(const std::string& path, Config config) {
    StoreRuntimeOptions runtime;
    Status st = RuntimeOnly(config, &runtime);
    if (st.ok()) st = BlockStore::OpenReadOnly(path, runtime, &store_);
    return ToTuple(st);
  }

  // Opens a table whose map becomes exactly ids[i] -> locations[i] (BlockStore::OpenAdopted).
  StatusTuple open_adopted(const std::string& path, Config config, const at::Tensor& ids,
                           const at::Tensor& locations, int64_t pin_tag) {
    StoreRuntimeOptions runtime;
    Status st = RuntimeOnly(config, &runtime);
    if (st.ok()) st = CheckIds(ids);
    if (st.ok()) st = CheckLocations(locations, ids.numel());
    if (st.ok() && pin_tag < 0) st = Status::InvalidArgument("pin_tag=" + std::to_string(pin_tag) + " must be >= 0");
    if (st.ok())
      st = BlockStore::OpenAdopted(path, runtime, ids.data_ptr<int64_t>(), Locations(locations),
                                   ids.numel(), static_cast<uint64_t>(pin_tag), &store_);
    return ToTuple(st);
  }

  StatusTuple read_into(const at::Tensor& ids, const at::Tensor& out) {
    Status st = CheckIds(ids);
    if (st.ok()) st = CheckRows(out, ids.numel(), "out");
    if (st.ok())
      st = store().Read(ids.data_ptr<int64_t>(), ids.numel(),
                        static_cast<uint8_t*>(out.data_ptr()));
    return ToTuple(st);
  }

  // The permutation of `ids` that reads fastest (BlockStore::StorageOrder) into `order`
  // (int64, as many entries as ids).
  StatusTuple storage_order_into(const at::Tensor& ids, const at::Tensor& order) {
    Status st = CheckIds(ids);
    if (st.ok() && (order.scalar_type() != at::kLong || !order.is_contiguous() || order.dim() != 1 ||
                    order.numel() != ids.numel()))
      st = Status::InvalidArgument("order must be a contiguous 1-D int64 tensor of " +
                                   std::to_string(ids.numel()) + " entries");
    if (st.ok()) st = store().StorageOrder(ids.data_ptr<int64_t>(), ids.numel(), order.data_ptr<int64_t>());
    return ToTuple(st);
  }

  StatusTuple write(const at::Tensor& ids, const at::Tensor& rows) {
    Status st = CheckIds(ids);
    if (st.ok()) st = CheckRows(rows, ids.numel(), "rows");
    if (st.ok())
      st = store().Write(ids.data_ptr<int64_t>(), ids.numel(),
                         static_cast<const uint8_t*>(rows.data_ptr()));
    return ToTuple(st);
  }

  // write(write_ids, write_rows), then read_into(read_ids, out), their device I/O
  // overlapping (BlockStore::Exchange).
  StatusTuple exchange(const at::Tensor& write_ids, const at::Tensor& write_rows,
                       const at::Tensor& read_ids, const at::Tensor& out) {
    Status st = CheckIds(write_ids);
    if (st.ok()) st = CheckIds(read_ids);
    if (st.ok()) st = CheckRows(write_rows, write_ids.numel(), "write_rows");
    if (st.ok()) st = CheckRows(out, read_ids.numel(), "out");
    if (st.ok() && out.numel() > 0 && write_rows.numel() > 0) {
      const auto* o = static_cast<const uint8_t*>(out.data_ptr());
      const auto* w = static_cast<const uint8_t*>(write_rows.data_ptr());
      if (o < w + write_rows.nbytes() && w < o + out.nbytes())
        st = Status::InvalidArgument("out must not overlap write_rows");
    }
    if (st.ok())
      st = store().Exchange(write_ids.data_ptr<int64_t>(), write_ids.numel(),
                            static_cast<const uint8_t*>(write_rows.data_ptr()),
                            read_ids.data_ptr<int64_t>(), read_ids.numel(),
                            static_cast<uint8_t*>(out.data_ptr()));
    return ToTuple(st);
  }

  // The rows of [first, first + count) that may differ from their initial value, as an
  // ascending int64 tensor (BlockStore::WrittenRows): (status, ids), ids empty on error.
  std::tuple<StatusTuple, at::Tensor> written_rows(int64_t first, int64_t count) {
    std::vector<int64_t> rows;
    Status st = first >= 0 && count >= 0
                    ? store().WrittenRows(static_cast<uint64_t>(first), static_cast<uint64_t>(count), &rows)
                    : Status::OutOfRange(store().path() + ": row range from " + std::to_string(first) +
                                         " of " + std::to_string(count) + " rows is negative");
    at::Tensor ids = at::empty({static_cast<int64_t>(rows.size())}, at::TensorOptions().dtype(at::kLong));
    if (!rows.empty()) std::memcpy(ids.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
    return {ToTuple(st), ids};
  }

  // Pins (BlockStore::PinSnapshot and the rest); tags are >= 0 (checked by the caller).
  StatusTuple pin_snapshot(int64_t tag) { return ToTuple(store().PinSnapshot(static_cast<uint64_t>(tag))); }

  // The pinned snapshot's map entries in [first, first + count): (status, ids, locations).
  std::tuple<StatusTuple, at::Tensor, at::Tensor> snapshot_entries(int64_t tag, int64_t first, int64_t count) {
    std::vector<int64_t> rows;
    std::vector<uint64_t> locs;
    Status st = first >= 0 && count >= 0
                    ? store().SnapshotEntries(static_cast<uint64_t>(tag), static_cast<uint64_t>(first),
                                              static_cast<uint64_t>(count), &rows, &locs)
                    : Status::OutOfRange(store().path() + ": row range from " + std::to_string(first) +
                                         " of " + std::to_string(count) + " rows is negative");
    const auto opts = at::TensorOptions().dtype(at::kLong);
    at::Tensor ids = at::empty({static_cast<int64_t>(rows.size())}, opts);
    at::Tensor values = at::empty({static_cast<int64_t>(locs.size())}, opts);
    if (!rows.empty()) {
      std::memcpy(ids.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
      std::memcpy(values.data_ptr<int64_t>(), locs.data(), locs.size() * sizeof(uint64_t));
    }
    return {ToTuple(st), ids, values};
  }

  StatusTuple pin_locations(int64_t tag, const at::Tensor& locations) {
    Status st = CheckLocations(locations, locations.numel());
    if (st.ok())
      st = store().PinLocations(static_cast<uint64_t>(tag), Locations(locations), locations.numel());
    return ToTuple(st);
  }

  void unpin_snapshot(int64_t tag) { store().UnpinSnapshot(static_cast<uint64_t>(tag)); }

  std::vector<int64_t> pin_tags() {
    std::vector<int64_t> tags;
    for (uint64_t t : store().PinTags()) tags.push_back(static_cast<int64_t>(t));
    return tags;
  }

  // Reads the row versions at `locations` (map values) into `out` [n, dim + state_dim].
  StatusTuple read_locations_into(const at::Tensor& ids, const at::Tensor& locations, const at::Tensor& out) {
    Status st = CheckIds(ids);
    if (st.ok()) st = CheckLocations(locations, ids.numel());
    if (st.ok()) st = CheckRows(out, ids.numel(), "out");
    if (st.ok())
      st = store().ReadLocations(ids.data_ptr<int64_t>(), Locations(locations), ids.numel(),
                                 static_cast<uint8_t*>(out.data_ptr()));
    return ToTuple(st);
  }

  StatusTuple flush() { return ToTuple(store().Flush()); }
  StatusTuple snapshot(const std::string& dst) { return ToTuple(store().Snapshot(dst)); }
  StatusTuple close() {
    if (store_ != nullptr && getpid() != owner_pid_) {  // a forked child's copy: see the destructor
      (void)store_.release();
      return ToTuple(Status::Ok());
    }
    return ToTuple(store().Close());
  }

  c10::Dict<std::string, double> stats() {
    c10::Dict<std::string, double> d;
    for (const auto& [k, v] : store().Stats()) d.insert(k, v);
    return d;
  }

  // Table shape and how the store runs: header fields, engine, direct_io, warning.
  c10::Dict<std::string, std::string> info() {
    const TableHeader& h = store().header();
    c10::Dict<std::string, std::string> d;
    d.insert("path", store().path());
    d.insert("num_rows", std::to_string(h.num_rows));
    d.insert("dim", std::to_string(h.dim));
    d.insert("state_dim", std::to_string(h.state_dim));
    d.insert("dtype", DTypeName(h.dtype));
    d.insert("block_size", std::to_string(h.block_size));
    d.insert("seed", std::to_string(h.seed));
    d.insert("table_uuid", std::to_string(h.table_uuid));
    d.insert("init_lo", ExactText(h.init_lo));
    d.insert("init_hi", ExactText(h.init_hi));
    d.insert("segment_blocks", std::to_string(h.segment_blocks));
    d.insert("num_segments", std::to_string(h.num_segments));
    d.insert("rows_per_block", std::to_string(h.geometry.rows_per_block));
    d.insert("blocks_per_row", std::to_string(h.geometry.blocks_per_row));
    std::string stripes;
    for (const auto& s : h.stripe_paths) stripes += (stripes.empty() ? "" : "\n") + s;
    d.insert("stripe_paths", stripes);
    d.insert("io_engine", store().engine());
    d.insert("direct_io", store().direct_io() ? "1" : "0");
    d.insert("warning", store().warning());
    return d;
  }

 private:
  BlockStore& store() {
    TORCH_CHECK(store_ != nullptr, "BlockStore handle is not open");
    TORCH_CHECK(getpid() == owner_pid_, "this BlockStore was opened by process ", owner_pid_,
                "; a forked child cannot use it (its I/O rings, threads and file lock are the "
                "parent's): open the table in the child once the parent has closed it");
    return *store_;
  }
  static Status CheckIds(const at::Tensor& ids) {
    if (ids.device().type() != at::kCPU || ids.scalar_type() != at::kLong || ids.dim() != 1 ||
        !ids.is_contiguous())
      return Status::InvalidArgument("ids must be a contiguous 1-D int64 CPU tensor");
    return Status::Ok();
  }
  // Map values travel as int64 (non-negative: checked by the caller) and are read as uint64.
  static Status CheckLocations(const at::Tensor& t, int64_t n) {
    if (t.device().type() != at::kCPU || t.scalar_type() != at::kLong || t.dim() != 1 ||
        !t.is_contiguous() || t.numel() != n)
      return Status::InvalidArgument("locations must be a contiguous 1-D int64 CPU tensor of " +
                                     std::to_string(n) + " values");
    return Status::Ok();
  }
  static const uint64_t* Locations(const at::Tensor& t) {
    return reinterpret_cast<const uint64_t*>(t.data_ptr<int64_t>());
  }
  Status CheckRows(const at::Tensor& t, int64_t n, const char* name) {
    const TableHeader& h = store().header();
    const int64_t width = h.dim + h.state_dim;
    if (t.device().type() != at::kCPU || t.scalar_type() != ScalarTypeOf(h.dtype) ||
        t.dim() != 2 || t.size(0) != n || t.size(1) != width || !t.is_contiguous())
      return Status::InvalidArgument(std::string(name) + " must be a contiguous CPU tensor of " +
                                     DTypeName(h.dtype) + " with shape [" + std::to_string(n) +
                                     ", " + std::to_string(width) + "]");
    return Status::Ok();
  }

  std::unique_ptr<BlockStore> store_;
  const pid_t owner_pid_ = getpid();  // the process that made (and opens) this handle

  friend Status mtrains::BlockStoreOfHandle(const c10::IValue&, BlockStore**,
                                            c10::intrusive_ptr<c10::intrusive_ptr_target>*);
};

// Initial values of rows `ids` (as a never-written BlockStore row reads): [n, dim + state_dim].
at::Tensor LazyInitRows(const at::Tensor& ids, int64_t dim, int64_t state_dim, int64_t seed,
                        double lo, double hi, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1,
                    "ids must be a 1-D int64 CPU tensor");
  TORCH_CHECK_VALUE(dim >= 1 && state_dim >= 0, "dim must be >= 1 and state_dim >= 0");
  TORCH_CHECK_VALUE(lo <= hi, "init range lo=", lo, " must be <= hi=", hi);
  DType d;
  if (dtype == at::kFloat) d = DType::kFloat32;
  else if (dtype == at::kHalf) d = DType::kFloat16;
  else if (dtype == at::kBFloat16) d = DType::kBFloat16;
  else TORCH_CHECK_VALUE(false, "dtype ", dtype, " must be float32, float16 or bfloat16");
  const at::Tensor c = ids.contiguous();
  at::Tensor out = at::empty({c.numel(), dim + state_dim}, at::TensorOptions().dtype(dtype));
  const int64_t* p = c.data_ptr<int64_t>();
  const size_t row_bytes = static_cast<size_t>(dim + state_dim) * DTypeBytes(d);
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  at::parallel_for(0, c.numel(), 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      LazyInitRow(static_cast<uint64_t>(seed), static_cast<uint64_t>(p[i]), lo, hi,
                  static_cast<uint32_t>(dim), static_cast<uint32_t>(state_dim), d, o + i * row_bytes);
  });
  return out;
}

std::atomic<Env*> g_store_env{nullptr};

}  // namespace

Status BlockStoreOfHandle(const c10::IValue& handle, BlockStore** store,
                          c10::intrusive_ptr<c10::intrusive_ptr_target>* keep) {
  if (!handle.isObject() || handle.toObjectRef().slots().size() != 1 ||
      handle.type() != c10::getCustomClassType<c10::intrusive_ptr<BlockStoreHandle>>())
    return Status::InvalidArgument("expected a torch.classes.mtrains.BlockStore, got " + handle.type()->str());
  auto h = handle.toCustomClass<BlockStoreHandle>();
  if (h->store_ == nullptr) return Status::InvalidArgument("BlockStore handle is not open");
  if (getpid() != h->owner_pid_)
    return Status::InvalidArgument("this BlockStore was opened by process " + std::to_string(h->owner_pid_) +
                                   "; a forked child cannot use it");
  *store = h->store_.get();
  *keep = h;
  return Status::Ok();
}

Env* BindingStoreEnv() {
  Env* env = g_store_env.load(std::memory_order_acquire);
  return env != nullptr ? env : Env::Default();
}

void SetBindingStoreEnv(Env* env) { g_store_env.store(env, std::memory_order_release); }

}  // namespace mtrains

TORCH_LIBRARY(mtrains, m) {
  m.def("lazy_init_rows(Tensor ids, int dim, int state_dim, int seed, float lo, float hi, "
        "ScalarType dtype) -> Tensor");
  m.impl("lazy_init_rows", c10::DispatchKey::CPU, &mtrains::LazyInitRows);
  using mtrains::BlockStoreHandle;
  m.class_<BlockStoreHandle>("BlockStore")
      .def(torch::init<>(), "An empty handle; call create() or open().")
      .def("create", &BlockStoreHandle::create,
           "Creates a table file: (path, settings, overwrite) -> (code, errno, message).")
      .def("open", &BlockStoreHandle::open,
           "Opens an existing table file: (path, settings) -> (code, errno, message).")
      .def("open_read_only", &BlockStoreHandle::open_read_only,
           "Opens a table to read row versions by location only (read-only files, no map): "
           "(path, settings) -> status.")
      .def("open_adopted", &BlockStoreHandle::open_adopted,
           "Opens a table whose map becomes exactly the given entries, pinned under a tag: "
           "(path, settings, ids, locations, pin_tag) -> status.")
      .def("pin_snapshot", &BlockStoreHandle::pin_snapshot,
           "Flushes and pins the segments of every live row under a tag -> status.")
      .def("snapshot_entries", &BlockStoreHandle::snapshot_entries,
           "Map entries of a pinned snapshot in [first, first + count): "
           "(tag, first, count) -> (status, ids, locations).")
      .def("pin_locations", &BlockStoreHandle::pin_locations,
           "Pins the segments of map values under a tag: (tag, locations) -> status.")
      .def("unpin_snapshot", &BlockStoreHandle::unpin_snapshot, "Drops a tag's pins.")
      .def("pin_tags", &BlockStoreHandle::pin_tags, "The pinned tags.")
      .def("read_locations_into", &BlockStoreHandle::read_locations_into,
           "Reads the row versions at map values into out: (ids, locations, out) -> status.")
      .def("read_into", &BlockStoreHandle::read_into,
           "Reads rows `ids` into `out` [n, dim + state_dim] -> status.")
      .def("storage_order_into", &BlockStoreHandle::storage_order_into,
           "The order in which rows `ids` read fastest (in memory first, then by their place "
           "in the log): (ids, order) -> status.")
      .def("write", &BlockStoreHandle::write, "Writes rows [n, dim + state_dim] -> status.")
      .def("exchange", &BlockStoreHandle::exchange,
           "Writes rows (write_ids, write_rows), then reads read_ids into out, the device "
           "writes overlapping the reads -> status.")
      .def("written_rows", &BlockStoreHandle::written_rows,
           "Rows of [first, first + count) that may differ from their initial value: "
           "(first, count) -> (status, ascending int64 ids).")
      .def("flush", &BlockStoreHandle::flush, "Persists all dirty rows and fsyncs -> status.")
      .def("snapshot", &BlockStoreHandle::snapshot,
           "Writes a point-in-time copy of the table to a path -> status.")
      .def("close", &BlockStoreHandle::close, "Flushes and closes -> status.")
      .def("stats", &BlockStoreHandle::stats, "Counters and latency percentiles.")
      .def("info", &BlockStoreHandle::info, "Table shape, engine and fallback warnings.");
}
