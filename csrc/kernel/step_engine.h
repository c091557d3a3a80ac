// StepEngine: one kernel's steps, from a batch to its rows in the cache slots, on C++ threads.
//
// A step is submitted (prefetch, or forward without one) with its batch; the engine checks
// it and splits it by table in the caller's thread (a bad batch changes nothing), then runs
// it on its own threads, steps in submission order:
//   plan  -- the cache index's plan of every table (cache/kernel_cache_index.h): each
//            index's slot, the rows to load and the dirty rows to write back; a virtual
//            table's cache is keyed by its ids, and only its misses go to its id index
//            (kernel/virtual_ids.h);
//   move  -- every moved table's write-backs and loads through the step mover
//            (kernel/step_mover.h), tier I/O of all tables in one pass.
// The plan of step i+2 overlaps the moves of step i+1, which overlap the compute of step i.
// Look-ahead window (SetLookahead(k), k > 0): every submitted step is announced to the cache
// index at once (KernelCacheIndex::Reserve), and step i is planned once steps i+1..i+k are
// submitted, so its plan evicts none of the rows those steps use; or sooner, with the steps
// submitted so far, once step i-1 is taken (its plan and moves then still overlap step i-1's
// compute), or when it is waited for (Take, Drain, a shutdown).
// Take() waits for the step the caller computes next and marks its rows trained; the slot
// of every index is written straight into the caller's buffer (StepInput::remapped).
// Nothing on this path allocates once the per-step buffers have grown to the batch size,
// and nothing calls into Python unless a hook applies.
//
// Slot locking: the rows of the step still in its backward and of every step planned after
// it are never displaced (the plan's oldest live step is the last step taken when it was
// submitted; with a window, when its window filled or the step before it was taken).
// Failures: the first failed stage fails its step and every later one; Take reports it.
//
// Thread-safety: Submit, Take, Drain, DropPending and the setters are for one caller thread
// (the training thread); counters, WaitForMoves, InFlight and Shutdown may be called from
// any thread. SetSlots and SetDirtyBits only between steps (nothing in flight: after Drain).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cache/kernel_cache_index.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "kernel/batch_bounds.h"
#include "kernel/slot_rows.h"
#include "kernel/step_mover.h"
#include "kernel/virtual_ids.h"

namespace mtrains {

// What the kernel's Python side does at points of a step, called on the engine's threads
// (the callee takes the GIL itself). Each is null where it does not apply; a non-zero
// return fails the step (the callee keeps its own error).
struct EngineHooks {
  void* context = nullptr;
  // Before table `table`'s rows ids[0..n) are written to its tier, while a checkpoint reads
  // that tier (SetWriteGuard): the checkpoint keeps their old values first.
  int (*before_write)(void* context, int64_t step, int64_t table, const int64_t* ids, int64_t n) = nullptr;
  // Crash tests' fault points: phase 0 before a step's plan, 1 after it.
  int (*fault)(void* context, int64_t step, int64_t phase) = nullptr;
};

// One step's batch, as the caller gives it. The buffers stay valid and unchanged until the
// step is taken (or dropped).
struct StepInput {
  const int64_t* indices = nullptr;
  size_t n = 0;
  const int64_t* offsets = nullptr;
  size_t num_offsets = 0;
  std::vector<int64_t> feature_batch;  // bags per feature (variable batch); empty: uniform
  bool train = true;
  int64_t* remapped = nullptr;  // n entries: the slot of each index, written by the plan
  // Identifies the caller's unchanged batch: Take compares two batches' bytes only when
  // their indices or versions differ.
  uint64_t version = 0;
};

// Why a step failed.
enum class StepFailure : int {
  kNone = 0,
  kMove = 1,       // a table's move failed: status, failed_table
  kPlan = 2,       // the cache index refused the plan, or a virtual table is full: status
  kHook = 3,       // a hook returned non-zero (its error is the caller's)
  kEarlier = 4,    // an earlier step failed: status is its
  kCancelled = 5,  // dropped by Shutdown(cancel) before its plan ran
};

// Loads into overflow slots past the TBE: the rows to copy in once the TBE grew.
struct OverflowRows {
  int64_t table = 0;
  std::vector<int64_t> slots, ids;
  std::vector<uint8_t> rows;  // ids.size() rows of the table's row bytes
};

// What Take hands back.
struct TakenStep {
  int64_t step = -1;
  bool prefetched = false;  // a Submit had queued it
  StepFailure failure = StepFailure::kNone;
  Status status;
  int64_t failed_table = -1;
  int64_t hook_step = -1;  // kHook: the step whose hook failed
  std::vector<OverflowRows> overflow;
};

// Per table: rows moved and the wall time of the moves (each step's divided among its tables).
struct EngineTableCounters {
  uint64_t rows_loaded = 0, rows_written_back = 0, lazy_rows = 0;
  double move_seconds = 0;
};

struct EngineCounters {
  double plan_seconds = 0, wait_seconds = 0;
  uint64_t plan_cpu_ns = 0, steps_prefetched = 0, steps = 0;
  uint64_t rows_written_back = 0;  // every table's, since the start
};

// A table's bitmap of rows trained since a checkpoint (torchrec_mtrains/kernels/dirty_rows.py).
struct RowBitmap {
  uint8_t* bits = nullptr;
  uint64_t rows = 0;  // bits available
};

class StepEngine {
 public:
  // `id_bounds[t]`: table t's ids lie in [0, id_bounds[t]); `table_of_feature`: each
  // feature's table (one feature per table when empty). `background`: stage threads (else
  // every step runs in Submit). `virtual_ids`: the virtual tables (null: none). The index,
  // mover and virtual ids must outlive the engine.
  StepEngine(KernelCacheIndex* index, StepMover* mover, std::vector<int64_t> id_bounds,
             std::vector<int64_t> table_of_feature, bool background, EngineHooks hooks,
             VirtualIds* virtual_ids = nullptr);
  ~StepEngine();
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  size_t num_tables() const { return bounds_layout_.table_rows.size(); }

