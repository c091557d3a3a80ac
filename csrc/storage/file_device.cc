#include "storage/file_device.h"

#include <fcntl.h>
#include <unistd.h>

// setup.py defines MTRAINS_HAVE_LIBURING when liburing (headers and library) is present;
// without it only the thread-pool engine is built and kAuto falls back to it.
#ifdef MTRAINS_HAVE_LIBURING
#include <liburing.h>
#endif

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "common/aligned_buffer.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mtrains {
namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// The files behind a device and the logical -> (file, offset) mapping.
class FileSet {
 public:
  struct Part {
    int fd;
    uint64_t file_offset;
    uint8_t* buf;
    uint32_t len;
    size_t op_index;  // index of the IoOp this part belongs to
  };

  FileSet(std::vector<int> fds, std::vector<std::string> paths, uint64_t base,
          uint64_t stripe_unit)
      : fds_(std::move(fds)), paths_(std::move(paths)), base_(base), unit_(stripe_unit) {}
  ~FileSet() {
    for (int fd : fds_) close(fd);
  }

  // Splits ops at stripe boundaries and maps each piece to its file.
  void Map(const IoOp* ops, size_t n, std::vector<Part>* parts) const {
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

  // The single file and offset of an extent; false if it crosses a stripe boundary.
  bool Locate(uint64_t off, uint64_t len, int* fd, uint64_t* file_off) const {
    if (fds_.size() == 1) {
      *fd = fds_[0];
      *file_off = base_ + off;
      return true;
    }
    const uint64_t stripe = off / unit_, within = off % unit_;
    if (within + len > unit_) return false;
    *fd = fds_[stripe % fds_.size()];
    *file_off = base_ + (stripe / fds_.size()) * unit_ + within;
    return true;
  }

  Status SyncAll() const {
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (fdatasync(fds_[i]) != 0) {
        const int err = errno;
        return Status::IoError(err, "fdatasync of " + paths_[i] + " failed: " + ErrnoText(err));
      }
    }
    return Status::Ok();
  }

  const std::string& PathOfFd(int fd) const {
    for (size_t i = 0; i < fds_.size(); ++i)
      if (fds_[i] == fd) return paths_[i];
    return paths_[0];
  }
  std::string JoinedPaths() const {
    std::string s;
    for (const auto& p : paths_) s += (s.empty() ? "" : ",") + p;
    return s;
  }

 private:
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  uint64_t base_, unit_;
};

#ifdef MTRAINS_HAVE_LIBURING
// A ring of `entries` whose completions wait for the thread's next io_uring_enter instead
// of interrupting it (COOP_TASKRUN: every wait here is such an enter, so nothing is
// delayed, and no inter-processor interrupt is spent per completion); plain on kernels
// before 5.19, which refuse the flag.
int InitRing(unsigned entries, io_uring* ring) {
  io_uring_params p;
  std::memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_COOP_TASKRUN;
  const int rc = io_uring_queue_init_params(entries, ring, &p);
  return rc == -EINVAL ? io_uring_queue_init(entries, ring, 0) : rc;
}

#endif  // MTRAINS_HAVE_LIBURING

Status PartError(const FileSet& files, const FileSet::Part& p, bool write, int err) {
  return Status::IoError(err, std::string(write ? "write" : "read") + " of " +
                                  std::to_string(p.len) + " bytes at offset " +
                                  std::to_string(p.file_offset) + " of " +
                                  files.PathOfFd(p.fd) + " failed: " + ErrnoText(err));
}

