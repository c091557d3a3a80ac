// Env::Default(): POSIX files (flock ownership locks, sparse files and copies) and
// direct-I/O FileDevices.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/file_lock.h"
#include "storage/env.h"
#include "storage/file_copy.h"

namespace mtrains {
namespace {

// The descriptor an ownership lock lives on: flock locks belong to the open file
// description, so closing it releases the lock.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { close(fd_); }

 private:
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  Status CreateFile(const std::string& path, uint64_t size) override {
    const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno(errno, "cannot create " + path);
    Status st;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0)
      st = Status::FromErrno(errno, "cannot size " + path + " to " + std::to_string(size) + " bytes");
    close(fd);
    if (!st.ok()) unlink(path.c_str());
    return st;
  }

  Status RemoveFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "cannot remove " + path);
    return Status::Ok();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) return Status::FromErrno(errno, "cannot rename " + from + " to " + to);
    return Status::Ok();
  }

  Status FileSize(const std::string& path, uint64_t* size) override {
    struct stat sb;
    if (stat(path.c_str(), &sb) != 0) return Status::FromErrno(errno, "stat " + path);
    *size = static_cast<uint64_t>(sb.st_size);
    return Status::Ok();
  }

  Status ReadFileHead(const std::string& path, uint8_t* buf, size_t len, size_t* got) override {
    *got = 0;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "cannot open " + path);
    Status st;
    while (*got < len) {
      const ssize_t r = pread(fd, buf + *got, len - *got, static_cast<off_t>(*got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) st = Status::FromErrno(errno, "read header of " + path);
      if (r <= 0) break;
      *got += static_cast<size_t>(r);
    }
    close(fd);
    return st;
  }

  Status WriteFileHead(const std::string& path, const uint8_t* data, size_t len) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "cannot open " + path);
    Status st;
    const ssize_t w = pwrite(fd, data, len, 0);
    if (w != static_cast<ssize_t>(len))
      st = Status::FromErrno(w < 0 ? errno : ENOSPC, "cannot write the header of " + path);
    else if (fsync(fd) != 0)
      st = Status::FromErrno(errno, "cannot fsync " + path);
    close(fd);
    return st;
  }

  Status CopyFile(const std::string& src, const std::string& dst) override {
    return CopyFileSparse(src, dst);
  }

  Status SyncDir(const std::string& path) override { return SyncParentDir(path); }

  Status LockFile(const std::string& path, const std::string& what,
                  std::unique_ptr<FileLock>* lock) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "cannot open " + path);
    const Status st = LockOpenFile(fd, path, LockKind::kExclusive, what);
    if (!st.ok()) {
      close(fd);
      return st;
    }
    *lock = std::make_unique<PosixFileLock>(fd);
    return Status::Ok();
  }

  Status CheckNotLocked(const std::string& path, const std::string& what) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::Ok();  // nothing there to take from anyone
    // close() releases only the probe's own lock: the locks of other opens stay.
    const Status st = LockOpenFile(fd, path, LockKind::kExclusive, what);
    close(fd);
    return st;
  }

  FileDeviceOpenResult OpenDevice(const std::string&, DeviceRole,
                                  const FileDeviceOptions& options) override {
    return OpenFileDevice(options);
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never deleted: stores may close during exit
  return env;
}

}  // namespace mtrains
