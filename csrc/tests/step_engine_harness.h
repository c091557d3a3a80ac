// The step engine driver's harness (test_step_engine.cc): a kernel of three tables whose
// tiers are DRAM rows behind a scripted TierRows (a move that fails or waits on a chosen
// call), hooks that a test scripts (hold a plan, shut down from it, wait for moves, fail a
// write guard's copy or a fault point) and log what they saw, batches in FBGEMM's layout,
// the TBE's slots in plain vectors (grown, as the kernel's Python side grows them, when a
// step loads rows past them) and a reference of every row's training.
//
// A step's "training" adds 1 to the count word of each index's slot, so after a final flush
// each row's count on its tier must equal its occurrences over the steps trained.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/kernel_cache_index.h"
#include "common/mutex.h"
#include "kernel/mapped_tier_rows.h"
#include "kernel/step_engine.h"
#include "kernel/step_mover.h"
#include "tests/check.h"

namespace mtrains {
namespace testing {

// A row: two weight words -- a count that "training" adds 1 to per index, the row's id tag --
// and one optimizer-state word, its table's tag; so a row in the wrong slot or table shows.
constexpr size_t kWeightBytes = 8, kStateBytes = 4, kRowBytes = kWeightBytes + kStateBytes;
constexpr size_t kTables = 3, kFeatures = 4;
inline const std::vector<int64_t> kIdBounds = {50, 30, 80};
inline const std::vector<int64_t> kTableOfFeature = {0, 1, 1, 2};  // table 1 has two features

inline uint32_t IdTag(int64_t id) { return uint32_t(id) * 7u + 3u; }
inline uint32_t TableTag(size_t t) { return 1000u + uint32_t(t); }
inline uint32_t WordAt(const uint8_t* p, size_t k) {
  uint32_t w;
  std::memcpy(&w, p + 4 * k, 4);
  return w;
}
inline void PutWord(uint8_t* p, size_t k, uint32_t w) { std::memcpy(p + 4 * k, &w, 4); }

// Orders hooks and moves seen on different threads.
inline std::atomic<uint64_t> g_clock{0};
inline uint64_t Tick() { return g_clock.fetch_add(1) + 1; }

// Waits, yielding, until `done()`: for an engine counter nothing can wake the test on.
template <typename F>
void WaitUntil(F done) {
  while (!done()) std::this_thread::yield();
}

// A one-way event: Wait returns once Open was called.
class Gate {
 public:
  void Open() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    open_ = true;
    cv_.NotifyAll();
  }
  void Wait() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!open_) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------------------
// A table's tier, scripted: ScriptedTier wraps a MappedTierRows over the table's rows.

// What a test scripts of one table's tier moves (set before the steps run) and what they did.
struct MoveScript {
  std::atomic<int64_t> fail_call{0};  // this Move call (1-based) fails with ENOSPC, moving nothing
  std::atomic<int64_t> hold_call{0};  // this call opens `held` and waits for `release`
  Gate held, release;
  const StepEngine* engine = nullptr;
  std::atomic<int64_t> calls{0}, done{0}, on_stage{0}, off_stage{0};
  Mutex mu;
  std::vector<std::vector<int64_t>> evicts GUARDED_BY(mu);  // the calls' evicted ids (calls with any)
  std::vector<uint64_t> evict_seq GUARDED_BY(mu);
  std::vector<uint64_t> done_seq GUARDED_BY(mu);  // when each successful call ended

  std::vector<std::vector<int64_t>> Evicts() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return evicts;
  }
  std::vector<uint64_t> EvictSeq() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return evict_seq;
  }
  std::vector<uint64_t> DoneSeq() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return done_seq;
  }
};