#ifdef MTRAINS_HAVE_LIBURING
// io_uring engine: keeps up to queue_depth parts in flight per call. Reads (and read
// streams) and writes have a ring each, so a write from one thread runs beside a read
// stream of another (BlockStore::Exchange writes evicted rows while it reads).
class UringFileDevice final : public Device {
 public:
  UringFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet> files, io_uring ring,
                  io_uring write_ring)
      : Device(o.size, o.alignment), files_(std::move(files)), ring_(ring),
        write_ring_(write_ring), depth_(o.queue_depth) {}
  ~UringFileDevice() override {
    io_uring_queue_exit(&ring_);
    io_uring_queue_exit(&write_ring_);
  }
  std::string Describe() const override {
    return "io_uring qd=" + std::to_string(depth_) + " on " + files_->JoinedPaths();
  }

 protected:
  // A ring runs one batch at a time.
  Status ReadImpl(IoOp* ops, size_t n) override {
    MutexLock lock(&mu_);
    return Run(&ring_, ops, n, false);
  }
  Status WriteImpl(const IoOp* ops, size_t n) override {
    MutexLock lock(&write_mu_);
    return Run(&write_ring_, ops, n, true);
  }
  Status SyncImpl() override { return files_->SyncAll(); }

  // Keeps the ring full while the caller processes completed extents: buffers come from a
  // pool of max(window, 2 * depth) and return to it after the callback. A turn of the
  // loop is usually one io_uring_enter: it submits the reads that replace the extents
  // handed out in the previous turn and waits for the next completion (refilling before
  // the callbacks would cost a second enter per completion, to submit a few microseconds
  // earlier reads that take hundreds). Only when many extents complete at once (the
  // thread was descheduled, the ring ran low) is the ring refilled before their callbacks.
  Status ReadStreamImpl(const uint64_t* offsets, size_t n, uint32_t len, uint32_t window,
                        const ReadCallback& on_done) override {
    struct Extent {
      size_t index;
      int fd;
      uint64_t file_off;
      uint32_t done;
      uint64_t started;
    };
    std::vector<Extent> where(n);
    for (size_t i = 0; i < n; ++i) {
      if (!files_->Locate(offsets[i], len, &where[i].fd, &where[i].file_off))
        return Device::ReadStreamImpl(offsets, n, len, window, on_done);
    }
    MutexLock lock(&mu_);
    io_uring* const ring = &ring_;  // used by the lambdas below, all run under mu_
    const uint32_t pool_size = std::max<uint32_t>(window, 2 * depth_);
    AlignedBuffer pool(size_t(pool_size) * len, alignment());
    std::vector<Extent> slot(pool_size);
    std::vector<uint32_t> free_slots, completed;
    for (uint32_t s = pool_size; s-- > 0;) free_slots.push_back(s);
    std::deque<uint32_t> retry;
    size_t next = 0, inflight = 0;
    Status err;
    auto submit_more = [&] {
      const uint64_t now = NowNanos();  // one clock read per turn: the start of its reads
      while (err.ok() && inflight < depth_) {
        uint32_t s;
        if (!retry.empty()) {
          s = retry.front();
        } else if (next < n && !free_slots.empty()) {
          s = free_slots.back();
        } else {
          break;
        }
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) break;
        if (!retry.empty()) {
          retry.pop_front();
        } else {
          free_slots.pop_back();
          slot[s] = where[next];
          slot[s].index = next++;
          slot[s].done = 0;
          slot[s].started = now;
        }
        const Extent& e = slot[s];
        io_uring_prep_read(sqe, e.fd, pool.data() + size_t(s) * len + e.done, len - e.done,
                           e.file_off + e.done);
        io_uring_sqe_set_data64(sqe, s);
        ++inflight;
      }
    };
    while (true) {
      submit_more();
      if (inflight == 0) break;
      MTRAINS_RETURN_IF_ERROR(WaitAndReap(ring, [&](uint64_t data, int res) {
        --inflight;
        const uint32_t s = static_cast<uint32_t>(data);
        Extent& e = slot[s];
        if (res == -EINTR || res == -EAGAIN) {
          retry.push_back(s);
        } else if (res < 0) {
          if (err.ok())
            err = PartError(*files_, {e.fd, e.file_off, nullptr, len, e.index}, false, -res);
          free_slots.push_back(s);
        } else if (res == 0) {  // past end of file reads as zeros
          std::memset(pool.data() + size_t(s) * len + e.done, 0, len - e.done);
          completed.push_back(s);
        } else if ((e.done += static_cast<uint32_t>(res)) < len) {
          retry.push_back(s);
        } else {
          completed.push_back(s);
        }
      }));
      if (completed.size() >= std::max<uint32_t>(1, depth_ / 4)) {
        submit_more();
        io_uring_submit(ring);
      }
      const uint64_t now = NowNanos();
      for (uint32_t s : completed) {
        RecordReadLatency(now - slot[s].started);
        if (err.ok()) err = on_done(slot[s].index, pool.data() + size_t(s) * len);
        free_slots.push_back(s);
      }
      completed.clear();
      if (!err.ok()) retry.clear();
    }
    return err;
  }

 private:
  // Runs a batch on `ring` (ring_ with mu_ held, or write_ring_ with write_mu_ held).
  Status Run(io_uring* ring, const IoOp* ops, size_t n, bool write) {
    std::vector<FileSet::Part> parts;
    files_->Map(ops, n, &parts);
    std::vector<uint32_t> progress(parts.size(), 0);
    std::vector<uint64_t> started(parts.size(), 0);
    std::deque<size_t> queue;
    for (size_t i = 0; i < parts.size(); ++i) queue.push_back(i);
    size_t inflight = 0;
    Status first_error;
    while (!queue.empty() || inflight > 0) {
      while (first_error.ok() && !queue.empty() && inflight < depth_) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) break;
        const size_t i = queue.front();
        queue.pop_front();
        const FileSet::Part& p = parts[i];
        const uint32_t done = progress[i];
        if (write) {
          io_uring_prep_write(sqe, p.fd, p.buf + done, p.len - done, p.file_offset + done);
        } else {
          io_uring_prep_read(sqe, p.fd, p.buf + done, p.len - done, p.file_offset + done);
        }
        io_uring_sqe_set_data64(sqe, i);
        if (started[i] == 0) started[i] = NowNanos();
        ++inflight;
      }
      if (inflight == 0) break;  // an error stopped new submissions and all have drained
      MTRAINS_RETURN_IF_ERROR(WaitAndReap(ring, [&](uint64_t data, int res) {
        --inflight;
        const size_t i = data;
        const FileSet::Part& p = parts[i];
        if (res == -EINTR || res == -EAGAIN) {
          queue.push_back(i);
        } else if (res < 0) {
          if (first_error.ok()) first_error = PartError(*files_, p, write, -res);
        } else if (res == 0 && !write) {
          std::memset(p.buf + progress[i], 0, p.len - progress[i]);  // past end of file
          Finish(write, started[i]);
        } else if (res == 0) {
          if (first_error.ok()) first_error = PartError(*files_, p, write, EIO);
        } else {
          progress[i] += static_cast<uint32_t>(res);
          if (progress[i] < p.len) {
            queue.push_back(i);
          } else {
            Finish(write, started[i]);
          }
        }
      }));
      if (!first_error.ok()) queue.clear();
    }
    return first_error;
  }

  // Submits what is queued on `ring`, waits for at least one completion and calls
  // on_cqe(user data, result) for every completion available. Fails only if the ring
  // itself failed, after which nothing more can be reaped safely through it.
  Status WaitAndReap(io_uring* ring, const std::function<void(uint64_t, int)>& on_cqe) {
    const int rc = io_uring_submit_and_wait(ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)
      return Status::IoError(-rc, "io_uring_submit failed: " + ErrnoText(-rc));
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
      ++seen;
      on_cqe(io_uring_cqe_get_data64(cqe), cqe->res);
    }
    io_uring_cq_advance(ring, seen);
    return Status::Ok();
  }

  void Finish(bool write, uint64_t started) {
    const uint64_t dt = NowNanos() - started;
    write ? RecordWriteLatency(dt) : RecordReadLatency(dt);
  }

  std::unique_ptr<FileSet> files_;
  Mutex mu_, write_mu_;
  io_uring ring_ GUARDED_BY(mu_);              // reads and read streams
  io_uring write_ring_ GUARDED_BY(write_mu_);  // writes
  const uint32_t depth_;
};

