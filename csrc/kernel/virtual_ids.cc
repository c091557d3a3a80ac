#include "kernel/virtual_ids.h"

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <limits>
#include <stdexcept>

namespace mtrains {
namespace {

uint32_t ClampSeconds(int64_t s) { return uint32_t(std::clamp<int64_t>(s, 0, int64_t(UINT32_MAX))); }

// IdIndex::Map's refusal of ids that would not fit the free rows.
bool OutOfRows(const Status& st) { return st.code() == StatusCode::kIoError && st.sys_errno() == ENOSPC; }

}  // namespace

void VirtualIds::Add(VirtualTable t) {
  MutexLock lock(&mu_);
  if (t.index == nullptr) throw std::invalid_argument("virtual table " + t.name + " has no id index");
  if (t.table >= cache_->num_tables() || !cache_->keyed(t.table))
    throw std::invalid_argument("virtual table " + t.name + ": table " + std::to_string(t.table) +
                                " of the cache index is not keyed by id");
  if (IsVirtual(t.table))
    throw std::invalid_argument("table " + std::to_string(t.table) + " is named twice as a virtual table");
  if (t.by_norm && norm_.evict == nullptr)
    throw std::invalid_argument("virtual table " + t.name + ": its L2-norm policy needs a pass to call");
  if (t.table >= slot_of_table_.size()) slot_of_table_.resize(t.table + 1, -1);
  slot_of_table_[t.table] = int(states_.size());
  states_.emplace_back();
  states_.back().spec = std::move(t);
  PassDone(states_.back());
}

VirtualIds::State& VirtualIds::StateOf(size_t table) {
  if (!IsVirtual(table)) throw std::invalid_argument("table " + std::to_string(table) + " is not a virtual table");
  return states_[size_t(slot_of_table_[table])];
}

const VirtualIds::State& VirtualIds::StateOf(size_t table) const {
  if (!IsVirtual(table)) throw std::invalid_argument("table " + std::to_string(table) + " is not a virtual table");
  return states_[size_t(slot_of_table_[table])];
}

void VirtualIds::SetNow(size_t table, int64_t now) {
  MutexLock lock(&mu_);
  StateOf(table).given_now = now;
}

void VirtualIds::Now(std::vector<uint32_t>* out) const {
  const int64_t wall = int64_t(std::time(nullptr));
  MutexLock lock(&mu_);
  out->resize(states_.size());
  for (size_t k = 0; k < states_.size(); ++k)
    (*out)[k] = ClampSeconds(states_[k].spec.wall_clock ? wall : states_[k].given_now);
}

void VirtualIds::BeginStep(const std::vector<uint32_t>& now) {
  MutexLock lock(&mu_);
  for (size_t k = 0; k < states_.size() && k < now.size(); ++k) states_[k].now = now[k];
}

Status VirtualIds::ResolveMisses(size_t table, int64_t step, int64_t oldest_live_step, const int64_t* keys,
                                 size_t n, const int64_t* slot_of, const size_t* misses, size_t num_misses,
                                 int64_t* tier_row_of) {
  MutexLock lock(&mu_);
  State& s = StateOf(table);
  IdIndex& index = *s.spec.index;
  s.created.clear();
  const bool replay = s.replay > 0;
  if (replay) --s.replay;
  if (n == 0) return Status::Ok();
  s.cache_found += n - num_misses;
  s.index_lookups += num_misses;
  miss_ids_.resize(num_misses);
  miss_rows_.resize(num_misses);
  for (size_t k = 0; k < num_misses; ++k) miss_ids_[k] = keys[misses[k]];
  if (replay) {
    // The saved run's step: every id has its row, and its accesses are in the checkpoint.
    index.Find(miss_ids_.data(), num_misses, miss_rows_.data());
    if (std::all_of(miss_rows_.begin(), miss_rows_.end(), [](int64_t r) { return r >= 0; })) {
      for (size_t k = 0; k < num_misses; ++k) tier_row_of[misses[k]] = miss_rows_[k];
      RecordStep(s, step, tier_row_of, n);
      return Status::Ok();
    }
    s.replay = 0;  // another batch than the saved run's: mapped as any
  }
  created_at_.clear();
  Status st = index.Map(miss_ids_.data(), num_misses, true, s.now, miss_rows_.data(), &created_at_);
  if (OutOfRows(st)) {
    if (!s.spec.evicts()) return FullError(s, miss_ids_.data(), num_misses);
    // The rows run out: a pass first, keeping this step's rows (its hits', its found ids').
    ProtectedRows(s, oldest_live_step);
    for (size_t i = 0; i < n; ++i)
      if (slot_of[i] >= 0) keep_.push_back(tier_row_of[i]);
    index.Find(miss_ids_.data(), num_misses, miss_rows_.data());
    for (int64_t r : miss_rows_)
      if (r >= 0) keep_.push_back(r);
    st = EvictPass(s, step);
    if (!st.ok()) return st;
    created_at_.clear();
    st = index.Map(miss_ids_.data(), num_misses, true, s.now, miss_rows_.data(), &created_at_);
    if (OutOfRows(st)) return FullError(s, miss_ids_.data(), num_misses);
  }
  if (!st.ok()) return st;
  for (size_t k = 0; k < num_misses; ++k) tier_row_of[misses[k]] = miss_rows_[k];
  for (int64_t at : created_at_) s.created.push_back(int64_t(misses[size_t(at)]));
  if (index.keeps_metadata()) {  // the hits' accesses, by row: no lookup
    hit_rows_.clear();
    for (size_t i = 0; i < n; ++i)
      if (slot_of[i] >= 0) hit_rows_.push_back(tier_row_of[i]);
    index.Touch(hit_rows_.data(), hit_rows_.size(), s.now);
  }
  RecordStep(s, step, tier_row_of, n);
  const uint64_t live = index.live();
  if (s.spec.evicts() && s.spec.trigger_ids > 0 && live > s.spec.trigger_ids && live >= s.next_pass_at) {
    ProtectedRows(s, oldest_live_step);  // this step's rows are among the live steps'
    return EvictPass(s, step);
  }
  return Status::Ok();
}

void VirtualIds::RecordStep(State& s, int64_t step, const int64_t* rows, size_t n) {
  if (!s.spec.evicts()) return;  // no pass ever runs: nothing to protect
  std::vector<int64_t> v;
  if (!s.spare.empty()) {
    v = std::move(s.spare.back());
    s.spare.pop_back();
  }
  v.assign(rows, rows + n);
  s.step_rows.emplace_back(step, std::move(v));
}

void VirtualIds::ProtectedRows(State& s, int64_t oldest_live) {
  while (!s.step_rows.empty() && s.step_rows.front().first < oldest_live) {
    s.spare.push_back(std::move(s.step_rows.front().second));
    s.step_rows.pop_front();
  }
  keep_.clear();
  for (const auto& [step, rows] : s.step_rows) keep_.insert(keep_.end(), rows.begin(), rows.end());
}

Status VirtualIds::EvictPass(State& s, int64_t step) {
  if (s.spec.by_norm) {
    if (norm_.evict(norm_.context, step, int64_t(s.spec.table), keep_.data(), int64_t(keep_.size())) < 0)
      return Status::InvalidArgument("virtual table " + s.spec.name + ": its L2-norm eviction pass failed");
  } else {
    evicted_ids_.clear();
    evicted_rows_.clear();
    s.spec.index->Evict(s.spec.rule, s.now, keep_.data(), keep_.size(), &evicted_ids_, &evicted_rows_);
    // Their rows now belong to no id: dropped from the cache unwritten.
    if (!evicted_ids_.empty()) cache_->cache(s.spec.table).Forget(evicted_ids_.data(), evicted_ids_.size());
  }
  PassDone(s);
  return Status::Ok();
}

void VirtualIds::PassDone(State& s) {
  // The next pass waits until the live ids grow by 1% of the trigger (of the rows, without one).
  const uint64_t basis = s.spec.trigger_ids ? s.spec.trigger_ids : s.spec.index->capacity();
  s.next_pass_at = s.spec.index->live() + std::max<uint64_t>(1, basis / 100);
}

Status VirtualIds::FullError(const State& s, const int64_t* ids, size_t n) const {
  const IdIndex& index = *s.spec.index;
  const std::string policy = s.spec.evicts() ? "its eviction policy keeps them" : "it has no eviction policy";
  return Status::IoError(ENOSPC, "virtual table " + s.spec.name + ": a step brings " +
                                     std::to_string(index.CountMissing(ids, n)) + " new ids, but " +
                                     std::to_string(index.live()) + " of its " + std::to_string(index.capacity()) +
                                     " rows hold live ids and " + policy +
                                     "; give it more rows (its capacity) or a policy that evicts");
}

void VirtualIds::MarkCreated(size_t table, uint8_t* flags) const {
  MutexLock lock(&mu_);
  for (int64_t at : StateOf(table).created) flags[at] = 1;
}

uint64_t VirtualIds::NextPassAt(size_t table) const {
  MutexLock lock(&mu_);
  return StateOf(table).next_pass_at;
}

std::pair<uint64_t, uint64_t> VirtualIds::Lookups(size_t table) const {
  MutexLock lock(&mu_);
  const State& s = StateOf(table);
  return {s.cache_found, s.index_lookups};
}

void VirtualIds::Dropped(int64_t last_live_step) {
  MutexLock lock(&mu_);
  for (State& s : states_) ForgetStepsAfter(s, last_live_step);
}

void VirtualIds::ForgetStepsAfter(State& s, int64_t step) {
  while (!s.step_rows.empty() && s.step_rows.back().first > step) {
    s.spare.push_back(std::move(s.step_rows.back().second));
    s.step_rows.pop_back();
  }
}

void VirtualIds::Restored(size_t table, uint64_t replay, int64_t next_pass_at) {
  MutexLock lock(&mu_);
  State& s = StateOf(table);
  s.replay = replay;
  ForgetStepsAfter(s, std::numeric_limits<int64_t>::min());
  if (next_pass_at < 0)
    PassDone(s);
  else
    s.next_pass_at = uint64_t(next_pass_at);
}

}  // namespace mtrains
