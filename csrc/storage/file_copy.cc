#include "storage/file_copy.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>


namespace mtrains {
namespace {

Status Errno(const std::string& what) { return Status::FromErrno(errno, what); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

Status CopyRange(int in, int out, off_t start, off_t end, const std::string& src,
                 const std::string& dst) {
  off_t off_in = start, off_out = start;
  while (off_in < end) {
    ssize_t n = copy_file_range(in, &off_in, out, &off_out, static_cast<size_t>(end - off_in), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
      // No in-kernel copy between these files: copy through a buffer.
      char buf[1 << 16];
      while (off_in < end) {
        const size_t want = static_cast<size_t>(std::min<off_t>(sizeof(buf), end - off_in));
        const ssize_t r = pread(in, buf, want, off_in);
        if (r <= 0) return r < 0 ? Errno("read " + src) : Status::IoError(EIO, src + " shrank");
        for (ssize_t w = 0; w < r;) {
          const ssize_t k = pwrite(out, buf + w, static_cast<size_t>(r - w), off_out + w);
          if (k < 0) return Errno("write " + dst);
          w += k;
        }
        off_in += r;
        off_out += r;
      }
      return Status::Ok();
    }
    if (n < 0) return Errno("copy " + src + " to " + dst);
    if (n == 0) return Status::IoError(EIO, src + " shrank during the copy");
  }
  return Status::Ok();
}

}  // namespace

Status SyncParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  Fd d;
  d.fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0) return Errno("open directory " + dir);
  if (fsync(d.fd) != 0) return Errno("fsync directory " + dir);
  return Status::Ok();
}

Status CopyFileSparse(const std::string& src, const std::string& dst) {
  Fd in, out;
  in.fd = open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in.fd < 0) return Errno("open " + src);
  struct stat st;
  if (fstat(in.fd, &st) != 0) return Errno("stat " + src);
  out.fd = open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out.fd < 0) return Errno("create " + dst);
  if (ioctl(out.fd, FICLONE, in.fd) != 0) {
    if (ftruncate(out.fd, st.st_size) != 0) return Errno("truncate " + dst);
    off_t off = 0;
    while (off < st.st_size) {
      off_t data = lseek(in.fd, off, SEEK_DATA);
      if (data < 0 && errno == ENXIO) break;
      if (data < 0) {  // no SEEK_DATA: copy everything
        MTRAINS_RETURN_IF_ERROR(CopyRange(in.fd, out.fd, off, st.st_size, src, dst));
        break;
      }
      off_t hole = lseek(in.fd, data, SEEK_HOLE);
      if (hole < 0) hole = st.st_size;
      MTRAINS_RETURN_IF_ERROR(CopyRange(in.fd, out.fd, data, hole, src, dst));
      off = hole;
    }
  }
  if (fsync(out.fd) != 0) return Errno("fsync " + dst);
  return Status::Ok();
}

}  // namespace mtrains
