#include "cache/kernel_cache_index.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace mtrains {

KernelCacheIndex::KernelCacheIndex(const std::vector<uint64_t>& slots, uint32_t ways,
                                   CachePolicy policy)
    : ways_(ways), policy_(policy), slots_(slots) {
  if (slots.empty()) throw std::invalid_argument("a kernel cache index needs at least one table");
  caches_.reserve(slots.size());
  for (uint64_t n : slots) caches_.push_back(std::make_unique<SetAssociativeCache>(n, ways, policy));
  MutexLock lock(&plan_mu_);
  scratch_.resize(slots.size());
}

void KernelCacheIndex::Reset(size_t table) {
  MutexLock lock(&plan_mu_);
  caches_.at(table) = std::make_unique<SetAssociativeCache>(slots_.at(table), ways_, policy_);
}

size_t KernelCacheIndex::PlanStep(const int64_t* indices, const std::vector<int64_t>& bounds,
                                int64_t step, int64_t oldest_live_step, bool train,
                                int64_t* slot_of_index, std::vector<TableMoves>* moves) {
  if (bounds.size() != caches_.size() + 1)
    throw std::invalid_argument("bounds has " + std::to_string(bounds.size()) + " entries for " +
                                std::to_string(caches_.size()) + " tables; expected tables + 1");
  for (size_t t = 0; t < caches_.size(); ++t)
    if (bounds[t] < 0 || bounds[t + 1] < bounds[t])
      throw std::invalid_argument("bounds must be non-negative and non-decreasing");
  MutexLock lock(&plan_mu_);
  size_t used = 0;
  for (size_t t = 0; t < caches_.size(); ++t) {
    const int64_t lo = bounds[t], n = bounds[t + 1] - lo;
    StepPlan& plan = scratch_[t];
    caches_[t]->Plan(indices + lo, size_t(n), step, oldest_live_step, train, &plan);
    if (n) std::memcpy(slot_of_index + lo, plan.slot_of_index.data(), size_t(n) * sizeof(int64_t));
    if (plan.load_rows.empty() && plan.evict_rows.empty()) continue;
    if (used == moves->size()) moves->emplace_back();
    TableMoves& m = (*moves)[used++];
    m.table = int64_t(t);
    m.load_rows.assign(plan.load_rows.begin(), plan.load_rows.end());
    m.load_slots.assign(plan.load_slots.begin(), plan.load_slots.end());
    m.evict_rows.assign(plan.evict_rows.begin(), plan.evict_rows.end());
    m.evict_slots.assign(plan.evict_slots.begin(), plan.evict_slots.end());
  }
  return used;
}

}  // namespace mtrains
