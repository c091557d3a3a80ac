// BlockStore's create and open paths: validating the runtime options, creating the files
// (sparse, exclusively, locked before the header is written), reading and checking an
// existing table's header and files, and opening its devices, location map and row cache.
// The data path is in block_store.cc (block_store.h is the contract of both).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <random>

#include "common/aligned_buffer.h"
#include "storage/block_store.h"
#include "storage/block_store_internal.h"

namespace mtrains {
namespace {

using block_store_internal::kAlignment;
using block_store_internal::kWhat;

constexpr uint32_t kCacheOverheadBytes = 40; // per cached row: index, flags (estimate)

Status ValidateRuntime(const StoreRuntimeOptions& r) {
  if (!std::isfinite(r.dram_cache_mb) || r.dram_cache_mb < 0)
    return Status::InvalidArgument("dram_cache_mb=" + std::to_string(r.dram_cache_mb) +
                                   " must be a finite number >= 0");
  if (r.queue_depth < 1 || r.queue_depth > 4096)
    return Status::InvalidArgument("queue_depth=" + std::to_string(r.queue_depth) +
                                   " must be in [1, 4096]");
  if (r.io_threads < 1 || r.io_threads > 256)
    return Status::InvalidArgument("io_threads=" + std::to_string(r.io_threads) +
                                   " must be in [1, 256]");
  if (r.read_chunk_blocks < 1)
    return Status::InvalidArgument("read_chunk_blocks must be positive");
  return Status::Ok();
}

uint64_t StripeFileBytes(const TableHeader& h) {
  const uint64_t n = h.stripe_paths.size();
  return (h.num_segments + n - 1) / n * h.SegmentBytes();
}

Env* EnvOf(const StoreRuntimeOptions& r) { return r.env != nullptr ? r.env : Env::Default(); }

// Creates `path` exclusively with the given size (sparse), saying what a caller can do.
Status CreateTableFile(Env* env, const std::string& path, uint64_t size) {
  const Status st = env->CreateFile(path, size);
  if (st.ok() || st.code() != StatusCode::kIoError) return st;
  if (st.sys_errno() == EEXIST)
    return Status::IoError(EEXIST, path + " already exists (pass overwrite=True to replace it)");
  if (st.sys_errno() == ENOENT)
    return Status::IoError(ENOENT, "the directory of " + path + " does not exist");
  return st;
}

// What opening a table file that failed with `st` says.
Status OpenError(const Status& st, const std::string& path) {
  if (st.code() == StatusCode::kIoError && st.sys_errno() == ENOENT)
    return Status::IoError(ENOENT, "table file " + path + " does not exist");
  return st;
}

}  // namespace

BlockStore::BlockStore(std::string path, TableHeader h, Env* env)
    : path_(std::move(path)), h_(std::move(h)), env_(env) {}

Status BlockStore::Create(const std::string& path, const TableOptions& t,
                          const StoreRuntimeOptions& runtime, bool overwrite,
                          std::unique_ptr<BlockStore>* out) {
  MTRAINS_RETURN_IF_ERROR(ValidateRuntime(runtime));
  TableHeader h;
  h.num_rows = t.num_rows;
  h.dim = t.dim;
  h.state_dim = t.state_dim;
  h.dtype = t.dtype;
  h.block_size = t.block_size;
  h.seed = t.seed;
  h.init_lo = t.init_lo;
  h.init_hi = t.init_hi;
  h.segment_blocks = t.segment_blocks;
  h.stripe_paths = t.stripe_paths;
  std::random_device rd;
  do {
    h.table_uuid = (uint64_t(rd()) << 32) ^ rd();
  } while (h.table_uuid == 0);
  MTRAINS_RETURN_IF_ERROR(ComputeLayout(&h, t.overprovision));
  for (const auto& s : h.stripe_paths) {
    if (s.empty() || s == path)
      return Status::InvalidArgument("stripe path '" + s + "' must be non-empty and differ from " + path);
  }
  AlignedBuffer header(h.block_size, kAlignment);
  MTRAINS_RETURN_IF_ERROR(EncodeHeader(h, header.data()));
  std::vector<std::string> files{path};
  files.insert(files.end(), h.stripe_paths.begin(), h.stripe_paths.end());
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t j = i + 1; j < files.size(); ++j)
      if (files[i] == files[j]) return Status::InvalidArgument("file " + files[i] + " is named twice");
  Env* const env = EnvOf(runtime);
  if (overwrite) {
    for (const auto& f : files)
      MTRAINS_RETURN_IF_ERROR(env->CheckNotLocked(f, kWhat).WithContext("cannot overwrite " + f));
    for (const auto& f : files) MTRAINS_RETURN_IF_ERROR(env->RemoveFile(f));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const uint64_t size = i == 0 ? h.MainFileBytes() : StripeFileBytes(h);
    Status st = CreateTableFile(env, files[i], size);
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) (void)env->RemoveFile(files[j]);
      return st;
    }
  }
  // The ownership lock is taken before the header is written: an Open elsewhere between
  // the two is refused here, or gets the lock and this Create fails (never both writing).
  std::unique_ptr<FileLock> owned;
  Status st = env->LockFile(path, kWhat, &owned);
  if (st.ok()) st = env->WriteFileHead(path, header.data(), h.block_size);
  if (st.ok()) st = env->SyncDir(path);
  if (!st.ok()) {
    for (const auto& f : files) (void)env->RemoveFile(f);
    return st;
  }
  std::unique_ptr<BlockStore> store(new BlockStore(path, h, env));
  {
    FairMutexLock lock(&store->mu_);  // not shared yet: uncontended, and the analysis checks it
    store->lock_ = std::move(owned);
    MTRAINS_RETURN_IF_ERROR(store->OpenDevices(runtime));
  }
  *out = std::move(store);
  return Status::Ok();
}