class ScriptedTier : public TierRows {
 public:
  ScriptedTier(std::unique_ptr<TierRows> inner, MoveScript* script) : inner_(std::move(inner)), s_(script) {}
  size_t row_bytes() const override { return inner_->row_bytes(); }
  Status Move(const SlotRows& slots, const int64_t* evict_ids, const int64_t* evict_slots, size_t nw,
              const int64_t* load_ids, const int64_t* load_slots, size_t nr, StageCpu* cpu) override {
    const int64_t call = ++s_->calls;
    ++(s_->engine->OnStageThread() ? s_->on_stage : s_->off_stage);
    if (call == s_->hold_call.load()) {
      s_->held.Open();
      s_->release.Wait();
    }
    if (nw) {
      MutexLock lock(&s_->mu);
      s_->evicts.emplace_back(evict_ids, evict_ids + nw);
      s_->evict_seq.push_back(Tick());
    }
    if (call == s_->fail_call.load()) return Status::IoError(ENOSPC, "table.scm: write-back: No space left on device");
    Status st = inner_->Move(slots, evict_ids, evict_slots, nw, load_ids, load_slots, nr, cpu);
    if (st.ok()) {
      MutexLock lock(&s_->mu);
      s_->done_seq.push_back(Tick());
      ++s_->done;
    }
    return st;
  }
  Status Read(const int64_t* ids, size_t n, uint8_t* out, StageCpu* cpu) override {
    return inner_->Read(ids, n, out, cpu);
  }

 private:
  std::unique_ptr<TierRows> inner_;
  MoveScript* const s_;
};

// One table's rows on its tier, row id starting as (count 0, IdTag(id), TableTag(t)).
struct TierTable {
  size_t table;
  std::vector<uint8_t> rows;
  explicit TierTable(size_t t) : table(t), rows(size_t(kIdBounds[t]) * kRowBytes) {
    for (int64_t id = 0; id < kIdBounds[t]; ++id) {
      PutWord(Row(id), 0, 0);
      PutWord(Row(id), 1, IdTag(id));
      PutWord(Row(id), 2, TableTag(t));
    }
  }
  uint8_t* Row(int64_t id) { return rows.data() + size_t(id) * kRowBytes; }
  std::unique_ptr<TierRows> Mapped() {
    MappedTierRows::Layout l;
    l.rows = rows.data();
    l.num_rows = uint64_t(kIdBounds[table]);
    l.kind = MappedTierRows::Words::kNone;
    l.dim = 2;
    l.state_dim = 1;
    l.name = "table" + std::to_string(table);
    return std::make_unique<MappedTierRows>(l);
  }
};

// ---------------------------------------------------------------------------------------------
// Hooks: a script and a log shared by the three hooks.

struct HookScript {
  StepEngine* engine = nullptr;
  // The plan hook (PlanHook), at step `hold_step`: opens `held`, waits for
  // `release`; at `shutdown_step` first waits for `shutdown_go`, then calls
  // Shutdown(shutdown_cancel); at `wait_moves_step` opens `waiting`, calls WaitForMoves and
  // notes how many moves of `moves` had ended.
  std::atomic<int64_t> hold_step{-1}, shutdown_step{-1}, wait_moves_step{-1};
  bool shutdown_cancel = true;
  Gate held, release, waiting, shutdown_go;
  MoveScript* moves = nullptr;
  std::atomic<int64_t> done_at_return{-1};
  std::atomic<uint64_t> return_seq{0};
  // before_write: call `fail_write_call` (1-based) returns 1.
  std::atomic<int64_t> write_calls{0}, fail_write_call{0};
  // fault: returns 1 at (fail_fault_step, fail_fault_phase).
  std::atomic<int64_t> fail_fault_step{-1}, fail_fault_phase{-1};
  std::atomic<int64_t> on_stage{0}, off_stage{0};  // hook calls on / off the engine's threads

  struct Write {
    int64_t step, table;
    std::vector<int64_t> ids;
    uint64_t seq;
  };
  Mutex mu;
  std::vector<int64_t> planned GUARDED_BY(mu);  // steps in the order PlanHook saw them
  std::vector<Write> writes GUARDED_BY(mu);
  std::vector<std::pair<int64_t, int64_t>> faults GUARDED_BY(mu);  // (step, phase)

