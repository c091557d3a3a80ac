// The io_uring engine of FileDevice (file_engines.h). setup.py defines MTRAINS_HAVE_LIBURING
// when liburing (headers and library) is present; without it this file only says so.
#include "storage/file_engines.h"

#ifdef MTRAINS_HAVE_LIBURING
#include <liburing.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <string>

#include "common/aligned_buffer.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#endif

namespace mtrains {

#ifdef MTRAINS_HAVE_LIBURING
namespace {

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

// io_uring engine: keeps up to queue_depth parts in flight per call. Reads (and read
// streams) and writes have a ring each, so a write from one thread runs beside a read
// stream of another (BlockStore::Exchange writes evicted rows while it reads).
//
// Read streams (the cache's misses, one block each) use the kernel's registered resources
// where it grants them: the files are registered with the read ring once (a read then skips
// the kernel's lookup and reference count of the descriptor) and the stream's kept buffer
// pool each time it is allocated (no page pinning per read). Where registration is refused
// (a memlock limit, an old kernel) the stream reads as before; Describe() says which.
class UringFileDevice final : public Device {
 public:
  UringFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet> files, io_uring ring,
                  io_uring write_ring)
      : Device(o.size, o.alignment), files_(std::move(files)), ring_(ring),
        write_ring_(write_ring), depth_(o.queue_depth) {
    MutexLock lock(&mu_);
    const std::vector<int>& fds = files_->fds();
    const int rc = io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size()));
    fixed_files_ = rc == 0;
    if (rc != 0) files_error_ = ErrnoText(-rc);
  }
  ~UringFileDevice() override {
    // Registered files and buffers are let go now: a ring's teardown is asynchronous, and
    // until it ends the kernel holds the files open (a read-only remount right after the
    // store closed would fail as busy).
    MutexLock lock(&mu_);
    if (fixed_files_) io_uring_unregister_files(&ring_);
    if (registered_pool_) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
    io_uring_queue_exit(&write_ring_);
  }
  Status DataExtents(uint64_t begin, uint64_t end,
                     std::vector<std::pair<uint64_t, uint64_t>>* out) const override {
    files_->DataExtents(begin, end, out);
    return Status::Ok();
  }
  std::string Describe() const override {
    MutexLock lock(&mu_);
    std::string registered = fixed_files_ ? "fixed files" : "plain files (" + files_error_ + ")";
    if (registered_pool_) registered += ", registered buffers";
    if (!buffers_error_.empty()) registered += ", plain buffers (" + buffers_error_ + ")";
    return "io_uring qd=" + std::to_string(depth_) + " (read streams: " + registered + ") on " +
           files_->JoinedPaths();
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
      uint32_t file_index;  // the fd's position among the registered files
      uint64_t file_off;
      uint32_t done;
      uint64_t started;
    };
    std::vector<Extent> where(n);
    for (size_t i = 0; i < n; ++i) {
      if (!files_->Locate(offsets[i], len, &where[i].fd, &where[i].file_off, &where[i].file_index))
        return Device::ReadStreamImpl(offsets, n, len, window, on_done);
    }
    MutexLock lock(&mu_);
    io_uring* const ring = &ring_;  // used by the lambdas below, all run under mu_
    const uint32_t pool_size = std::max<uint32_t>(window, 2 * depth_);
    // The pool is kept from call to call (a read stream per step would otherwise allocate,
    // zero and fault in its buffers every time).
    if (read_pool_.size() < size_t(pool_size) * len) {
      if (registered_pool_) io_uring_unregister_buffers(ring);
      read_pool_ = AlignedBuffer(size_t(pool_size) * len, alignment());
      iovec iov{read_pool_.data(), read_pool_.size()};
      const int rc = io_uring_register_buffers(ring, &iov, 1);
      registered_pool_ = rc == 0;
      buffers_error_ = rc == 0 ? "" : ErrnoText(-rc);
    }
    uint8_t* const pool = read_pool_.data();
    const bool fixed_buffer = registered_pool_, fixed_file = fixed_files_;
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
        const int file = fixed_file ? static_cast<int>(e.file_index) : e.fd;
        uint8_t* const buf = pool + size_t(s) * len + e.done;
        if (fixed_buffer) {
          io_uring_prep_read_fixed(sqe, file, buf, len - e.done, e.file_off + e.done, 0);
        } else {
          io_uring_prep_read(sqe, file, buf, len - e.done, e.file_off + e.done);
        }
        if (fixed_file) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
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
            err = files_->PartError({e.fd, e.file_off, nullptr, len, e.index}, false, -res);
          free_slots.push_back(s);
        } else if (res == 0) {  // past end of file reads as zeros
          std::memset(pool + size_t(s) * len + e.done, 0, len - e.done);
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
        if (err.ok()) err = on_done(slot[s].index, pool + size_t(s) * len);
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
          if (first_error.ok()) first_error = files_->PartError(p, write, -res);
        } else if (res == 0 && !write) {
          std::memset(p.buf + progress[i], 0, p.len - progress[i]);  // past end of file
          Finish(write, started[i]);
        } else if (res == 0) {
          if (first_error.ok()) first_error = files_->PartError(p, write, EIO);
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
  mutable Mutex mu_;
  Mutex write_mu_;
  io_uring ring_ GUARDED_BY(mu_);              // reads and read streams
  AlignedBuffer read_pool_ GUARDED_BY(mu_);    // read streams' buffers, kept between calls
  bool fixed_files_ GUARDED_BY(mu_) = false;      // files_->fds() registered with ring_
  bool registered_pool_ GUARDED_BY(mu_) = false;  // read_pool_ registered with ring_ (index 0)
  std::string files_error_ GUARDED_BY(mu_), buffers_error_ GUARDED_BY(mu_);  // why refused
  io_uring write_ring_ GUARDED_BY(write_mu_);  // writes
  const uint32_t depth_;
};

}  // namespace

Status NewUringFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet>* files,
                          std::unique_ptr<Device>* out) {
  io_uring ring, write_ring;
  const unsigned entries = std::max<uint32_t>(o.queue_depth, 8);
  int rc = InitRing(entries, &ring);
  if (rc == 0) {
    rc = InitRing(entries, &write_ring);
    if (rc != 0) io_uring_queue_exit(&ring);
  }
  if (rc != 0) return Status::IoError(-rc, ErrnoText(-rc));
  *out = std::make_unique<UringFileDevice>(o, std::move(*files), ring, write_ring);
  return Status::Ok();
}

#else

Status NewUringFileDevice(const FileDeviceOptions&, std::unique_ptr<FileSet>*, std::unique_ptr<Device>*) {
  return Status::IoError(ENOSYS, "this build has no liburing; rebuild with liburing-dev installed");
}

#endif  // MTRAINS_HAVE_LIBURING

}  // namespace mtrains
