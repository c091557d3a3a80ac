// The pread/pwrite thread-pool engine of FileDevice (file_engines.h): portable, and the
// fallback where io_uring is refused.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "storage/file_engines.h"

namespace mtrains {
namespace {

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
  Status DataExtents(uint64_t begin, uint64_t end,
                     std::vector<std::pair<uint64_t, uint64_t>>* out) const override {
    files_->DataExtents(begin, end, out);
    return Status::Ok();
  }
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
          if (first_error.ok()) first_error = files_->PartError(p, write, err);
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

std::unique_ptr<Device> NewThreadPoolFileDevice(const FileDeviceOptions& o, std::unique_ptr<FileSet> files) {
  return std::make_unique<ThreadPoolFileDevice>(o, std::move(files));
}

}  // namespace mtrains
