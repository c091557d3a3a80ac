// OpenFileDevice (file_device.h): opens the files and picks the engine (file_engines.h).
#include "storage/file_device.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "storage/file_engines.h"
#include "storage/file_set.h"

namespace mtrains {

FileDeviceOpenResult OpenFileDevice(const FileDeviceOptions& o) {
  FileDeviceOpenResult result;
  if (o.paths.empty()) {
    result.status = Status::InvalidArgument("no file paths given");
    return result;
  }
  if (o.paths.size() > 1 && (o.stripe_unit == 0 || o.stripe_unit % o.alignment != 0)) {
    result.status = Status::InvalidArgument("stripe_unit " + std::to_string(o.stripe_unit) +
                                            " must be a positive multiple of the alignment");
    return result;
  }
  if (o.queue_depth == 0 || o.io_threads == 0) {
    result.status = Status::InvalidArgument("queue_depth and io_threads must be positive");
    return result;
  }
  bool direct = o.direct_io;
  std::vector<int> fds;
  for (const auto& path : o.paths) {
    const int base_flags = (o.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
    int fd = open(path.c_str(), base_flags | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {
      direct = false;  // filesystem without O_DIRECT (e.g. some tmpfs): buffered I/O
      result.warning = "O_DIRECT is not supported on the filesystem of " + path +
                       "; falling back to buffered I/O (the page cache will hold table data)";
      fd = open(path.c_str(), base_flags);
    }
    if (fd < 0) {
      const int err = errno;
      for (int f : fds) close(f);
      result.status = Status::IoError(err, "cannot open " + path + ": " + ErrnoText(err));
      return result;
    }
    fds.push_back(fd);
  }
  if (!direct && o.direct_io) {
    // Mixed modes across stripes would be confusing: make them all buffered.
    for (size_t i = 0; i < fds.size(); ++i) {
      const int flags = fcntl(fds[i], F_GETFL);
      if (flags >= 0 && (flags & O_DIRECT)) fcntl(fds[i], F_SETFL, flags & ~O_DIRECT);
    }
  }
  auto files = std::make_unique<FileSet>(std::move(fds), o.paths, o.base_offset, o.stripe_unit);
  result.direct_io = direct;
  if (o.engine != IoEngineKind::kThreads) {
    const Status uring = NewUringFileDevice(o, &files, &result.device);
    if (uring.ok()) {
      result.engine = "io_uring";
      return result;
    }
    if (o.engine == IoEngineKind::kUring) {
      result.status = Status::IoError(uring.sys_errno(), "io_uring is unavailable: " + uring.message());
      return result;
    }
    result.warning += (result.warning.empty() ? "" : "; ") + std::string("io_uring is unavailable (") +
                      uring.message() + "); using the pread/pwrite thread pool";
  }
  result.device = NewThreadPoolFileDevice(o, std::move(files));
  result.engine = "threads";
  return result;
}

}  // namespace mtrains
