#include "kernel/step_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <utility>

namespace mtrains {
namespace {

// The table of each feature: as given, or one feature per table when none is given.
std::vector<int64_t> FeatureTables(std::vector<int64_t> table_of_feature, size_t tables) {
  if (table_of_feature.empty())
    for (size_t t = 0; t < tables; ++t) table_of_feature.push_back(int64_t(t));
  return table_of_feature;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StepEngine::StepEngine(KernelCacheIndex* index, StepMover* mover, std::vector<int64_t> id_bounds,
                       std::vector<int64_t> table_of_feature, bool background, EngineHooks hooks,
                       VirtualIds* virtual_ids)
    : index_(index),
      mover_(mover),
      bounds_layout_{id_bounds, FeatureTables(std::move(table_of_feature), id_bounds.size())},
      hooks_(hooks),
      virtual_(virtual_ids),
      write_guard_(new std::atomic<bool>[id_bounds.size()]) {
  if (index == nullptr || mover == nullptr) throw std::invalid_argument("a step engine needs an index and a mover");
  if (id_bounds.empty() || id_bounds.size() != index->num_tables() || id_bounds.size() != mover->num_tables())
    throw std::invalid_argument("a step engine needs one id bound per table of its index and mover");
  for (size_t t = 0; t < id_bounds.size(); ++t) write_guard_[t] = false;
  {
    MutexLock lock(&mu_);
    table_counters_.resize(id_bounds.size());
  }
  if (background) {
    plan_thread_ = std::thread([this] { PlanLoop(); });
    move_thread_ = std::thread([this] { MoveLoop(); });
    plan_id_ = plan_thread_.get_id();
    move_id_ = move_thread_.get_id();
  }
}

StepEngine::~StepEngine() { Shutdown(true); }

StepEngine::Job* StepEngine::NewJob() {
  if (free_.empty()) {
    jobs_.push_back(std::make_unique<Job>());
    free_.push_back(jobs_.back().get());
  }
  Job* job = free_.back();
  free_.pop_back();
  job->stage = Stage::kPlanning;
  job->failure = StepFailure::kNone;
  job->status = Status::Ok();
  job->failed_table = -1;
  job->num_moves = 0;
  job->overflow.clear();
  job->announced = false;
  job->plan_started = false;
  return job;
}

BatchProblem StepEngine::Submit(const StepInput& in) {
  Job* job;
  {
    MutexLock lock(&mu_);
    job = NewJob();
  }
  BatchProblem problem;
  try {
    problem = BatchTableBounds(in.indices, in.n, in.offsets, in.num_offsets, bounds_layout_, in.feature_batch,
                               &job->bounds);
  } catch (...) {
    MutexLock lock(&mu_);
    job->stage = Stage::kFree;
    free_.push_back(job);
    throw;
  }
  if (problem.kind != BatchProblemKind::kOk) {
    MutexLock lock(&mu_);
    job->stage = Stage::kFree;
    free_.push_back(job);
    return problem;
  }
  job->indices = in.indices;
  job->n = in.n;
  job->offsets = in.offsets;
  job->num_offsets = in.num_offsets;
  job->feature_batch = in.feature_batch;
  job->version = in.version;
  job->remapped = in.remapped;
  job->train = in.train;
  if (virtual_ != nullptr) virtual_->Now(&job->now);
  bool hold = false;
  int64_t release_through = 0;  // held steps up to this one run now
  {
    MutexLock lock(&mu_);
    job->step = next_step_++;
    // The step in its backward and every step after it keep their slots.
    job->oldest_live = std::max<int64_t>(0, last_taken_);
    pending_.push_back(job);
    // This step completes the window of the one `lookahead_` before it: that one's plan keeps
    // the steps from the one in its backward now (not those already done when it was submitted).
    if (lookahead_ > 0 && pending_.size() > lookahead_) Unlock(pending_[pending_.size() - 1 - lookahead_]);
    ++in_flight_;
    if (plan_thread_.joinable() && !stopping_) {
      plan_queue_.push_back(job);
      work_.NotifyAll();
      return problem;
    }
    // No stage threads: a window holds the steps back.
    hold = lookahead_ > 0 && !stopping_;
    if (hold) held_.push_back(job);
    release_through = job->step - int64_t(lookahead_);
  }
  if (hold) {
    Announce(job);  // before the steps it releases are planned
    RunHeldThrough(release_through);
    return problem;
  }
  RunHeldThrough(std::numeric_limits<int64_t>::max());  // steps a window held before a Shutdown
  {
    // Inline after a Shutdown whose threads may still run earlier steps: those first, so
    // steps still plan and move in order (a cancelled step does neither: it need not wait).
    MutexLock lock(&mu_);
    while (in_flight_ > 1 && !cancelled_) done_.Wait(&mu_);
  }
  RunInline(job);
  return problem;
}

void StepEngine::RunHeldThrough(int64_t through) {
  for (;;) {
    Job* job;
    {
      MutexLock lock(&mu_);
      if (held_.empty() || held_.front()->step > through) return;
      job = held_.front();
      held_.pop_front();
      job->plan_started = true;
    }
    RunInline(job);
  }
}

void StepEngine::Announce(Job* job) {
  if (job->announced) return;
  job->announced = true;
  try {
    index_->Reserve(job->indices, job->bounds, job->step);
  } catch (const std::exception& e) {
    job->failure = StepFailure::kPlan;
    job->status = Status::InvalidArgument(std::string("the look-ahead window refused the step: ") + e.what());
  }
}

void StepEngine::Unlock(Job* job) {
  if (!job->plan_started) job->oldest_live = std::max<int64_t>(job->oldest_live, last_taken_);
}

StepEngine::Job* StepEngine::NextToAnnounce() const {
  if (lookahead_ == 0 || plan_queue_.empty()) return nullptr;
  const int64_t last = plan_queue_.front()->step + int64_t(lookahead_);
  for (Job* job : plan_queue_) {
    if (job->step > last) break;
    if (!job->announced) return job;
  }
  return nullptr;
}

bool StepEngine::MayPlan(const Job& front) const {
  // Its window is in; or it is the next step to compute (the one before it was taken), so
  // its plan and moves must run now to overlap that step, with the window submitted so far;
  // or it is waited for.
  return plan_queue_.size() > lookahead_ || (last_taken_ >= 0 && front.step <= last_taken_ + 1) ||
         front.step <= force_through_ || stopping_;
}

void StepEngine::SetLookahead(size_t steps) {
  MutexLock lock(&mu_);
  if (!pending_.empty() || in_flight_ > 0)
    throw std::invalid_argument("the look-ahead window changes only with no step pending (" +
                                std::to_string(pending_.size()) + " pending)");
  lookahead_ = steps;
}

size_t StepEngine::lookahead() const {
  MutexLock lock(&mu_);
  return lookahead_;
}

void StepEngine::RunInline(Job* job) {
  if (lookahead() > 0) Announce(job);  // a step run inline after a Shutdown is still counted
  {
    MutexLock lock(&mu_);
    if (!MayRun(job, true)) {
      Finish(job);
      return;
    }
  }
  RunPlan(job);
  {
    MutexLock lock(&mu_);
    NoteFailure(job);
    if (job->failure != StepFailure::kNone || job->num_moves == 0) {
      Finish(job);
      return;
    }
    ++moving_;
  }
  RunMoves(job);
  MutexLock lock(&mu_);
  NoteFailure(job);
  --moving_;
  Finish(job);
}

bool StepEngine::SameBatch(const Job& job, const StepInput& in) const {
  if (job.n != in.n || job.num_offsets != in.num_offsets || job.feature_batch != in.feature_batch) return false;
  const bool indices_same = job.indices == in.indices && job.version == in.version;
  if (!indices_same && in.n && std::memcmp(job.indices, in.indices, in.n * sizeof(int64_t)) != 0) return false;
  if (job.offsets == in.offsets && job.version == in.version) return true;
  return std::memcmp(job.offsets, in.offsets, in.num_offsets * sizeof(int64_t)) == 0;
}

void StepEngine::Take(const StepInput& in, bool train, TakenStep* out, bool* mismatch, BatchProblem* problem) {
  *mismatch = false;
  *problem = BatchProblem();
  Job* job = nullptr;
  {
    MutexLock lock(&mu_);
    if (!pending_.empty()) job = pending_.front();
  }
  // Only this thread takes pending steps: the front stays ours while its batch is compared.
  if (job != nullptr) {
    if (!SameBatch(*job, in)) {
      *mismatch = true;
      return;
    }
  } else {
    *problem = Submit(in);
    if (problem->kind != BatchProblemKind::kOk) return;
  }
  out->prefetched = job != nullptr;
  {
    MutexLock lock(&mu_);
    if (job == nullptr) job = pending_.back();
  }
  RunHeldThrough(job->step);  // without stage threads, a window may hold it back
  MutexLock lock(&mu_);
  pending_.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  WaitDone(job);
  counters_.wait_seconds += SecondsSince(t0);
  if (out->prefetched) ++counters_.steps_prefetched;
  Consume(job, train, out);
}

void StepEngine::WaitDone(Job* job) {
  if (job->stage == Stage::kPlanning && job->step > force_through_) {
    force_through_ = job->step;  // waited for: planned without the rest of its window
    work_.NotifyAll();
  }
  while (job->stage != Stage::kDone) done_.Wait(&mu_);
  // A later step may have finished before the failure (nothing to move, say): it fails too.
  if (job->failure == StepFailure::kNone && failed_ && job->step > failed_step_) {
    job->failure = StepFailure::kEarlier;
    job->status = first_failure_;
  }
}

void StepEngine::Consume(Job* job, bool train, TakenStep* out) {
  out->step = job->step;
  out->failure = job->failure;
  out->status = job->status;
  out->failed_table = job->failed_table;
  out->hook_step = job->failure == StepFailure::kHook ? job->step : -1;
  out->overflow.swap(job->overflow);
  if (job->failure == StepFailure::kNone) {
    MarkRows(*job, !train);
    if (train && !job->train) {
      // Planned in eval mode, computed in train mode: its rows are about to change.
      for (size_t t = 0; t < num_tables(); ++t) {
        const int64_t lo = job->bounds[t], hi = job->bounds[t + 1];
        if (hi > lo) index_->cache(t).MarkDirty(job->remapped + lo, size_t(hi - lo));
      }
    }
    last_taken_ = job->step;
    ++counters_.steps;
    // The next step, its window not complete, may be planned now (MayPlan), keeping the steps
    // from this one on. (One whose window is complete may be planning already: left alone, so
    // that threads and inline plan alike.)
    if (lookahead_ > 0 && !pending_.empty() && pending_.size() - 1 < lookahead_) {
      Unlock(pending_.front());
      work_.NotifyAll();
    }
  }
  job->stage = Stage::kFree;
  free_.push_back(job);
}

void StepEngine::MarkRows(const Job& job, bool created_only) {
  if (bitmaps_.empty() || (created_only && job.created.empty())) return;
  for (size_t t = 0; t < num_tables() && t < bitmaps_.size(); ++t) {
    const int64_t* rows = virtual_ != nullptr && virtual_->IsVirtual(t) ? job.rows.data() : job.indices;
    uint8_t* bits = bitmaps_[t].bits;
    const uint64_t limit = bitmaps_[t].rows;
    for (int64_t i = job.bounds[t]; i < job.bounds[t + 1]; ++i) {
      if (created_only && !job.created[size_t(i)]) continue;
      const uint64_t row = uint64_t(rows[i]);
      if (row < limit) bits[row >> 3] |= uint8_t(1u << (row & 7));
    }
  }
}

void StepEngine::Drain(TakenStep* out) {
  RunHeldThrough(std::numeric_limits<int64_t>::max());
  MutexLock lock(&mu_);
  for (Job* job : pending_) {
    WaitDone(job);
    if (job->failure != StepFailure::kNone && out->failure == StepFailure::kNone) {
      out->step = job->step;
      out->failure = job->failure;
      out->status = job->status;
      out->failed_table = job->failed_table;
      out->hook_step = job->failure == StepFailure::kHook ? job->step : -1;
    }
    for (OverflowRows& o : job->overflow) out->overflow.push_back(std::move(o));
    job->overflow.clear();
  }
}

size_t StepEngine::DropPending() {
  RunHeldThrough(std::numeric_limits<int64_t>::max());
  MutexLock lock(&mu_);
  const size_t dropped = pending_.size();
  for (Job* job : pending_) {
    WaitDone(job);
    job->stage = Stage::kFree;
    free_.push_back(job);
  }
  pending_.clear();
  if (dropped > 0) {
    // The dropped steps never run: their slots and rows are free again (else a cache
    // prefetched and cancelled over and over would grow its overflow pool without end).
    index_->ReleaseAfter(last_taken_);
    if (virtual_ != nullptr) virtual_->Dropped(last_taken_);
  }
  return dropped;
}

void StepEngine::MarkPendingCreated() {
  RunHeldThrough(std::numeric_limits<int64_t>::max());
  MutexLock lock(&mu_);
  for (Job* job : pending_) {
    WaitDone(job);
    if (job->failure == StepFailure::kNone) MarkRows(*job, true);
  }
}

size_t StepEngine::pending() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

size_t StepEngine::InFlight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

void StepEngine::WaitForMoves() {
  MutexLock lock(&mu_);
  while (moving_ > 0) done_.Wait(&mu_);
}

bool StepEngine::OnStageThread() const {
  const std::thread::id me = std::this_thread::get_id();
  return me == plan_id_ || me == move_id_;
}

int64_t StepEngine::last_taken_step() const {
  MutexLock lock(&mu_);
  return last_taken_;
}

void StepEngine::SetSlots(std::vector<SlotRows> slots) {
  MutexLock lock(&mu_);
  slots_ = std::move(slots);
}

void StepEngine::SetDirtyBitmaps(std::vector<RowBitmap> bitmaps) {
  MutexLock lock(&mu_);
  bitmaps_ = std::move(bitmaps);
}

void StepEngine::SetWriteGuard(size_t table, bool on) {
  if (table >= num_tables()) throw std::out_of_range("table " + std::to_string(table) + " is outside the kernel");
  write_guard_[table] = on;
}

EngineCounters StepEngine::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

EngineTableCounters StepEngine::table_counters(size_t table) const {
  MutexLock lock(&mu_);
  return table_counters_.at(table);
}

void StepEngine::Shutdown(bool cancel) {
  {
    MutexLock lock(&mu_);
    if (cancel) cancelled_ = true;
    stopping_ = true;
    work_.NotifyAll();
  }
  if (std::this_thread::get_id() == plan_id_ || std::this_thread::get_id() == move_id_) return;
  bool expected = false;
  if (!threads_joined_.compare_exchange_strong(expected, true)) return;
  if (plan_thread_.joinable()) plan_thread_.join();
  if (move_thread_.joinable()) move_thread_.join();
}

bool StepEngine::MayRun(Job* job, bool plan) {
  if (plan && cancelled_) {
    job->failure = StepFailure::kCancelled;
    job->status = Status::Closed("the prefetch was dropped: its kernel shut down before it ran");
    return false;
  }
  if (failed_) {
    job->failure = StepFailure::kEarlier;
    job->status = first_failure_;
    return false;
  }
  return true;
}

void StepEngine::NoteFailure(Job* job) {
  if (job->failure == StepFailure::kNone || job->failure == StepFailure::kEarlier ||
      job->failure == StepFailure::kCancelled || failed_)
    return;
  failed_ = true;
  failed_step_ = job->step;
  first_failure_ = job->status;
}

void StepEngine::Finish(Job* job) {
  counters_.plan_seconds += job->plan_seconds;
  counters_.plan_cpu_ns += job->plan_cpu_ns;
  job->plan_seconds = 0;
  job->plan_cpu_ns = 0;
  job->stage = Stage::kDone;
  --in_flight_;
  done_.NotifyAll();
}

void StepEngine::PlanLoop() {
  for (;;) {
    Job* job = nullptr;
    Job* announce = nullptr;
    {
      MutexLock lock(&mu_);
      for (;;) {
        // The steps of the next plan's window are announced first (no later one: the plan
        // sees the window it would see inline), then the oldest planned once MayPlan.
        announce = NextToAnnounce();
        if (announce != nullptr) break;
        if (!plan_queue_.empty() && MayPlan(*plan_queue_.front())) {
          job = plan_queue_.front();
          plan_queue_.pop_front();
          job->plan_started = true;
          break;
        }
        if (plan_queue_.empty() && stopping_) break;
        work_.Wait(&mu_);
      }
      if (announce == nullptr && job == nullptr) break;
      if (job != nullptr && !MayRun(job, true)) {
        Finish(job);
        continue;
      }
    }
    if (announce != nullptr) {
      Announce(announce);
      continue;
    }
    RunPlan(job);
    MutexLock lock(&mu_);
    NoteFailure(job);
    if (job->failure != StepFailure::kNone || job->num_moves == 0) {
      Finish(job);  // nothing to move: done now (Take waits for each step by itself)
      continue;
    }
    ++moving_;
    move_queue_.push_back(job);
    work_.NotifyAll();
  }
  MutexLock lock(&mu_);
  plan_stopped_ = true;
  work_.NotifyAll();
}

void StepEngine::MoveLoop() {
  for (;;) {
    Job* job;
    {
      MutexLock lock(&mu_);
      while (move_queue_.empty() && !plan_stopped_) work_.Wait(&mu_);
      if (move_queue_.empty()) break;
      job = move_queue_.front();
      move_queue_.pop_front();
      if (!MayRun(job, false)) {
        --moving_;
        Finish(job);
        continue;
      }
    }
    RunMoves(job);
    MutexLock lock(&mu_);
    NoteFailure(job);
    --moving_;
    Finish(job);
  }
}

void StepEngine::RunPlan(Job* job) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t cpu0 = ThreadCpuNs();
  job->num_moves = 0;
  if (job->failure != StepFailure::kNone) return;  // its announcement failed
  if (hooks_.fault != nullptr && hooks_.fault(hooks_.context, job->step, 0) != 0) {
    job->failure = StepFailure::kHook;
    job->status = Status::InvalidArgument("the fault point before the plan failed");
    return;
  }
  Status resolved;
  if (virtual_ != nullptr) {
    job->rows.resize(job->n);
    job->created.assign(job->n, 0);
    virtual_->BeginStep(job->now);
  }
  try {
    job->num_moves = index_->PlanStep(job->indices, job->bounds, job->step, job->oldest_live, job->train,
                                      job->remapped, &job->moves, virtual_, job->rows.data(), &resolved);
  } catch (const std::exception& e) {
    job->failure = StepFailure::kPlan;
    job->status = Status::InvalidArgument(e.what());
    return;
  }
  if (!resolved.ok()) {
    job->failure = StepFailure::kPlan;
    job->status = std::move(resolved);
    return;
  }
  if (virtual_ != nullptr) {
    for (size_t t = 0; t < num_tables(); ++t)
      if (virtual_->IsVirtual(t)) virtual_->MarkCreated(t, job->created.data() + job->bounds[t]);
  }
  if (!job->train && !job->created.empty()) {
    // A new id's slot must reach the tier, whether the step trains or not.
    for (size_t t = 0; t < num_tables(); ++t)
      for (int64_t i = job->bounds[t]; i < job->bounds[t + 1]; ++i)
        if (job->created[size_t(i)]) index_->cache(t).MarkDirty(job->remapped + i, 1);
  }
  if (hooks_.fault != nullptr && hooks_.fault(hooks_.context, job->step, 1) != 0) {
    job->failure = StepFailure::kHook;
    job->status = Status::InvalidArgument("the fault point after the plan failed");
  }
  job->plan_seconds = SecondsSince(t0);
  job->plan_cpu_ns = ThreadCpuNs() - cpu0;
}

void StepEngine::RunMoves(Job* job) {
  const size_t count = job->num_moves;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t k = 0; k < count; ++k) {
    const TableMoves& m = job->moves[k];
    if (!m.evict_rows.empty() && write_guard_[size_t(m.table)] && hooks_.before_write != nullptr &&
        hooks_.before_write(hooks_.context, job->step, m.table, m.evict_rows.data(), int64_t(m.evict_rows.size())) !=
            0) {
      job->failure = StepFailure::kHook;
      job->failed_table = m.table;
      job->status = Status::InvalidArgument("a checkpoint's copy-on-write failed");
      return;
    }
  }
  std::vector<SlotRows>& slots = job->slots;
  {
    MutexLock lock(&mu_);
    slots.assign(slots_.begin(), slots_.end());  // set only between steps; the moves run unlocked
  }
  size_t moved = 0;
  for (; moved < count; ++moved) {
    const TableMoves& m = job->moves[moved];
    const size_t t = size_t(m.table);
    if (t >= slots.size()) {
      job->failure = StepFailure::kMove;
      job->failed_table = m.table;
      job->status = Status::InvalidArgument("table " + std::to_string(t) + " has no cache slots to move rows to");
      break;
    }
    TableMove tm;
    tm.table = t;
    tm.slots = slots[t];
    tm.evict_ids = m.evict_rows.data();
    tm.evict_slots = m.evict_slots.data();
    tm.num_evict = m.evict_rows.size();
    tm.load_ids = m.load_rows.data();
    tm.load_slots = m.load_slots.data();
    tm.num_load = m.load_rows.size();
    Status st = mover_->Move(tm, &job->result);
    if (!st.ok()) {
      job->failure = StepFailure::kMove;
      job->failed_table = m.table;
      job->status = std::move(st);
      break;
    }
    const MoveResult& r = job->result;
    if (!r.overflow_positions.empty()) {
      OverflowRows& o = job->overflow.emplace_back();
      o.table = m.table;
      for (int64_t at : r.overflow_positions) {
        o.slots.push_back(m.load_slots[size_t(at)]);
        o.ids.push_back(m.load_rows[size_t(at)]);
      }
      o.rows = r.overflow_rows;
    }
    MutexLock lock(&mu_);
    EngineTableCounters& c = table_counters_[t];
    c.rows_loaded += tm.num_load;
    c.rows_written_back += tm.num_evict;
    c.lazy_rows += r.lazy_rows;
    counters_.rows_written_back += tm.num_evict;
  }
  if (moved == 0) return;
  const double seconds = SecondsSince(t0) / double(count);
  MutexLock lock(&mu_);
  for (size_t k = 0; k < moved; ++k) table_counters_[size_t(job->moves[k].table)].move_seconds += seconds;
}

}  // namespace mtrains
