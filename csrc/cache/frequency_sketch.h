// FrequencySketch: TinyLFU's approximate access frequencies (the "tinylfu" cache policy).
//
// A count-min sketch of 4 rows x `width` 4-bit counters (saturating at 15) behind a
// doorkeeper, a Bloom filter: a key's first addition in a sample period only sets its
// doorkeeper bits, later ones increment its 4 counters; the estimate is the smallest of
// them plus the doorkeeper bit. Keys seen once (most of a skewed stream's distinct keys)
// thus never touch the counters, which keeps their over-estimates small. Aging: after
// `sample_size` additions every counter is halved and the doorkeeper cleared, so
// popularity fades and the sketch follows a drifting stream.
//
// Error bound (count-min, within one sample period): estimate >= min(true count, 15), and
// estimate - true count <= e / width * N + 1 with probability >= 1 - e^-4 per key, N being
// the additions that reached the counters (the +1: a doorkeeper false positive).
// Not thread-safe: its owner serialises calls (SetAssociativeCache holds its mutex).
#pragma once

#include <cstdint>
#include <vector>

namespace mtrains {

class FrequencySketch {
 public:
  static constexpr uint32_t kDepth = 4;
  static constexpr uint32_t kMaxCount = 15;  // 4-bit counters

  // `capacity`: entries of the cache it serves (>= 1). Width: the power of two >= capacity
  // (at least 64); sample: 10 x capacity additions; doorkeeper: 8 bits per sample addition.
  explicit FrequencySketch(uint64_t capacity);

  // Records one occurrence of `key`. Returns true when it completed a sample period (the
  // counters were halved and the doorkeeper cleared after counting it).
  bool Add(uint64_t key);
  // Estimated occurrences of `key` in the current period plus the halved earlier ones.
  uint32_t Estimate(uint64_t key) const;

  uint64_t width() const { return width_; }
  uint64_t sample_size() const { return sample_size_; }
  uint64_t additions() const { return additions_; }  // in the current sample period

 private:
  void Age();

  uint64_t width_;
  uint64_t sample_size_;
  uint64_t additions_ = 0;
  std::vector<uint8_t> counters_;  // kDepth rows of width_ (one 4-bit count per byte)
  std::vector<uint64_t> doorkeeper_;
  uint64_t doorkeeper_mask_;  // bits - 1 (a power of two)
};

}  // namespace mtrains
