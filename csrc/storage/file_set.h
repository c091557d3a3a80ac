// FileSet: the files behind a FileDevice and the mapping of its logical offsets onto them:
// striped over the files in units of `stripe_unit` bytes (one file: no striping), starting
// `base_offset` bytes into each file.
//
// Internal to storage/: OpenFileDevice (file_device.cc) opens the files, and the engines
// (uring_file_device.cc, thread_pool_file_device.cc) issue their I/O through the mapping.
// Owns the descriptors (closed by the destructor). Immutable after construction, so every
// method is safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "storage/device.h"

namespace mtrains {

// strerror(err) as a std::string, for messages.
std::string ErrnoText(int err);

class FileSet {
 public:
  // One piece of an IoOp that lies within one stripe of one file.
  struct Part {
    int fd;
    uint64_t file_offset;
    uint8_t* buf;
    uint32_t len;
    size_t op_index;  // index of the IoOp this part belongs to
  };

  // Takes ownership of `fds` (one per path, in stripe order).
  FileSet(std::vector<int> fds, std::vector<std::string> paths, uint64_t base, uint64_t stripe_unit);
  ~FileSet();
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;

  // Splits ops[0..n) at stripe boundaries into *parts (cleared first), each mapped to its file.
  void Map(const IoOp* ops, size_t n, std::vector<Part>* parts) const;

  // The single file and offset of the extent [off, off + len); false if it crosses a stripe
  // boundary. `file_index` (optional): the file's position in fds().
  bool Locate(uint64_t off, uint64_t len, int* fd, uint64_t* file_off, uint32_t* file_index = nullptr) const;

  // The descriptors, in stripe order (an engine may register them with the kernel).
  const std::vector<int>& fds() const { return fds_; }

  // fdatasync of every file; the first failure names its file.
  Status SyncAll() const;

  // Device::DataExtents: of one file, its data extents (SEEK_DATA / SEEK_HOLE); striped
  // files, or a filesystem without SEEK_DATA, the whole range.
  void DataExtents(uint64_t begin, uint64_t end, std::vector<std::pair<uint64_t, uint64_t>>* out) const;

  // The error of part `p` that failed with `err`, naming its file, offset and length.
  Status PartError(const Part& p, bool write, int err) const;

  // The paths, comma-separated (for Describe()).
  std::string JoinedPaths() const;

 private:
  const std::string& PathOfFd(int fd) const;

  std::vector<int> fds_;
  std::vector<std::string> paths_;
  uint64_t base_, unit_;
};

}  // namespace mtrains
