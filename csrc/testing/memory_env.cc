#include "testing/memory_env.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/aligned_buffer.h"

namespace mtrains {
namespace {

constexpr uint32_t kAlignment = 4096;

// Files as one device: [base, base + size) of one file, or striped over several in units
// of `unit` bytes from `base` in each (as FileSet maps a FileDevice's offsets).
class FileView final : public Device {
 public:
  FileView(std::vector<std::shared_ptr<Device>> files, uint64_t base, uint64_t unit, uint64_t size,
           std::string name)
      : Device(size, kAlignment), files_(std::move(files)), base_(base), unit_(unit), name_(std::move(name)) {}
  std::string Describe() const override { return "memory file " + name_; }

 protected:
  Status ReadImpl(IoOp* ops, size_t n) override { return Each(ops, n, false); }
  Status WriteImpl(const IoOp* ops, size_t n) override { return Each(ops, n, true); }
  Status SyncImpl() override {
    for (const auto& f : files_) MTRAINS_RETURN_IF_ERROR(f->Sync());
    return Status::Ok();
  }

 private:
  // Each op, split at stripe boundaries, on its file.
  Status Each(const IoOp* ops, size_t n, bool write) {
    for (size_t i = 0; i < n; ++i) {
      uint64_t off = ops[i].offset, left = ops[i].len;
      uint8_t* buf = static_cast<uint8_t*>(ops[i].buf);
      while (left > 0) {
        const bool striped = files_.size() > 1;
        const uint64_t stripe = striped ? off / unit_ : 0, within = striped ? off % unit_ : off;
        const uint64_t len = striped ? std::min<uint64_t>(left, unit_ - within) : left;
        Device& file = *files_[stripe % files_.size()];
        IoOp part{base_ + (stripe / files_.size()) * unit_ + within, buf, static_cast<uint32_t>(len)};
        MTRAINS_RETURN_IF_ERROR(write ? file.Write(&part, 1) : file.Read(&part, 1));
        off += len;
        buf += len;
        left -= len;
      }
    }
    return Status::Ok();
  }

