// LatencyHistogram: lock-free log-linear histogram of latencies in nanoseconds.
//
// Buckets are powers of two split into 8 linear sub-buckets, so a percentile is exact to
// within 12.5%. Record() and Percentile() may be called from any thread at once.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace mtrains {

class LatencyHistogram {
 public:
  void Record(uint64_t nanos);
  // Returns the latency (ns) below which `fraction` (0..1) of recorded samples lie, 0 if none.
  double Percentile(double fraction) const;
  uint64_t Count() const;
  void Reset();

 private:
  static constexpr int kSubBuckets = 8;
  static constexpr int kBuckets = 64 * kSubBuckets;
  static int BucketOf(uint64_t nanos);
  static double BucketUpperBound(int bucket);

  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
};

// Monotonic clock in nanoseconds.
uint64_t NowNanos();

}  // namespace mtrains