  // Checks and queues the batch as the next step. A batch problem returns it (kind != kOk)
  // and queues nothing. Throws std::invalid_argument for offsets that fit no layout.
  BatchProblem Submit(const StepInput& in) EXCLUDES(mu_);
  // The step of `in` ready to compute: the oldest pending step (its batch must equal `in`:
  // else *mismatch is set and nothing changes), else `in` planned and moved now. Waits for
  // its moves, marks its rows in the dirty bitmaps when `train`, and its slots dirty when it
  // was planned in eval mode. `*problem`: as Submit's, for a batch planned now.
  void Take(const StepInput& in, bool train, TakenStep* out, bool* mismatch, BatchProblem* problem)
      EXCLUDES(mu_);
  // Waits for every pending step to move; fills their failure (the first) and overflow rows.
  void Drain(TakenStep* out) EXCLUDES(mu_);
  // Forgets the pending steps (after Drain), unlocking their slots and rows; returns how many.
  size_t DropPending() EXCLUDES(mu_);
  // The look-ahead window: how many submitted steps after step i its plan waits for (0: none,
  // plans start at once). Only with nothing pending; throws std::invalid_argument otherwise.
  void SetLookahead(size_t steps) EXCLUDES(mu_);
  size_t lookahead() const EXCLUDES(mu_);
  // Marks the rows pending steps gave to new ids in the dirty bitmaps (after Drain).
  void MarkPendingCreated() EXCLUDES(mu_);
  size_t pending() const EXCLUDES(mu_);
  // Steps submitted whose stages have not all run.
  size_t InFlight() const EXCLUDES(mu_);
  // Returns once no step is moving; for a hook on the plan thread (no move starts meanwhile).
  void WaitForMoves() EXCLUDES(mu_);
  bool OnStageThread() const;
  int64_t last_taken_step() const EXCLUDES(mu_);

  // Each table's TBE slots (after the TBE is rebuilt) and dirty bitmaps.
  void SetSlots(std::vector<SlotRows> slots) EXCLUDES(mu_);
  void SetDirtyBitmaps(std::vector<RowBitmap> bitmaps) EXCLUDES(mu_);
  // While on, table `table`'s write-backs call hooks.before_write first.
  void SetWriteGuard(size_t table, bool on);

  EngineCounters counters() const EXCLUDES(mu_);
  EngineTableCounters table_counters(size_t table) const EXCLUDES(mu_);

  // Stops the threads once queued steps ran; with `cancel`, steps whose plan has not started
  // are dropped (kCancelled). Idempotent. Later Submits run inline in the caller's thread,
  // after every earlier step (with `cancel`: they fail with kCancelled).
  void Shutdown(bool cancel) EXCLUDES(mu_);

 private:
  enum class Stage : int { kFree, kPlanning, kMoving, kDone };
  struct Job {
    int64_t step = 0, oldest_live = 0;
    bool train = true, planned_train = true;
    const int64_t* indices = nullptr;
    size_t n = 0;
    const int64_t* offsets = nullptr;
    size_t num_offsets = 0;
    std::vector<int64_t> feature_batch;
    uint64_t version = 0;
    int64_t* remapped = nullptr;
    std::vector<int64_t> bounds;
    std::vector<int64_t> rows;      // virtual tables: the ids' tier rows (else unused)
    std::vector<uint8_t> created;   // virtual tables: ids given a row by this step
    std::vector<uint32_t> now;      // virtual tables: their policies' seconds at submit
    std::vector<TableMoves> moves;  // the plan's: [0, num_moves) the tables with rows to move
    size_t num_moves = 0;
    double plan_seconds = 0;
    uint64_t plan_cpu_ns = 0;
    MoveResult result;              // scratch of one table's move
    std::vector<SlotRows> slots;    // the TBE's slots as the moves see them (a copy, reused)
    std::vector<OverflowRows> overflow;
    StepFailure failure = StepFailure::kNone;
    Status status;
    int64_t failed_table = -1;
    Stage stage = Stage::kFree;
    // Given to the cache index's look-ahead window (set by the thread announcing it: the plan
    // thread, or the caller without stage threads).
    bool announced = false;
    bool plan_started = false;  // taken off its queue by the stage planning it (under mu_)
  };

