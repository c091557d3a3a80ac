// MemoryEnv: an Env whose files live in memory, for tests (the power-loss checker above all).
//
// Each file is a Device of the size it was created with: a RecordingDevice when the Env
// records into a WriteRecord, so every write and sync of every file -- the header, the map,
// the journal, the log -- lands in one order that CrashImages can cut anywhere; a
// MemoryDevice otherwise. The devices a store opens are views of its files (at
// `base_offset`, striped as FileDevice stripes); a view's sync syncs its files, as
// fdatasync does. Directory entries are durable at once: power cuts of the namespace are
// not modelled. Locks are held per Env, as flock locks are per open.
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/env.h"
#include "testing/recording_device.h"

namespace mtrains {

class MemoryEnv final : public Env {
 public:
  // With `record` (not owned; it must outlive the Env), files are RecordingDevices on it.
  explicit MemoryEnv(WriteRecord* record = nullptr) : record_(record) {}

  // Makes `path` the file holding `device`'s bytes (replacing any file there).
  void PutFile(const std::string& path, std::shared_ptr<Device> device) EXCLUDES(mu_);
  // The device holding `path`'s bytes, or null.
  std::shared_ptr<Device> File(const std::string& path) const EXCLUDES(mu_);

  Status CreateFile(const std::string& path, uint64_t size) override EXCLUDES(mu_);
  Status RemoveFile(const std::string& path) override EXCLUDES(mu_);
  Status RenameFile(const std::string& from, const std::string& to) override EXCLUDES(mu_);
  Status FileSize(const std::string& path, uint64_t* size) override EXCLUDES(mu_);
  Status ReadFileHead(const std::string& path, uint8_t* buf, size_t len, size_t* got) override;
  Status WriteFileHead(const std::string& path, const uint8_t* data, size_t len) override;
  Status CopyFile(const std::string& src, const std::string& dst) override EXCLUDES(mu_);
  Status SyncDir(const std::string&) override { return Status::Ok(); }
  Status LockFile(const std::string& path, const std::string& what,
                  std::unique_ptr<FileLock>* lock) override EXCLUDES(mu_);
  Status CheckNotLocked(const std::string& path, const std::string& what) override EXCLUDES(mu_);
  FileDeviceOpenResult OpenDevice(const std::string& table_path, DeviceRole role,
                                  const FileDeviceOptions& options) override;

 private:
  class HeldLock;
  // The file at `path`, or IoError(ENOENT) naming it.
  Status Find(const std::string& path, std::shared_ptr<Device>* file) const EXCLUDES(mu_);
  std::shared_ptr<Device> NewFile(uint64_t size) const;
  void Unlock(const std::string& path) EXCLUDES(mu_);

  WriteRecord* const record_;
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<Device>> files_ GUARDED_BY(mu_);
  std::set<std::string> locked_ GUARDED_BY(mu_);
};

}  // namespace mtrains