  const std::vector<std::shared_ptr<Device>> files_;
  const uint64_t base_, unit_;
  const std::string name_;
};

// What LockFile says of a file this Env's lock already holds (as flock's EWOULDBLOCK).
Status InUse(const std::string& path, const std::string& what) {
  return Status::IoError(EWOULDBLOCK, what + " " + path + " is in use: it is open (locked) by this process; "
                                          "close it there first");
}

// The aligned span [0, end) covering the first `len` bytes of a file of `size` bytes.
uint64_t HeadSpan(size_t len, uint64_t size) {
  return std::min<uint64_t>(size, (len + kAlignment - 1) / kAlignment * kAlignment);
}

}  // namespace

class MemoryEnv::HeldLock final : public FileLock {
 public:
  HeldLock(MemoryEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
  ~HeldLock() override { env_->Unlock(path_); }

 private:
  MemoryEnv* const env_;
  const std::string path_;
};

std::shared_ptr<Device> MemoryEnv::NewFile(uint64_t size) const {
  if (record_ != nullptr) return std::make_shared<RecordingDevice>(record_, size, kAlignment);
  return std::make_shared<MemoryDevice>(size, kAlignment);
}

void MemoryEnv::PutFile(const std::string& path, std::shared_ptr<Device> device) {
  MutexLock lock(&mu_);
  files_[path] = std::move(device);
}

std::shared_ptr<Device> MemoryEnv::File(const std::string& path) const {
  MutexLock lock(&mu_);
  const auto it = files_.find(path);
  return it == files_.end() ? nullptr : it->second;
}

Status MemoryEnv::Find(const std::string& path, std::shared_ptr<Device>* file) const {
  *file = File(path);
  if (*file == nullptr) return Status::FromErrno(ENOENT, path);
  return Status::Ok();
}

Status MemoryEnv::CreateFile(const std::string& path, uint64_t size) {
  if (size % kAlignment != 0)
    return Status::InvalidArgument("memory file " + path + ": size " + std::to_string(size) +
                                   " is not a multiple of " + std::to_string(kAlignment));
  MutexLock lock(&mu_);
  if (files_.count(path)) return Status::FromErrno(EEXIST, "cannot create " + path);
  files_[path] = NewFile(size);
  return Status::Ok();
}

Status MemoryEnv::RemoveFile(const std::string& path) {
  MutexLock lock(&mu_);
  files_.erase(path);
  return Status::Ok();
}

Status MemoryEnv::RenameFile(const std::string& from, const std::string& to) {
  MutexLock lock(&mu_);
  const auto it = files_.find(from);
  if (it == files_.end()) return Status::FromErrno(ENOENT, "cannot rename " + from);
  std::shared_ptr<Device> file = it->second;
  files_.erase(it);
  files_[to] = std::move(file);
  return Status::Ok();
}

Status MemoryEnv::FileSize(const std::string& path, uint64_t* size) {
  std::shared_ptr<Device> file;
  MTRAINS_RETURN_IF_ERROR(Find(path, &file));
  *size = file->size();
  return Status::Ok();
}

Status MemoryEnv::ReadFileHead(const std::string& path, uint8_t* buf, size_t len, size_t* got) {
  *got = 0;
  std::shared_ptr<Device> file;
  MTRAINS_RETURN_IF_ERROR(Find(path, &file));
  const uint64_t span = HeadSpan(len, file->size());
  AlignedBuffer head(std::max<uint64_t>(span, kAlignment), kAlignment);
  IoOp op{0, head.data(), static_cast<uint32_t>(span)};
  if (span > 0) MTRAINS_RETURN_IF_ERROR(file->Read(&op, 1));
  *got = static_cast<size_t>(std::min<uint64_t>(len, span));
  std::memcpy(buf, head.data(), *got);
  return Status::Ok();
}

Status MemoryEnv::WriteFileHead(const std::string& path, const uint8_t* data, size_t len) {
  std::shared_ptr<Device> file;
  MTRAINS_RETURN_IF_ERROR(Find(path, &file));
  const uint64_t span = HeadSpan(len, file->size());
  if (span < len) return Status::IoError(ENOSPC, "cannot write the header of " + path + ": the file is shorter");
  AlignedBuffer head(std::max<uint64_t>(span, kAlignment), kAlignment);
  IoOp op{0, head.data(), static_cast<uint32_t>(span)};
  if (span > len) MTRAINS_RETURN_IF_ERROR(file->Read(&op, 1));  // the rest of the span stays
  std::memcpy(head.data(), data, len);
  MTRAINS_RETURN_IF_ERROR(file->Write(&op, 1));
  return file->Sync();
}

Status MemoryEnv::CopyFile(const std::string& src, const std::string& dst) {
  std::shared_ptr<Device> from;
  MTRAINS_RETURN_IF_ERROR(Find(src, &from));
  std::shared_ptr<Device> to = NewFile(from->size());
  constexpr uint64_t kChunk = 1 << 20;
  AlignedBuffer buf(kChunk, kAlignment);
  for (uint64_t off = 0; off < from->size(); off += kChunk) {
    IoOp op{off, buf.data(), static_cast<uint32_t>(std::min(kChunk, from->size() - off))};
    MTRAINS_RETURN_IF_ERROR(from->Read(&op, 1));
    MTRAINS_RETURN_IF_ERROR(to->Write(&op, 1));
  }
  MTRAINS_RETURN_IF_ERROR(to->Sync());
  PutFile(dst, std::move(to));
  return Status::Ok();
}

Status MemoryEnv::LockFile(const std::string& path, const std::string& what,
                           std::unique_ptr<FileLock>* lock) {
  std::shared_ptr<Device> file;
  MTRAINS_RETURN_IF_ERROR(Find(path, &file));
  {
    MutexLock l(&mu_);
    if (!locked_.insert(path).second) return InUse(path, what);
  }
  *lock = std::make_unique<HeldLock>(this, path);
  return Status::Ok();
}

Status MemoryEnv::CheckNotLocked(const std::string& path, const std::string& what) {
  MutexLock l(&mu_);
  return locked_.count(path) ? InUse(path, what) : Status::Ok();
}

void MemoryEnv::Unlock(const std::string& path) {
  MutexLock l(&mu_);
  locked_.erase(path);
}

FileDeviceOpenResult MemoryEnv::OpenDevice(const std::string&, DeviceRole,
                                           const FileDeviceOptions& o) {
  FileDeviceOpenResult r;
  r.engine = "memory";
  const uint64_t n = o.paths.size();
  if (n == 0 || (n > 1 && (o.stripe_unit == 0 || o.stripe_unit % kAlignment != 0))) {
    r.status = Status::InvalidArgument("memory device: " + std::to_string(n) + " files with stripe unit " +
                                       std::to_string(o.stripe_unit));
    return r;
  }
  // Bytes each file must hold past `base_offset`.
  const uint64_t per_file = n == 1 ? o.size : (o.size / o.stripe_unit + n - 1) / n * o.stripe_unit;
  std::vector<std::shared_ptr<Device>> files(n);
  for (uint64_t i = 0; i < n; ++i) {
    r.status = Find(o.paths[i], &files[i]);
    if (!r.status.ok()) return r;
    const uint64_t size = files[i]->size();
    if (o.base_offset % kAlignment != 0 || o.size % kAlignment != 0 || o.base_offset > size ||
        per_file > size - o.base_offset) {
      r.status = Status::InvalidArgument("memory file " + o.paths[i] + " of " + std::to_string(size) +
                                         " bytes has no aligned extent of " + std::to_string(per_file) +
                                         " bytes at " + std::to_string(o.base_offset));
      return r;
    }
  }
  r.device = std::make_unique<FileView>(std::move(files), o.base_offset, o.stripe_unit, o.size, o.paths[0]);
  return r;
}

}  // namespace mtrains
