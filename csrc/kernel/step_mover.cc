#include "kernel/step_mover.h"

#include <time.h>

#include <string>

namespace mtrains {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

StepMover::StepMover(size_t num_tables) : num_tables_(num_tables) {
  MutexLock lock(&mu_);
  tiers_.resize(num_tables);
  counters_.resize(num_tables);
}

void StepMover::SetTier(size_t table, std::unique_ptr<TierRows> tier) {
  MutexLock lock(&mu_);
  tiers_.at(table) = std::move(tier);
}

Status StepMover::WrapTier(size_t table,
                           const std::function<std::unique_ptr<TierRows>(std::unique_ptr<TierRows>)>& wrap) {
  MutexLock lock(&mu_);
  if (table >= tiers_.size() || tiers_[table] == nullptr)
    return Status::InvalidArgument("table " + std::to_string(table) + " has no tier to wrap");
  tiers_[table] = wrap(std::move(tiers_[table]));
  return Status::Ok();
}

MoveCounters StepMover::counters(size_t table) const {
  MutexLock lock(&mu_);
  return counters_.at(table);
}

Status StepMover::Move(const TableMove& m, MoveResult* result) {
  MutexLock lock(&mu_);
  result->overflow_positions.clear();
  result->overflow_rows.clear();
  result->lazy_rows = 0;
  if (m.table >= tiers_.size() || tiers_[m.table] == nullptr)
    return Status::InvalidArgument("table " + std::to_string(m.table) + " has no tier to move rows to");
  TierRows& tier = *tiers_[m.table];
  for (size_t i = 0; i < m.num_evict; ++i)
    if (m.evict_slots[i] < 0 || m.evict_slots[i] >= m.slots.slots)
      return Status::InvalidArgument("table " + std::to_string(m.table) + ": evicted slot " +
                                     std::to_string(m.evict_slots[i]) + " is outside the TBE's " +
                                     std::to_string(m.slots.slots) + " slots");
  // Loads into slots the TBE has go straight in; the others are read after the move (so
  // they see its writes) into the result.
  const int64_t* load_ids = m.load_ids;
  const int64_t* load_slots = m.load_slots;
  size_t num_load = m.num_load;
  for (size_t i = 0; i < m.num_load; ++i) {
    if (m.load_slots[i] < 0) return Status::InvalidArgument("negative load slot");
    if (m.load_slots[i] >= m.slots.slots) result->overflow_positions.push_back(int64_t(i));
  }
  in_ids_.clear();
  in_slots_.clear();
  out_ids_.clear();
  if (!result->overflow_positions.empty()) {
    for (size_t i = 0; i < m.num_load; ++i) {
      if (m.load_slots[i] < m.slots.slots) {
        in_ids_.push_back(m.load_ids[i]);
        in_slots_.push_back(m.load_slots[i]);
      } else {
        out_ids_.push_back(m.load_ids[i]);
      }
    }
    load_ids = in_ids_.data();
    load_slots = in_slots_.data();
    num_load = in_ids_.size();
  }
  MoveCounters& c = counters_[m.table];
  const uint64_t lazy_before = c.cpu.lazy_rows;
  Status st = tier.Move(m.slots, m.evict_ids, m.evict_slots, m.num_evict, load_ids, load_slots, num_load, &c.cpu);
  if (st.ok() && !out_ids_.empty()) {
    result->overflow_rows.resize(out_ids_.size() * tier.row_bytes());
    st = tier.Read(out_ids_.data(), out_ids_.size(), result->overflow_rows.data(), &c.cpu);
  }
  result->lazy_rows = c.cpu.lazy_rows - lazy_before;
  if (!st.ok()) return st;
  c.rows_loaded += m.num_load;
  c.rows_written_back += m.num_evict;
  ++c.moves;
  return Status::Ok();
}

}  // namespace mtrains
