// FileDevice: a Device over one or more files, with direct I/O and a choice of engines.
//
// Logical offsets are striped over the files in units of `stripe_unit` bytes (one file:
// no striping), starting `base_offset` bytes into each file. Engines:
//   kUring    io_uring (liburing), up to `queue_depth` operations in flight
//   kThreads  a pool of `io_threads` threads issuing pread/pwrite, portable fallback
//   kAuto     io_uring if the kernel allows it, else threads
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "storage/device.h"

namespace mtrains {

enum class IoEngineKind { kAuto, kUring, kThreads };

struct FileDeviceOptions {
  std::vector<std::string> paths;  // one file per stripe; all must exist
  uint64_t base_offset = 0;        // bytes skipped at the start of every file
  uint64_t size = 0;               // logical device size in bytes
  uint64_t stripe_unit = 0;        // bytes; required when paths.size() > 1
  uint32_t alignment = 4096;       // bytes
  bool direct_io = true;           // O_DIRECT; falls back to buffered where refused
  bool read_only = false;
  IoEngineKind engine = IoEngineKind::kAuto;
  uint32_t queue_depth = 64;
  uint32_t io_threads = 8;
};

// Result of opening a FileDevice.
struct FileDeviceOpenResult {
  Status status;
  std::unique_ptr<Device> device;
  bool direct_io = false;  // whether O_DIRECT is in effect
  std::string engine;      // "io_uring" or "threads"
  std::string warning;     // non-empty when a fallback was taken
};

// Opens the files of `options`. Never throws; errors name the file.
FileDeviceOpenResult OpenFileDevice(const FileDeviceOptions& options);

}  // namespace mtrains
