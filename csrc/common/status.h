// Status: the error channel of the data path.
//
// Errors come in two tiers. Objects configured by their constructor alone
// (SetAssociativeCache, RowCache) throw std::invalid_argument naming the bad value; the
// data path (reads, writes, flushes, creating and opening table files, their settings
// included) returns a Status that the binding layer turns into a Python exception
// (ValueError, IndexError, OSError, CorruptionError) naming the table, file or row id.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace mtrains {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad caller input (wrong width, bad config value)
  kOutOfRange = 2,       // a row id outside [0, num_rows)
  kIoError = 3,          // the OS refused an I/O; sys_errno() says why (ENOSPC, EIO, ...)
  kCorruption = 4,       // a checksum, magic or identity check failed on data read back
  kClosed = 5,           // the store was closed
  kFormatError = 6,      // a file that is not a table of this format / version
};

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, 0, std::move(msg));
  }
  static Status OutOfRange(std::string msg) {
    return Status(StatusCode::kOutOfRange, 0, std::move(msg));
  }
  static Status IoError(int sys_errno, std::string msg) {
    return Status(StatusCode::kIoError, sys_errno, std::move(msg));
  }
  // IoError(err) saying "what: strerror(err)".
  static Status FromErrno(int err, const std::string& what);
  static Status Corruption(std::string msg) {
    return Status(StatusCode::kCorruption, EBADMSG, std::move(msg));
  }
  static Status Closed(std::string msg) { return Status(StatusCode::kClosed, 0, std::move(msg)); }
  static Status FormatError(std::string msg) {
    return Status(StatusCode::kFormatError, 0, std::move(msg));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is prefixed with `context` (e.g. the file name).
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, errno_, context + ": " + message_);
  }

 private:
  Status(StatusCode code, int sys_errno, std::string msg)
      : code_(code), errno_(sys_errno), message_(std::move(msg)) {}

  StatusCode code_ = StatusCode::kOk;
  int errno_ = 0;
  std::string message_;
};

inline Status Status::FromErrno(int err, const std::string& what) {
  return IoError(err, what + ": " + std::strerror(err));
}

}  // namespace mtrains

// Returns from the enclosing function when `expr` yields a non-ok Status.
#define MTRAINS_RETURN_IF_ERROR(expr)       \
  do {                                      \
    ::mtrains::Status _st = (expr);         \
    if (!_st.ok()) return _st;              \
  } while (0)