Status BlockStore::Open(const std::string& path, const StoreRuntimeOptions& runtime,
                        std::unique_ptr<BlockStore>* out) {
  return OpenExisting(path, runtime, false, out);
}

Status BlockStore::OpenReadOnly(const std::string& path, const StoreRuntimeOptions& runtime,
                                std::unique_ptr<BlockStore>* out) {
  return OpenExisting(path, runtime, true, out);
}

Status BlockStore::OpenExisting(const std::string& path, const StoreRuntimeOptions& runtime,
                                bool read_only, std::unique_ptr<BlockStore>* out) {
  MTRAINS_RETURN_IF_ERROR(ValidateRuntime(runtime));
  Env* const env = EnvOf(runtime);
  // A writer owns the file until Close. A read-only reader takes no lock: it reads only
  // pinned segments, which the live store (holding the lock) never rewrites.
  std::unique_ptr<FileLock> owned;
  if (!read_only) MTRAINS_RETURN_IF_ERROR(OpenError(env->LockFile(path, kWhat, &owned), path));
  std::vector<uint8_t> buf(4096);
  size_t got = 0;
  TableHeader h;
  Status st = OpenError(env->ReadFileHead(path, buf.data(), buf.size(), &got), path);
  if (st.ok()) st = DecodeHeader(buf.data(), got, &h).WithContext(path);
  uint64_t size = 0;
  if (st.ok()) st = env->FileSize(path, &size);
  if (st.ok() && size < h.MainFileBytes())
    st = Status::FormatError(path + " is truncated: " + std::to_string(size) +
                             " bytes, the header needs " + std::to_string(h.MainFileBytes()));
  // Create sizes the file exactly; a longer one has a header that describes another
  // layout (the map journal, at the end, would be looked for in the wrong place).
  if (st.ok() && size > h.MainFileBytes())
    st = Status::FormatError(path + " is " + std::to_string(size) + " bytes, but the header describes " +
                             std::to_string(h.MainFileBytes()) + " (the header does not match the file)");
  for (size_t i = 0; st.ok() && i < h.stripe_paths.size(); ++i) {
    const std::string& s = h.stripe_paths[i];
    uint64_t stripe_size = 0;
    const Status there = env->FileSize(s, &stripe_size);
    if (!there.ok())
      st = Status::IoError(there.sys_errno(), "stripe file " + s + " of " + path + " is missing");
    else if (stripe_size < StripeFileBytes(h))
      st = Status::FormatError("stripe file " + s + " of " + path + " is truncated");
  }
  if (!st.ok()) return st;
  std::unique_ptr<BlockStore> store(new BlockStore(path, h, env));
  {
    FairMutexLock lock(&store->mu_);  // not shared yet: uncontended, and the analysis checks it
    store->lock_ = std::move(owned);
    store->read_only_ = read_only;
    MTRAINS_RETURN_IF_ERROR(store->OpenDevices(runtime, read_only));
    if (!read_only) MTRAINS_RETURN_IF_ERROR(store->seg_log_->LoadMap().WithContext(path));
  }
  *out = std::move(store);
  return Status::Ok();
}

Status BlockStore::OpenDevices(const StoreRuntimeOptions& runtime, bool read_only) {
  FileDeviceOptions meta;
  meta.read_only = read_only;
  meta.paths = {path_};
  meta.size = h_.MainFileBytes();  // header, map pages and (after the log) the map journal
  meta.alignment = kAlignment;
  meta.direct_io = runtime.direct_io;
  meta.engine = runtime.engine;
  meta.queue_depth = runtime.queue_depth;
  meta.io_threads = runtime.io_threads;
  FileDeviceOptions log = meta;
  log.paths = h_.stripe_paths.empty() ? std::vector<std::string>{path_} : h_.stripe_paths;
  log.base_offset = h_.stripe_paths.empty() ? h_.log_offset : 0;
  log.size = h_.LogBytes();
  log.stripe_unit = h_.SegmentBytes();
  FileDeviceOpenResult m = env_->OpenDevice(path_, DeviceRole::kMeta, meta);
  if (!m.status.ok()) return m.status;
  FileDeviceOpenResult l = env_->OpenDevice(path_, DeviceRole::kLog, log);
  if (!l.status.ok()) return l.status;
  engine_ = l.engine;
  direct_io_ = l.direct_io && m.direct_io;
  warning_ = l.warning.empty() ? m.warning : l.warning;
  meta_ = std::move(m.device);
  log_ = std::move(l.device);
  read_window_ = std::max<uint32_t>(runtime.read_chunk_blocks, 2 * runtime.queue_depth);
  if (read_only) return Status::Ok();  // no map, no log state, no cache
  try {
    seg_log_ = std::make_unique<SegmentLog>(h_, log_.get(), meta_.get());
    const double bytes = runtime.dram_cache_mb * 1048576.0;
    const uint64_t rows = std::min<uint64_t>(
        h_.num_rows, static_cast<uint64_t>(bytes / (h_.geometry.row_bytes + kCacheOverheadBytes)));
    cache_ = std::make_unique<RowCache>(rows, h_.geometry.row_bytes);
  } catch (const std::exception& e) {
    return Status::IoError(ENOMEM, path_ + ": " + e.what());
  }
  return Status::Ok();
}

}  // namespace mtrains
