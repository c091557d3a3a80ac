#include "storage/file_set.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mtrains {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

FileSet::FileSet(std::vector<int> fds, std::vector<std::string> paths, uint64_t base, uint64_t stripe_unit)
    : fds_(std::move(fds)), paths_(std::move(paths)), base_(base), unit_(stripe_unit) {}

FileSet::~FileSet() {
  for (int fd : fds_) close(fd);
}

void FileSet::Map(const IoOp* ops, size_t n, std::vector<Part>* parts) const {
  parts->clear();
  for (size_t i = 0; i < n; ++i) {
    uint64_t off = ops[i].offset;
    uint8_t* buf = static_cast<uint8_t*>(ops[i].buf);
    uint64_t left = ops[i].len;
    while (left > 0) {
      if (fds_.size() == 1) {
        parts->push_back({fds_[0], base_ + off, buf, static_cast<uint32_t>(left), i});
        break;
      }
      const uint64_t stripe = off / unit_;
      const uint64_t within = off % unit_;
      const uint64_t len = std::min<uint64_t>(left, unit_ - within);
      const size_t file = stripe % fds_.size();
      const uint64_t file_off = base_ + (stripe / fds_.size()) * unit_ + within;
      parts->push_back({fds_[file], file_off, buf, static_cast<uint32_t>(len), i});
      off += len;
      buf += len;
      left -= len;
    }
  }
}

bool FileSet::Locate(uint64_t off, uint64_t len, int* fd, uint64_t* file_off, uint32_t* file_index) const {
  if (fds_.size() == 1) {
    *fd = fds_[0];
    *file_off = base_ + off;
    if (file_index != nullptr) *file_index = 0;
    return true;
  }
  const uint64_t stripe = off / unit_, within = off % unit_;
  if (within + len > unit_) return false;
  const uint64_t file = stripe % fds_.size();
  *fd = fds_[file];
  *file_off = base_ + (stripe / fds_.size()) * unit_ + within;
  if (file_index != nullptr) *file_index = static_cast<uint32_t>(file);
  return true;
}

Status FileSet::SyncAll() const {
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (fdatasync(fds_[i]) != 0) {
      const int err = errno;
      return Status::IoError(err, "fdatasync of " + paths_[i] + " failed: " + ErrnoText(err));
    }
  }
  return Status::Ok();
}

void FileSet::DataExtents(uint64_t begin, uint64_t end,
                          std::vector<std::pair<uint64_t, uint64_t>>* out) const {
  out->clear();
  uint64_t off = begin;
  while (off < end) {
    const off_t data = fds_.size() == 1 ? lseek(fds_[0], static_cast<off_t>(base_ + off), SEEK_DATA) : -1;
    if (data < 0 && errno == ENXIO) return;  // no data after off
    if (data < 0) {                          // striped, or no SEEK_DATA: all of it
      out->emplace_back(off, end);
      return;
    }
    const uint64_t lo = static_cast<uint64_t>(data) - base_;
    if (lo >= end) return;
    const off_t hole = lseek(fds_[0], data, SEEK_HOLE);
    const uint64_t hi = hole < 0 ? end : std::min<uint64_t>(end, static_cast<uint64_t>(hole) - base_);
    out->emplace_back(lo, hi);
    off = hi;
  }
}

Status FileSet::PartError(const Part& p, bool write, int err) const {
  return Status::IoError(err, std::string(write ? "write" : "read") + " of " + std::to_string(p.len) +
                                  " bytes at offset " + std::to_string(p.file_offset) + " of " +
                                  PathOfFd(p.fd) + " failed: " + ErrnoText(err));
}

const std::string& FileSet::PathOfFd(int fd) const {
  for (size_t i = 0; i < fds_.size(); ++i)
    if (fds_[i] == fd) return paths_[i];
  return paths_[0];
}

std::string FileSet::JoinedPaths() const {
  std::string s;
  for (const auto& p : paths_) s += (s.empty() ? "" : ",") + p;
  return s;
}

}  // namespace mtrains
