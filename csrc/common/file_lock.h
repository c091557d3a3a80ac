// File ownership locks: one open of a table file writes it; a second opener is refused.
//
// The locks are flock(2) locks. They belong to the open file description, so they are
// released when its last descriptor is closed or the process dies (no stale lock file to
// clean up), and a second open() of the same file conflicts even inside one process.
#pragma once

#include <string>

#include "common/status.h"

namespace mtrains {

enum class LockKind {
  kShared,     // readers: any number together, none beside an exclusive holder
  kExclusive,  // the one writer
};

// Takes a lock of `kind` on `fd` (an open descriptor of `path`, any access mode) without
// waiting. A conflicting lock held through another open of the file (this process or
// another): IoError(EWOULDBLOCK) naming `path` and, where /proc/locks tells it, the pid
// holding it; `what` says what the file is ("table file").
Status LockOpenFile(int fd, const std::string& path, LockKind kind, const std::string& what);

// Who holds a flock on the file open as `fd`: "pid N", "this process (pid N)", or
// "another process" when /proc/locks does not say (another pid namespace, no /proc).
std::string LockHolder(int fd);

}  // namespace mtrains
