#include "common/file_lock.h"

#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mtrains {

std::string LockHolder(int fd) {
  struct stat sb;
  if (fstat(fd, &sb) != 0) return "another process";
  char dev[32];
  std::snprintf(dev, sizeof(dev), "%02x:%02x:", major(sb.st_dev), minor(sb.st_dev));
  const std::string want = dev + std::to_string(sb.st_ino);
  // Lines: "<id>: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<inode> <start> <end>"; a
  // waiter's line has "->" after the id and is not a holder.
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream in(line);
    std::string id, type, mode, access, pid, where;
    if (!(in >> id >> type) || type == "->" || type != "FLOCK") continue;
    if (!(in >> mode >> access >> pid >> where) || where != want) continue;
    if (pid.empty() || pid[0] == '-' || pid == "0") break;  // not visible from here
    if (pid == std::to_string(getpid())) return "this process (pid " + pid + ")";
    return "pid " + pid;
  }
  return "another process";
}

Status LockOpenFile(int fd, const std::string& path, LockKind kind, const std::string& what) {
  const int op = (kind == LockKind::kExclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  int rc;
  do {
    rc = flock(fd, op);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::Ok();
  const int err = errno;
  if (err != EWOULDBLOCK)
    return Status::IoError(err, "cannot lock " + what + " " + path + ": " + std::strerror(err));
  return Status::IoError(EWOULDBLOCK, what + " " + path + " is in use: it is open (locked) by " +
                                          LockHolder(fd) + "; close it there first");
}

}  // namespace mtrains