  Job* NewJob() REQUIRES(mu_);
  void PlanLoop() EXCLUDES(mu_);
  void MoveLoop() EXCLUDES(mu_);
  // Both stages of a step in the calling thread (no stage threads, or after Shutdown).
  void RunInline(Job* job) EXCLUDES(mu_);
  // Without stage threads: runs the steps the window holds back, up to step `through`.
  void RunHeldThrough(int64_t through) EXCLUDES(mu_);
  // Announces the job's step to the look-ahead window (a failure fails the step).
  void Announce(Job* job) EXCLUDES(mu_);
  // A window's step not yet planning keeps only the steps from the one in its backward now
  // (its oldest_live, set at submit, would keep the k steps done since).
  void Unlock(Job* job) REQUIRES(mu_);
  // The plan stage's next step to announce: the first of plan_queue_ not announced within the
  // window of its front, or null.
  Job* NextToAnnounce() const REQUIRES(mu_);
  // Whether the plan stage may plan the job at the front of plan_queue_.
  bool MayPlan(const Job& front) const REQUIRES(mu_);
  // A stage's work, outside the lock (only the stage's thread touches the job meanwhile).
  void RunPlan(Job* job) EXCLUDES(mu_);
  void RunMoves(Job* job) EXCLUDES(mu_);
  // The job is done: counted, and its waiters woken.
  void Finish(Job* job) REQUIRES(mu_);
  // A job about to run a stage: fails it if an earlier one failed or it was cancelled.
  bool MayRun(Job* job, bool plan) REQUIRES(mu_);
  // A job's own failure fails every later step.
  void NoteFailure(Job* job) REQUIRES(mu_);
  // Waits until the job is done; fails it (kEarlier) if it finished before an earlier
  // step's failure was noted.
  void WaitDone(Job* job) REQUIRES(mu_);
  void Consume(Job* job, bool train, TakenStep* out) REQUIRES(mu_);
  void MarkRows(const Job& job, bool created_only) REQUIRES(mu_);
  bool SameBatch(const Job& job, const StepInput& in) const;

  KernelCacheIndex* const index_;
  StepMover* const mover_;
  const BatchLayout bounds_layout_;
  const EngineHooks hooks_;
  VirtualIds* const virtual_;
  std::unique_ptr<std::atomic<bool>[]> write_guard_;

  mutable Mutex mu_;
  CondVar work_;   // a stage's queue got a job, or stopping
  CondVar done_;   // a job finished, or the move stage emptied
  std::vector<std::unique_ptr<Job>> jobs_ GUARDED_BY(mu_);  // every job ever made
  std::vector<Job*> free_ GUARDED_BY(mu_);
  std::deque<Job*> plan_queue_ GUARDED_BY(mu_), move_queue_ GUARDED_BY(mu_);
  // Look-ahead window: its size; without stage threads, the submitted steps not yet run;
  // plans of steps up to `force_through_` wait for no window (they are waited for).
  size_t lookahead_ GUARDED_BY(mu_) = 0;
  std::deque<Job*> held_ GUARDED_BY(mu_);
  int64_t force_through_ GUARDED_BY(mu_) = -1;
  std::deque<Job*> pending_ GUARDED_BY(mu_);  // submitted, not taken, in order
  size_t in_flight_ GUARDED_BY(mu_) = 0;      // submitted, stages not all run
  size_t moving_ GUARDED_BY(mu_) = 0;         // handed to the move stage, not done
  int64_t next_step_ GUARDED_BY(mu_) = 0;
  int64_t last_taken_ GUARDED_BY(mu_) = -1;
  bool failed_ GUARDED_BY(mu_) = false;
  int64_t failed_step_ GUARDED_BY(mu_) = -1;  // the first failed step (when failed_)
  Status first_failure_ GUARDED_BY(mu_);
  bool cancelled_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool plan_stopped_ GUARDED_BY(mu_) = false;  // the plan thread left: the move thread may too
  std::vector<SlotRows> slots_ GUARDED_BY(mu_);
  std::vector<RowBitmap> bitmaps_ GUARDED_BY(mu_);
  EngineCounters counters_ GUARDED_BY(mu_);
  std::vector<EngineTableCounters> table_counters_ GUARDED_BY(mu_);
  std::thread plan_thread_, move_thread_;
  std::thread::id plan_id_, move_id_;  // set before any call can read them
  std::atomic<bool> threads_joined_{false};
};

}  // namespace mtrains
