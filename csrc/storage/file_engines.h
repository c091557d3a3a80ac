// The I/O engines behind OpenFileDevice (file_device.cc), one file each:
// uring_file_device.cc (io_uring) and thread_pool_file_device.cc (pread/pwrite on threads).
// Internal to storage/. The devices they make are thread-safe as every Device is.
#pragma once

#include <memory>

#include "common/status.h"
#include "storage/device.h"
#include "storage/file_device.h"
#include "storage/file_set.h"

namespace mtrains {

// An io_uring device over *files: a read ring and a write ring of o.queue_depth operations
// in flight each. On success it takes *files and sets *out; on failure it leaves *files as
// it was (for a fallback engine) and returns why: an IoError with the kernel's errno, or
// ENOSYS in a build without liburing.
Status NewUringFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet>* files,
                          std::unique_ptr<Device>* out);

// A pread/pwrite device on a pool of o.io_threads threads (the calling thread among them).
std::unique_ptr<Device> NewThreadPoolFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet> files);

}  // namespace mtrains