  std::vector<int64_t> Planned() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return planned;
  }
  std::vector<Write> Writes() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return writes;
  }
  std::vector<std::pair<int64_t, int64_t>> Faults() EXCLUDES(mu) {
    MutexLock lock(&mu);
    return faults;
  }
  void NoteThread() { ++(engine->OnStageThread() ? on_stage : off_stage); }
};

// The fault hook at phase 0 (before the plan), running the script's plan-time parts.
inline int PlanHook(void* context, int64_t step, int64_t phase) {
  if (phase != 0) return 0;
  HookScript& h = *static_cast<HookScript*>(context);
  h.NoteThread();
  {
    MutexLock lock(&h.mu);
    h.planned.push_back(step);
  }
  if (step == h.shutdown_step.load()) {
    h.shutdown_go.Wait();
    h.engine->Shutdown(h.shutdown_cancel);  // on a stage thread: returns without joining
  }
  if (step == h.hold_step.load()) {
    h.held.Open();
    h.release.Wait();
  }
  if (step == h.wait_moves_step.load()) {
    h.waiting.Open();
    h.engine->WaitForMoves();
    h.done_at_return = h.moves->done.load();
    h.return_seq = Tick();
  }
  return 0;
}

inline int BeforeWriteHook(void* context, int64_t step, int64_t table, const int64_t* ids, int64_t n) {
  HookScript& h = *static_cast<HookScript*>(context);
  h.NoteThread();
  const int64_t call = ++h.write_calls;
  {
    MutexLock lock(&h.mu);
    h.writes.push_back(HookScript::Write{step, table, std::vector<int64_t>(ids, ids + n), Tick()});
  }
  return call == h.fail_write_call.load() ? 1 : 0;
}

