// Env: the files and devices a BlockStore lives on (after LevelDB's Env).
//
// A store does every file operation -- creating, sizing, locking, copying, renaming and
// removing its files, its header, and opening the devices it reads and writes rows
// through -- by calling the Env in its StoreRuntimeOptions. Production uses Env::Default()
// (POSIX files, direct-I/O FileDevices). Tests pass their own: csrc/testing/ has an Env
// whose devices fail on command and one that keeps the files in memory and records every
// write for the power-loss checker; the store includes neither.
//
// Thread-safety: every method may be called from any thread. Errors: a Status naming the
// file; an OS failure is IoError with its errno (ENOENT for a missing file, EEXIST,
// EWOULDBLOCK for a file another open holds, ...), which callers may branch on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "storage/file_device.h"

namespace mtrains {

// A held ownership lock on a file; released when destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// What a table's device holds, so an Env can tell a table's devices apart.
enum class DeviceRole {
  kMeta,  // the main file: header, location-map pages and the map journal
  kLog,   // the segment log (in the main file after the map, or in the stripe files)
};

class Env {
 public:
  virtual ~Env() = default;

  // POSIX files and FileDevices. Never deleted.
  static Env* Default();

  // Creates `path` exclusively (EEXIST when a file is there; ENOENT when its directory is
  // missing), `size` bytes long and reading as zeros (sparse where the filesystem allows).
  virtual Status CreateFile(const std::string& path, uint64_t size) = 0;
  // Removes `path`; Ok when nothing is there.
  virtual Status RemoveFile(const std::string& path) = 0;
  // Renames `from` to `to`, replacing `to`.
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status FileSize(const std::string& path, uint64_t* size) = 0;
  // Reads up to `len` bytes from the start of `path` into `buf`; `*got` is how many (fewer
  // at the end of the file).
  virtual Status ReadFileHead(const std::string& path, uint8_t* buf, size_t len, size_t* got) = 0;
  // Writes `len` bytes at the start of `path` and makes them durable.
  virtual Status WriteFileHead(const std::string& path, const uint8_t* data, size_t len) = 0;
  // Copies `src` to `dst` (created or truncated) and makes the copy durable; holes stay
  // holes where the filesystem allows.
  virtual Status CopyFile(const std::string& src, const std::string& dst) = 0;
  // Makes the directory entry of `path` (a create or rename) durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Takes the exclusive ownership lock of `path`, without waiting: a lock held through
  // another open (this process or another) is IoError(EWOULDBLOCK) naming the holder;
  // `what` says what the file is ("table file").
  virtual Status LockFile(const std::string& path, const std::string& what,
                          std::unique_ptr<FileLock>* lock) = 0;
  // Ok unless `path` is there and its ownership lock is held (EWOULDBLOCK as LockFile).
  virtual Status CheckNotLocked(const std::string& path, const std::string& what) = 0;
  // Opens the device over `options.paths` holding `role` of the table at `table_path`.
  virtual FileDeviceOpenResult OpenDevice(const std::string& table_path, DeviceRole role,
                                          const FileDeviceOptions& options) = 0;
};

}  // namespace mtrains
