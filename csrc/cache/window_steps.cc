#include "cache/window_steps.h"

#include <utility>

namespace mtrains {
namespace {

constexpr size_t kMinCapacity = 1024;

inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
  z = (z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return z ^ (z >> 33);
}

}  // namespace

size_t WindowSteps::SlotOf(int64_t key) const {
  return size_t(Mix(uint64_t(key))) & (table_.size() - 1);
}

bool WindowSteps::Note(int64_t key, int64_t step) {
  if (2 * (used_ + 1) > table_.size()) Rebuild(kMinCapacity);
  for (size_t s = SlotOf(key);; s = (s + 1) & (table_.size() - 1)) {
    Entry& e = table_[s];
    if (e.step == kNone) {
      e = Entry{key, step};
      ++used_;
      return true;
    }
    if (e.key == key) {
      if (e.step >= step) return false;
      e.step = step;
      return true;
    }
  }
}

int64_t WindowSteps::Find(int64_t key, int64_t after) const {
  if (used_ == 0) return kNone;
  for (size_t s = SlotOf(key);; s = (s + 1) & (table_.size() - 1)) {
    const Entry& e = table_[s];
    if (e.step == kNone) return kNone;
    if (e.key == key) return e.step > after ? e.step : kNone;
  }
}

void WindowSteps::Clear() {
  table_.clear();
  used_ = 0;
}

void WindowSteps::Rebuild(size_t min_capacity) {
  Table old;
  old.swap(table_);
  size_t live = 0;
  for (const Entry& e : old) live += e.step > planned_through_;
  // Four slots a live entry: the table fills to half again after as many new entries.
  size_t capacity = min_capacity;
  while (capacity < 4 * (live + 1)) capacity <<= 1;
  table_.assign(capacity, Entry{});
  used_ = 0;
  for (const Entry& e : old) {
    if (e.step <= planned_through_) continue;
    for (size_t s = SlotOf(e.key);; s = (s + 1) & (capacity - 1)) {
      if (table_[s].step == kNone) {
        table_[s] = e;
        ++used_;
        break;
      }
    }
  }
}

}  // namespace mtrains
