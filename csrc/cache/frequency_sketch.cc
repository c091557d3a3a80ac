#include "cache/frequency_sketch.h"

#include <algorithm>
#include <stdexcept>

namespace mtrains {
namespace {

constexpr uint32_t kDoorkeeperHashes = 3;
constexpr uint64_t kSampleFactor = 10;  // additions per sample period, per cache entry
constexpr uint64_t kDoorkeeperBitsPerAddition = 8;  // about 3% false positives at worst

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint64_t PowerOfTwoAtLeast(uint64_t n) {
  uint64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Double hashing (Kirsch-Mitzenmacher): probe k of a key is h1 + k * h2 (h2 odd).
struct Probes {
  uint64_t h1, h2;
  explicit Probes(uint64_t h) : h1(h & 0xFFFFFFFFull), h2((h >> 32) | 1) {}
  uint64_t operator()(uint32_t k) const { return h1 + k * h2; }
};

}  // namespace

FrequencySketch::FrequencySketch(uint64_t capacity)
    : width_(PowerOfTwoAtLeast(std::max<uint64_t>(capacity, 64))),
      sample_size_(kSampleFactor * std::max<uint64_t>(capacity, 1)),
      counters_(kDepth * width_, 0),
      doorkeeper_(PowerOfTwoAtLeast(kDoorkeeperBitsPerAddition * sample_size_) / 64 + 1, 0),
      doorkeeper_mask_(PowerOfTwoAtLeast(kDoorkeeperBitsPerAddition * sample_size_) - 1) {
  if (capacity == 0) throw std::invalid_argument("FrequencySketch capacity must be >= 1");
}

uint32_t FrequencySketch::Estimate(uint64_t key) const {
  const Probes door(Mix(key ^ 0x9E3779B97F4A7C15ull));
  uint32_t in_door = 1;
  for (uint32_t k = 0; k < kDoorkeeperHashes && in_door; ++k) {
    const uint64_t bit = door(k) & doorkeeper_mask_;
    in_door = (doorkeeper_[bit >> 6] >> (bit & 63)) & 1;
  }
  const Probes p(Mix(key ^ 0x5851F42D4C957F2Dull));
  uint32_t c = kMaxCount;
  for (uint32_t k = 0; k < kDepth; ++k)
    c = std::min<uint32_t>(c, counters_[k * width_ + (p(k) & (width_ - 1))]);
  return c + in_door;
}

bool FrequencySketch::Add(uint64_t key) {
  const Probes door(Mix(key ^ 0x9E3779B97F4A7C15ull));
  bool seen = true;
  for (uint32_t k = 0; k < kDoorkeeperHashes; ++k) {
    const uint64_t bit = door(k) & doorkeeper_mask_;
    uint64_t& word = doorkeeper_[bit >> 6];
    const uint64_t mask = uint64_t{1} << (bit & 63);
    if (!(word & mask)) {
      seen = false;
      word |= mask;
    }
  }
  if (seen) {  // a repeat in this period: count it
    const Probes p(Mix(key ^ 0x5851F42D4C957F2Dull));
    for (uint32_t k = 0; k < kDepth; ++k) {
      uint8_t& c = counters_[k * width_ + (p(k) & (width_ - 1))];
      if (c < kMaxCount) ++c;
    }
  }
  if (++additions_ < sample_size_) return false;
  Age();
  return true;
}

void FrequencySketch::Age() {
  for (uint8_t& c : counters_) c >>= 1;
  std::fill(doorkeeper_.begin(), doorkeeper_.end(), 0);
  additions_ = 0;
}

}  // namespace mtrains
