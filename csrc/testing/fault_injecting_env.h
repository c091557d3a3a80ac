// FaultInjectingEnv: an Env whose devices fail on command, for tests.
//
// It forwards every call to a base Env and wraps each device it opens in a
// FaultInjectingDevice; Arm scripts the faults of a table's device by the table's path, so a
// test can fail the I/O of a store it opened through this Env, however deep in the code the
// store lives. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/env.h"
#include "testing/fault_injecting_device.h"

namespace mtrains {

class FaultInjectingEnv final : public Env {
 public:
  // `base` (not owned) does the real work; it must outlive this Env.
  explicit FaultInjectingEnv(Env* base) : base_(base) {}

  // Scripts faults (FaultPlan::Arm) on the `role` device last opened for the table at
  // `table_path`. InvalidArgument when no such device was opened through this Env.
  Status Arm(const std::string& table_path, DeviceRole role, FaultKind kind, uint64_t after,
             uint64_t count, int sys_errno) EXCLUDES(mu_);

  Status CreateFile(const std::string& path, uint64_t size) override {
    return base_->CreateFile(path, size);
  }
  Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return base_->RenameFile(from, to);
  }
  Status FileSize(const std::string& path, uint64_t* size) override {
    return base_->FileSize(path, size);
  }
  Status ReadFileHead(const std::string& path, uint8_t* buf, size_t len, size_t* got) override {
    return base_->ReadFileHead(path, buf, len, got);
  }
  Status WriteFileHead(const std::string& path, const uint8_t* data, size_t len) override {
    return base_->WriteFileHead(path, data, len);
  }
  Status CopyFile(const std::string& src, const std::string& dst) override {
    return base_->CopyFile(src, dst);
  }
  Status SyncDir(const std::string& path) override { return base_->SyncDir(path); }
  Status LockFile(const std::string& path, const std::string& what,
                  std::unique_ptr<FileLock>* lock) override {
    return base_->LockFile(path, what, lock);
  }
  Status CheckNotLocked(const std::string& path, const std::string& what) override {
    return base_->CheckNotLocked(path, what);
  }
  FileDeviceOpenResult OpenDevice(const std::string& table_path, DeviceRole role,
                                  const FileDeviceOptions& options) override EXCLUDES(mu_);

 private:
  Env* const base_;
  Mutex mu_;
  // The plan of each table's device of each role, as last opened (a reopen replaces it).
  std::map<std::pair<std::string, DeviceRole>, std::shared_ptr<FaultPlan>> plans_ GUARDED_BY(mu_);
};

}  // namespace mtrains
