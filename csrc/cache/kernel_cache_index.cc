#include "cache/kernel_cache_index.h"

#include <stdexcept>
#include <string>

namespace mtrains {

namespace {

std::vector<TableCacheSpec> WithoutMaps(const std::vector<uint64_t>& slots) {
  std::vector<TableCacheSpec> tables;
  for (uint64_t n : slots) tables.push_back(TableCacheSpec{n, 0, false, false});
  return tables;
}

std::unique_ptr<SetAssociativeCache> NewCache(const TableCacheSpec& t, uint32_t ways, CachePolicy policy) {
  return std::make_unique<SetAssociativeCache>(t.slots, ways, policy, t.dense_map ? t.rows : 0, t.keyed);
}

}  // namespace

KernelCacheIndex::KernelCacheIndex(const std::vector<TableCacheSpec>& tables, uint32_t ways,
                                   CachePolicy policy)
    : ways_(ways), policy_(policy), tables_(tables) {
  if (tables.empty()) throw std::invalid_argument("a kernel cache index needs at least one table");
  caches_.reserve(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].dense_map && tables[t].rows == 0)
      throw std::invalid_argument("table " + std::to_string(t) +
                                  ": a dense row-to-slot map needs the table's rows (rows=0)");
    if (tables[t].dense_map && tables[t].keyed)
      throw std::invalid_argument("table " + std::to_string(t) +
                                  ": a keyed cache has no dense row-to-slot map (its keys are not bounded)");
    if (tables[t].keyed) keyed_tables_.push_back(t);
    try {
      caches_.push_back(NewCache(tables[t], ways, policy));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("table " + std::to_string(t) + ": " + e.what());
    }
  }
  MutexLock lock(&plan_mu_);
  scratch_.resize(tables.size());
}

KernelCacheIndex::KernelCacheIndex(const std::vector<uint64_t>& slots, uint32_t ways, CachePolicy policy)
    : KernelCacheIndex(WithoutMaps(slots), ways, policy) {}

void KernelCacheIndex::Reset(size_t table) {
  MutexLock lock(&plan_mu_);
  caches_.at(table) = NewCache(tables_.at(table), ways_, policy_);
}

void KernelCacheIndex::ReleaseAfter(int64_t last_live_step) {
  MutexLock lock(&plan_mu_);
  for (auto& cache : caches_) cache->ReleaseAfter(last_live_step);
}

void KernelCacheIndex::Reserve(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step) {
  CheckBounds(bounds);
  MutexLock lock(&plan_mu_);
  for (size_t t = 0; t < caches_.size(); ++t)
    caches_[t]->Reserve(indices + bounds[t], size_t(bounds[t + 1] - bounds[t]), step);
}

void KernelCacheIndex::CheckBounds(const std::vector<int64_t>& bounds) const {
  if (bounds.size() != caches_.size() + 1)
    throw std::invalid_argument("bounds has " + std::to_string(bounds.size()) + " entries for " +
                                std::to_string(caches_.size()) + " tables; expected tables + 1");
  for (size_t t = 0; t < caches_.size(); ++t)
    if (bounds[t] < 0 || bounds[t + 1] < bounds[t])
      throw std::invalid_argument("bounds must be non-negative and non-decreasing");
}

size_t KernelCacheIndex::PlanStep(const int64_t* indices, const std::vector<int64_t>& bounds, int64_t step,
                                  int64_t oldest_live_step, bool train, int64_t* slot_of_index,
                                  std::vector<TableMoves>* moves, MissResolver* resolver, int64_t* tier_row_of_index,
                                  Status* status) {
  CheckBounds(bounds);
  CheckKeyedArgs(resolver, tier_row_of_index, status);
  if (status != nullptr) *status = Status::Ok();
  MutexLock lock(&plan_mu_);
  if (!keyed_tables_.empty()) {
    Status st = LockAndResolveKeyed(indices, bounds, step, oldest_live_step, train, slot_of_index, resolver,
                                    tier_row_of_index);
    if (!st.ok()) {
      *status = std::move(st);
      return 0;
    }
  }
  size_t used = 0;
  for (size_t t = 0; t < caches_.size(); ++t) {
    const int64_t lo = bounds[t], n = bounds[t + 1] - lo;
    StepPlan& plan = scratch_[t];
    if (tables_[t].keyed)
      caches_[t]->PlaceMisses(indices + lo, size_t(n), tier_row_of_index + lo, step, oldest_live_step, train,
                              slot_of_index + lo, &plan);
    else
      caches_[t]->PlanInto(indices + lo, size_t(n), step, oldest_live_step, train, slot_of_index + lo, &plan);
    AddMoves(t, plan, moves, &used);
  }
  return used;
}

void KernelCacheIndex::CheckKeyedArgs(const MissResolver* resolver, const int64_t* tier_row_of_index,
                                      const Status* status) const {
  if (keyed_tables_.empty() || (resolver != nullptr && tier_row_of_index != nullptr && status != nullptr)) return;
  throw std::invalid_argument("table " + std::to_string(keyed_tables_.front()) +
                              " is keyed: PlanStep needs a miss resolver, tier_row_of_index and a status");
}

Status KernelCacheIndex::LockAndResolveKeyed(const int64_t* indices, const std::vector<int64_t>& bounds,
                                             int64_t step, int64_t oldest_live_step, bool train,
                                             int64_t* slot_of_index, MissResolver* resolver,
                                             int64_t* tier_row_of_index) {
  for (size_t t : keyed_tables_) {
    const int64_t lo = bounds[t], n = bounds[t + 1] - lo;
    SetAssociativeCache& cache = *caches_[t];
    const int64_t* keys = indices + lo;
    int64_t* tier_row_of = tier_row_of_index + lo;
    const size_t num_misses = cache.LockHits(keys, size_t(n), step, train, slot_of_index + lo, tier_row_of);
    const std::vector<size_t>& misses = cache.misses();
    // An entry the resolver leaves unfilled then reads as no row, not as a stale one.
    for (size_t i : misses) tier_row_of[i] = -1;
    MTRAINS_RETURN_IF_ERROR(resolver->ResolveMisses(t, step, oldest_live_step, keys, size_t(n), slot_of_index + lo,
                                                    misses.data(), num_misses, tier_row_of));
    for (size_t i : misses)
      if (tier_row_of[i] < 0)
        throw std::invalid_argument("table " + std::to_string(t) + ": the miss resolver gave key " +
                                    std::to_string(keys[i]) + " at position " + std::to_string(i) +
                                    " no tier row (" + std::to_string(tier_row_of[i]) + ")");
  }
  return Status::Ok();
}

void KernelCacheIndex::AddMoves(size_t table, const StepPlan& plan, std::vector<TableMoves>* moves, size_t* used) {
  if (plan.load_rows.empty() && plan.evict_rows.empty()) return;
  if (*used == moves->size()) moves->emplace_back();
  TableMoves& m = (*moves)[(*used)++];
  m.table = int64_t(table);
  m.load_rows.assign(plan.load_rows.begin(), plan.load_rows.end());
  m.load_slots.assign(plan.load_slots.begin(), plan.load_slots.end());
  m.evict_rows.assign(plan.evict_rows.begin(), plan.evict_rows.end());
  m.evict_slots.assign(plan.evict_slots.begin(), plan.evict_slots.end());
}

}  // namespace mtrains
