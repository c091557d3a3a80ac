#include "common/latency_histogram.h"

#include <ctime>

namespace mtrains {

uint64_t NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

int LatencyHistogram::BucketOf(uint64_t nanos) {
  if (nanos < kSubBuckets) return static_cast<int>(nanos);
  const int log2 = 63 - __builtin_clzll(nanos);  // >= 3
  const int sub = static_cast<int>((nanos >> (log2 - 3)) & (kSubBuckets - 1));
  return (log2 - 2) * kSubBuckets + sub;
}

double LatencyHistogram::BucketUpperBound(int bucket) {
  if (bucket < kSubBuckets) return bucket;
  const int log2 = bucket / kSubBuckets + 2;
  const int sub = bucket % kSubBuckets;
  return static_cast<double>((1ull << log2) + (static_cast<uint64_t>(sub + 1) << (log2 - 3)));
}

void LatencyHistogram::Record(uint64_t nanos) {
  counts_[BucketOf(nanos)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t LatencyHistogram::Count() const {
  uint64_t n = 0;
  for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
  return n;
}

double LatencyHistogram::Percentile(double fraction) const {
  const uint64_t total = Count();
  if (total == 0) return 0.0;
  const double target = fraction * static_cast<double>(total);
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[b].load(std::memory_order_relaxed);
    if (static_cast<double>(seen) >= target && seen > 0) return BucketUpperBound(b);
  }
  return BucketUpperBound(kBuckets - 1);
}

void LatencyHistogram::Reset() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
}

}  // namespace mtrains