#else
constexpr char kNoLiburing[] =
    "this build has no liburing; rebuild with liburing-dev installed";
#endif  // MTRAINS_HAVE_LIBURING

// A fixed pool of threads that runs index ranges of one job at a time.
class ThreadPool {
 public:
  explicit ThreadPool(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { Loop(); });
  }
  ~ThreadPool() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    for (auto& t : workers_) t.join();
  }
  // Calls fn(i) for i in [0, n) on the pool and the caller; returns when all are done.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn) EXCLUDES(job_mu_, mu_) {
    MutexLock job_lock(&job_mu_);
    {
      MutexLock lock(&mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      active_ = static_cast<uint32_t>(workers_.size());
      ++generation_;
    }
    cv_.NotifyAll();
    Work(fn, n);
    MutexLock lock(&mu_);
    while (active_ != 0) done_cv_.Wait(&mu_);
    fn_ = nullptr;
  }

 private:
  void Work(const std::function<void(size_t)>& fn, size_t n) {
    for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
  }
  void Loop() EXCLUDES(mu_) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* fn;
      size_t n;
      {
        MutexLock lock(&mu_);
        while (!stop_ && generation_ == seen) cv_.Wait(&mu_);
        if (stop_) return;
        seen = generation_;
        fn = fn_;  // the job's, constant until every worker has finished it
        n = n_;
      }
      Work(*fn, n);
      MutexLock lock(&mu_);
      if (--active_ == 0) done_cv_.NotifyAll();
    }
  }

  std::vector<std::thread> workers_;
  Mutex job_mu_;  // one ParallelFor at a time
  Mutex mu_;
  CondVar cv_, done_cv_;  // a new job or stop_; active_ reached 0
  const std::function<void(size_t)>* fn_ GUARDED_BY(mu_) = nullptr;
  size_t n_ GUARDED_BY(mu_) = 0;
  std::atomic<size_t> next_{0};
  uint32_t active_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
};