inline int FaultHook(void* context, int64_t step, int64_t phase) {
  HookScript& h = *static_cast<HookScript*>(context);
  h.NoteThread();
  {
    MutexLock lock(&h.mu);
    h.faults.emplace_back(step, phase);
  }
  return step == h.fail_fault_step.load() && phase == h.fail_fault_phase.load() ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// Batches.

struct Batch {
  std::vector<int64_t> indices, offsets, feature_batch, remapped;
  std::vector<size_t> table;  // each index's table: the split the engine must find
  bool plan_train = true, take_train = true;
  uint64_t version = 1;

  StepInput Input() {
    StepInput in;
    in.indices = indices.data();
    in.n = indices.size();
    in.offsets = offsets.data();
    in.num_offsets = offsets.size();
    in.feature_batch = feature_batch;
    in.train = plan_train;
    in.remapped = remapped.data();
    in.version = version;
    return in;
  }
};

using Bags = std::vector<std::vector<std::vector<int64_t>>>;  // [feature][bag] -> ids

// The batch of `bags` in FBGEMM's layout; `variable`: with feature_batch (else every feature
// must have as many bags).
inline Batch FromBags(const Bags& bags, bool variable) {
  Batch b;
  b.offsets.push_back(0);
  for (size_t f = 0; f < bags.size(); ++f) {
    if (variable) b.feature_batch.push_back(int64_t(bags[f].size()));
    for (const auto& bag : bags[f]) {
      for (int64_t id : bag) b.indices.push_back(id), b.table.push_back(size_t(kTableOfFeature[f]));
      b.offsets.push_back(int64_t(b.indices.size()));
    }
  }
  b.remapped.assign(b.indices.size(), -7);
  return b;
}

// Bags of one id list per table (feature 1 gets table 1's ids, feature 2 none).
inline Batch OfTables(const std::vector<int64_t>& t0, const std::vector<int64_t>& t1, const std::vector<int64_t>& t2) {
  return FromBags({{t0}, {t1}, {{}}, {t2}}, false);
}

// Step `step` of a random run: skewed ids, bags of 0-3 ids, a variable batch every 5th step;
// some steps eval (planned and taken so), some planned eval and taken in train mode, some
// planned train and taken eval.
inline Batch RandomBatch(std::mt19937_64& rng, int64_t step) {
  const bool variable = step % 5 == 2;
  Bags bags(kFeatures);
  for (size_t f = 0; f < kFeatures; ++f) {
    const uint64_t rows = uint64_t(kIdBounds[size_t(kTableOfFeature[f])]);
    bags[f].resize(variable ? rng() % 5 : 3);
    for (auto& bag : bags[f]) {
      const size_t len = rng() % 4;
      for (size_t j = 0; j < len; ++j) bag.push_back(int64_t(rng() % 4 == 0 ? rng() % rows : rng() % (rows / 3)));
    }
  }
  Batch b = FromBags(bags, variable);
  b.plan_train = !(step % 7 == 3 || step % 7 == 5);
  b.take_train = !(step % 7 == 3 || step % 11 == 4);
  return b;
}

// Steps [first, first + n) of a random run, all trained.
inline std::vector<Batch> RandomBatches(std::mt19937_64& rng, int64_t first, int64_t n) {
  std::vector<Batch> b;
  for (int64_t s = first; s < first + n; ++s) {
    b.push_back(RandomBatch(rng, s));
    b.back().plan_train = b.back().take_train = true;
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// A kernel: the cache index, the mover over scripted tiers, a DRAM TBE per table (grown as
// the kernel's Python side grows it) and the engine.

using Counts = std::vector<std::vector<uint32_t>>;  // [table][id]: the reference's training

inline Counts ZeroCounts() {
  Counts c(kTables);
  for (size_t t = 0; t < kTables; ++t) c[t].assign(size_t(kIdBounds[t]), 0);
  return c;
}

struct KernelOptions {
  CachePolicy policy = CachePolicy::kLru;
  std::vector<uint64_t> cache_slots = {12, 8, 16};
  uint32_t ways = 4;
  bool background = true;
  // plan_hook: the fault hook is PlanHook (HookScript's plan-time script), not FaultHook.
  bool plan_hook = false, before_write = false, fault = false;
};

struct Tbe {
  std::vector<uint8_t> weights, state;
  int64_t slots = 0;
  void Resize(int64_t n) {
    weights.resize(size_t(n) * kWeightBytes);
    state.resize(size_t(n) * kStateBytes);
    slots = n;
  }
  SlotRows View() {
    SlotRows s;
    s.weights = weights.data();
    s.weight_bytes = kWeightBytes;
    s.state = state.data();
    s.state_bytes = kStateBytes;
    s.slots = slots;
    return s;
  }
};

class Kernel {
 public:
  explicit Kernel(const KernelOptions& o) : index_(o.cache_slots, o.ways, o.policy), mover_(kTables) {
    for (size_t t = 0; t < kTables; ++t) {
      tiers_.push_back(std::make_unique<TierTable>(t));
      mover_.SetTier(t, std::make_unique<ScriptedTier>(tiers_[t]->Mapped(), &scripts_[t]));
      tbes_[t].Resize(int64_t(o.cache_slots[t]));  // the overflow pool is past the TBE
    }
    EngineHooks h;
    h.context = &hooks_;
    if (o.before_write) h.before_write = BeforeWriteHook;
    if (o.fault) h.fault = FaultHook;
    if (o.plan_hook) h.fault = PlanHook;
    engine_ = std::make_unique<StepEngine>(&index_, &mover_, kIdBounds, kTableOfFeature, o.background, h);
    hooks_.engine = engine_.get();
    for (MoveScript& s : scripts_) s.engine = engine_.get();
    SetSlots();
  }

  StepEngine& engine() { return *engine_; }
  KernelCacheIndex& index() { return index_; }
  StepMover& mover() { return mover_; }
  HookScript& hooks() { return hooks_; }
  MoveScript& script(size_t t) { return scripts_[t]; }
  void Destroy() { engine_.reset(); }

  void SetSlots() {
    std::vector<SlotRows> slots;
    for (Tbe& tbe : tbes_) slots.push_back(tbe.View());
    engine_->SetSlots(std::move(slots));
  }

  // After a Take whose step has loads past the TBE: drains the pending steps (their overflow
  // rows too), grows each table's TBE to its cache's capacity, copies the rows in and hands
  // the engine the new slots (torchrec_mtrains/kernels/steps.py's take and grow). Returns the rows copied.
  uint64_t Settle(TakenStep* taken) {
    if (taken->overflow.empty()) return 0;
    TakenStep drained;
    engine_->Drain(&drained);
    CHECK(drained.failure == StepFailure::kNone) << drained.status.message();
    std::vector<OverflowRows> all = std::move(taken->overflow);
    for (OverflowRows& o : drained.overflow) all.push_back(std::move(o));
    std::array<int64_t, kTables> old_slots;
    for (size_t t = 0; t < kTables; ++t) {
      old_slots[t] = tbes_[t].slots;
      const int64_t capacity = int64_t(index_.cache(t).capacity());
      if (capacity > tbes_[t].slots) tbes_[t].Resize(capacity + 2);
    }
    uint64_t copied = 0;
    for (const OverflowRows& o : all) {
      const size_t t = size_t(o.table);
      CHECK(t < kTables && o.slots.size() == o.ids.size() && o.rows.size() == o.ids.size() * kRowBytes);
      for (size_t j = 0; j < o.ids.size(); ++j) {
        const uint8_t* row = o.rows.data() + j * kRowBytes;
        CHECK(WordAt(row, 1) == IdTag(o.ids[j]) && WordAt(row, 2) == TableTag(t)) << "overflow row " << o.ids[j];
        CHECK(o.slots[j] >= old_slots[t] && o.slots[j] < tbes_[t].slots) << "overflow slot " << o.slots[j];
        tbes_[t].View().CopyIn(row, o.slots[j]);
        ++copied;
      }
    }
    SetSlots();
    return copied;
  }

  // Each index's slot holds its row with every earlier step's training.
  void CheckRows(const Batch& b, const Counts& ref) {
    for (size_t i = 0; i < b.indices.size(); ++i) {
      const size_t t = b.table[i];
      const int64_t id = b.indices[i], slot = b.remapped[i];
      CHECK(slot >= 0 && slot < tbes_[t].slots) << "table " << t << " index " << i << ": slot " << slot;
      const SlotRows s = tbes_[t].View();
      CHECK(WordAt(s.weights_of(slot), 1) == IdTag(id) && WordAt(s.state_of(slot), 0) == TableTag(t))
          << "table " << t << " slot " << slot << " does not hold row " << id;
      CHECK(WordAt(s.weights_of(slot), 0) == ref[t][size_t(id)])
          << "table " << t << " row " << id << ": count " << WordAt(s.weights_of(slot), 0) << ", want "
          << ref[t][size_t(id)];
    }
  }

  // The step's compute: adds 1 to the count of each index's slot.
  void Train(const Batch& b, Counts* ref) {
    for (size_t i = 0; i < b.indices.size(); ++i) {
      uint8_t* w = tbes_[b.table[i]].View().weights_of(b.remapped[i]);
      PutWord(w, 0, WordAt(w, 0) + 1);
      ++(*ref)[b.table[i]][size_t(b.indices[i])];
    }
  }

  // The final flush: drain, then every dirty slot's row to its tier (torchrec_mtrains/kernels/table_rows.py's flush).
  void Flush() {
    TakenStep out;
    engine_->Drain(&out);
    CHECK(out.failure == StepFailure::kNone && out.overflow.empty());
    const int64_t live = engine_->last_taken_step() + 1;
    for (size_t t = 0; t < kTables; ++t) {
      std::vector<int64_t> rows, slots;
      index_.cache(t).TakeDirty(live, &rows, &slots);
      for (size_t j = 0; j < rows.size(); ++j) {
        CHECK(slots[j] < tbes_[t].slots) << "dirty slot " << slots[j] << " past the TBE";
        tbes_[t].View().CopyOut(slots[j], tiers_[t]->Row(rows[j]));
      }
    }
  }

  // Every row on its tier: its count as the reference's, its tags its own.
  void CheckTiers(const Counts& ref) {
    for (size_t t = 0; t < kTables; ++t)
      for (int64_t id = 0; id < kIdBounds[t]; ++id) {
        const uint8_t* r = tiers_[t]->Row(id);
        CHECK(WordAt(r, 1) == IdTag(id) && WordAt(r, 2) == TableTag(t)) << "table " << t << " row " << id;
        CHECK(WordAt(r, 0) == ref[t][size_t(id)])
            << "table " << t << " row " << id << ": " << WordAt(r, 0) << " on the tier, want " << ref[t][size_t(id)];
      }
  }

 private:
  KernelCacheIndex index_;
  StepMover mover_;
  std::vector<std::unique_ptr<TierTable>> tiers_;
  std::array<MoveScript, kTables> scripts_;
  std::array<Tbe, kTables> tbes_;
  HookScript hooks_;
  std::unique_ptr<StepEngine> engine_;  // last: destroyed first
};

inline void Submit(Kernel* k, Batch* b) {
  const BatchProblem p = k->engine().Submit(b->Input());
  CHECK(p.kind == BatchProblemKind::kOk) << "problem " << int64_t(p.kind) << " at " << p.pos;
}

struct Taken {
  TakenStep step;
  bool mismatch = false;
  BatchProblem problem;
};

inline Taken Take(Kernel* k, Batch* b) {
  Taken t;
  t.mismatch = true;
  k->engine().Take(b->Input(), b->take_train, &t.step, &t.mismatch, &t.problem);
  return t;
}

inline Taken TakeOk(Kernel* k, Batch* b, int64_t step) {
  Taken t = Take(k, b);
  CHECK(!t.mismatch && t.problem.kind == BatchProblemKind::kOk) << "step " << step;
  CHECK(t.step.failure == StepFailure::kNone) << "step " << step << " failed: " << int(t.step.failure) << " "
                                              << t.step.status.message();
  CHECK(t.step.step == step) << t.step.step << ", want " << step;
  return t;
}

// Runs `batches` as the next steps (the first numbered `first`; by default the one after the
// last taken), `depth` submitted ahead of the one taken: each step taken must have its rows in
// their slots with every earlier step's training; it then trains (when taken in train mode)
// after the next step was submitted, so the engine plans and moves that one meanwhile.
// Returns the overflow rows copied into the TBE.
inline uint64_t Drive(Kernel* k, std::vector<Batch>* batches, int depth, Counts* ref, int64_t first = -1) {
  StepEngine& e = k->engine();
  if (first < 0) first = e.last_taken_step() + 1;
  const int64_t n = int64_t(batches->size());
  for (int64_t s = 0; s < std::min<int64_t>(depth, n); ++s) Submit(k, &(*batches)[size_t(s)]);
  uint64_t overflow = 0;
  for (int64_t i = 0; i < n; ++i) {
    Batch& b = (*batches)[size_t(i)];
    Taken t = TakeOk(k, &b, first + i);
    CHECK(t.step.prefetched == (depth > 0)) << "step " << first + i;
    overflow += k->Settle(&t.step);
    if (depth > 0 && i + depth < n) Submit(k, &(*batches)[size_t(i + depth)]);
    k->CheckRows(b, *ref);
    if (b.take_train) k->Train(b, ref);
  }
  return overflow;
}

}  // namespace testing
}  // namespace mtrains