// pread/pwrite engine on a thread pool.
class ThreadPoolFileDevice final : public Device {
 public:
  ThreadPoolFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet> files)
      : Device(o.size, o.alignment), files_(std::move(files)), pool_(o.io_threads - 1),
        threads_(o.io_threads) {}
  std::string Describe() const override {
    return "threads n=" + std::to_string(threads_) + " on " + files_->JoinedPaths();
  }

 protected:
  Status ReadImpl(IoOp* ops, size_t n) override { return Run(ops, n, false); }
  Status WriteImpl(const IoOp* ops, size_t n) override { return Run(ops, n, true); }
  Status SyncImpl() override { return files_->SyncAll(); }

 private:
  Status Run(const IoOp* ops, size_t n, bool write) {
    std::vector<FileSet::Part> parts;
    files_->Map(ops, n, &parts);
    Mutex err_mu;
    Status first_error;  // guarded by err_mu
    pool_.ParallelFor(parts.size(), [&](size_t i) {
      const FileSet::Part& p = parts[i];
      const uint64_t t0 = NowNanos();
      uint32_t done = 0;
      while (done < p.len) {
        const ssize_t r = write ? pwrite(p.fd, p.buf + done, p.len - done, p.file_offset + done)
                                : pread(p.fd, p.buf + done, p.len - done, p.file_offset + done);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0 || (r == 0 && write)) {
          const int err = r < 0 ? errno : EIO;
          MutexLock lock(&err_mu);
          if (first_error.ok()) first_error = PartError(*files_, p, write, err);
          return;
        }
        if (r == 0) {  // past end of file reads as zeros
          std::memset(p.buf + done, 0, p.len - done);
          break;
        }
        done += static_cast<uint32_t>(r);
      }
      write ? RecordWriteLatency(NowNanos() - t0) : RecordReadLatency(NowNanos() - t0);
    });
    return first_error;
  }

  std::unique_ptr<FileSet> files_;
  ThreadPool pool_;
  const uint32_t threads_;
};

}  // namespace

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
#ifdef MTRAINS_HAVE_LIBURING
  if (o.engine != IoEngineKind::kThreads) {
    io_uring ring, write_ring;
    const unsigned entries = std::max<uint32_t>(o.queue_depth, 8);
    int rc = InitRing(entries, &ring);
    if (rc == 0) {
      rc = InitRing(entries, &write_ring);
      if (rc != 0) io_uring_queue_exit(&ring);
    }
    if (rc == 0) {
      result.device = std::make_unique<UringFileDevice>(o, std::move(files), ring, write_ring);
      result.engine = "io_uring";
      return result;
    }
    if (o.engine == IoEngineKind::kUring) {
      result.status = Status::IoError(-rc, "io_uring is unavailable: " + ErrnoText(-rc));
      return result;
    }
    result.warning += (result.warning.empty() ? "" : "; ") +
                      std::string("io_uring is unavailable (") + ErrnoText(-rc) +
                      "); using the pread/pwrite thread pool";
  }
#else
  if (o.engine == IoEngineKind::kUring) {
    result.status = Status::IoError(ENOSYS, std::string("io_uring is unavailable: ") + kNoLiburing);
    return result;
  }
  if (o.engine == IoEngineKind::kAuto) {
    result.warning += (result.warning.empty() ? "" : "; ") + std::string("io_uring is unavailable (") +
                      kNoLiburing + "); using the pread/pwrite thread pool";
  }
#endif
  result.device = std::make_unique<ThreadPoolFileDevice>(o, std::move(files));
  result.engine = "threads";
  return result;
}

}  // namespace mtrains
