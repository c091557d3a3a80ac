// TorchScript binding of StepEngine (torch.classes.mtrains.StepEngine): a kernel's steps on
// C++ threads (kernel/step_engine.h). Python submits a batch and takes the step's slots;
// each call releases the GIL (TorchScript methods run without it).
//
// The binding keeps each pending step's tensors (its indices, offsets and the slot buffer
// the plan writes) alive until the step is taken or dropped. Slot buffers come from a pool:
// one is reused once nothing but the pool refers to its storage any more (the TBE's forward
// and backward let go of it), so a run in steady state allocates none.
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "bindings/engine_parts.h"
#include "bindings/slot_tensors.h"
#include "kernel/step_engine.h"

namespace mtrains {
namespace {

using StatusTuple = std::tuple<int64_t, int64_t, std::string>;
using ProblemTuple = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // kind, table, pos, value
// (failure, status, failed table, step, overflow: tables, slots, ids, rows [n, row bytes] uint8)
using Outcome = std::tuple<int64_t, StatusTuple, int64_t, int64_t, std::vector<int64_t>, std::vector<at::Tensor>,
                           std::vector<at::Tensor>, std::vector<at::Tensor>>;

constexpr size_t kPoolMax = 16;  // slot buffers kept for reuse

StatusTuple ToTuple(const Status& st) { return {static_cast<int64_t>(st.code()), st.sys_errno(), st.message()}; }
ProblemTuple ToTuple(const BatchProblem& p) { return {int64_t(p.kind), p.table, p.pos, p.value}; }

void CheckIndexVector(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(),
                    name, " must be a contiguous 1-D int64 CPU tensor");
}

at::Tensor FromVector(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({int64_t(v.size())}, at::kLong);
  if (!v.empty()) std::memcpy(t.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

Outcome ToOutcome(const TakenStep& s) {
  std::vector<int64_t> tables;
  std::vector<at::Tensor> slots, ids, rows;
  for (const OverflowRows& o : s.overflow) {
    tables.push_back(o.table);
    slots.push_back(FromVector(o.slots));
    ids.push_back(FromVector(o.ids));
    const int64_t n = int64_t(o.ids.size());
    at::Tensor r = at::empty({n, n ? int64_t(o.rows.size()) / n : 0}, at::kByte);
    if (!o.rows.empty()) std::memcpy(r.data_ptr(), o.rows.data(), o.rows.size());
    rows.push_back(r);
  }
  return {int64_t(s.failure), ToTuple(s.status), s.failed_table, s.step, tables, slots, ids, rows};
}

// f(), its std::invalid_argument a ValueError and std::out_of_range an IndexError.
template <typename F>
auto Run(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  }
}

class StepEngineHandle : public torch::CustomClassHolder {
 public:
  // hooks: the addresses of EngineHooks' functions (0: none): before_write, fault.
  // virtual_ids: the kernel's torch.classes.mtrains.VirtualIds, or None.
  StepEngineHandle(const c10::IValue& index, const c10::IValue& mover, const std::vector<int64_t>& id_bounds,
                   const std::vector<int64_t>& table_of_feature, bool background, const std::vector<int64_t>& hooks,
                   const c10::IValue& virtual_ids) {
    TORCH_CHECK_VALUE(hooks.size() == 2, "hooks must hold 2 function addresses (0: none)");
    KernelCacheIndex* i = KernelCacheIndexOfHandle(index, &keep_index_);
    StepMover* m = StepMoverOfHandle(mover, &keep_mover_);
    VirtualIds* v = VirtualIdsOfHandle(virtual_ids, &keep_virtual_);
    EngineHooks h;
    h.before_write = reinterpret_cast<decltype(h.before_write)>(static_cast<intptr_t>(hooks[0]));
    h.fault = reinterpret_cast<decltype(h.fault)>(static_cast<intptr_t>(hooks[1]));
    for (int64_t b : id_bounds) TORCH_CHECK_VALUE(b >= 1, "id bounds must be >= 1, got ", b);
    try {
      engine_ = std::make_unique<StepEngine>(i, m, id_bounds, table_of_feature, background, h, v);
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }

  // A child forked from the owner has none of the engine's threads: joining them would hang,
  // so there the engine is left as it is (the owner's process releases it).
  ~StepEngineHandle() override {
    if (getpid() != owner_pid_) (void)engine_.release();
  }

  // Queues the batch as the next step -> its problem (kind 0: queued).
  ProblemTuple submit(const at::Tensor& indices, const at::Tensor& offsets, const std::vector<int64_t>& feature_batch,
                      bool train) {
    CheckOwner();
    Kept kept = Keep(indices, offsets);
    StepInput in = Input(kept, feature_batch, train);
    BatchProblem p = Run([&] { return engine_->Submit(in); });
    if (p.kind == BatchProblemKind::kOk) kept_.push_back(std::move(kept));
    return ToTuple(p);
  }

  // The step of this batch, ready to compute -> (slots, step, prefetched, mismatch, problem,
  // outcome). slots is empty unless the step is ready (no mismatch, problem or failure).
  std::tuple<at::Tensor, bool, bool, ProblemTuple, Outcome> take(const at::Tensor& indices, const at::Tensor& offsets,
                                                                  const std::vector<int64_t>& feature_batch,
                                                                  bool train) {
    CheckOwner();
    const bool fresh = kept_.empty();
    Kept kept = fresh ? Keep(indices, offsets) : kept_.front();
    StepInput in = Input(kept, feature_batch, train);
    in.indices = indices.data_ptr<int64_t>();  // compared with the pending step's
    in.offsets = offsets.data_ptr<int64_t>();
    in.version = VersionOf(indices, offsets);
    TakenStep out;
    bool mismatch = false;
    BatchProblem problem;
    Run([&] {
      engine_->Take(in, train, &out, &mismatch, &problem);
      return 0;
    });
    at::Tensor slots;
    if (!mismatch && problem.kind == BatchProblemKind::kOk) {
      if (!fresh) kept_.pop_front();
      if (out.failure == StepFailure::kNone) slots = kept.remapped;
    }
    return {slots.defined() ? slots : at::empty({0}, at::kLong), out.prefetched, mismatch, ToTuple(problem),
            ToOutcome(out)};
  }

  // Waits for every pending step's moves -> the first failure and every overflow load.
  Outcome drain() {
    TakenStep out;
    Run([&] {
      engine_->Drain(&out);
      return 0;
    });
    return ToOutcome(out);
  }

  int64_t drop_pending() {
    const size_t n = engine_->DropPending();
    kept_.clear();
    return int64_t(n);
  }

  void mark_pending_created() { engine_->MarkPendingCreated(); }
  int64_t pending() { return int64_t(engine_->pending()); }
  int64_t in_flight() { return int64_t(engine_->InFlight()); }
  void wait_for_moves() { engine_->WaitForMoves(); }
  bool on_stage_thread() { return engine_->OnStageThread(); }
  int64_t last_taken_step() { return engine_->last_taken_step(); }

  void set_lookahead(int64_t steps) {
    TORCH_CHECK_VALUE(steps >= 0, "lookahead=", steps, " must be >= 0");
    Run([&] { engine_->SetLookahead(size_t(steps)); });
  }
  int64_t lookahead() { return int64_t(engine_->lookahead()); }

  // Each table's TBE weights and optimizer state (an empty tensor: none).
  void set_slots(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& states) {
    TORCH_CHECK_VALUE(weights.size() == engine_->num_tables() && states.size() == weights.size(),
                      "set_slots needs the weights and state of each of the ", engine_->num_tables(), " tables");
    std::vector<SlotRows> slots;
    for (size_t t = 0; t < weights.size(); ++t) slots.push_back(SlotsOf(weights[t], states[t]));
    engine_->SetSlots(std::move(slots));
    keep_slots_ = weights;
    keep_slots_.insert(keep_slots_.end(), states.begin(), states.end());
  }

  // Each table's bitmap of trained rows (uint8, a bit per row).
  void set_dirty_bitmaps(const std::vector<at::Tensor>& bitmaps) {
    TORCH_CHECK_VALUE(bitmaps.size() == engine_->num_tables(), "set_dirty_bitmaps needs a bitmap per table");
    std::vector<RowBitmap> out;
    for (const at::Tensor& b : bitmaps) {
      TORCH_CHECK_VALUE(b.device().is_cpu() && b.scalar_type() == at::kByte && b.dim() == 1 && b.is_contiguous(),
                        "a bitmap must be a contiguous 1-D uint8 CPU tensor");
      out.push_back(RowBitmap{b.data_ptr<uint8_t>(), uint64_t(b.numel()) * 8});
    }
    engine_->SetDirtyBitmaps(std::move(out));
    keep_bitmaps_ = bitmaps;
  }

  void set_write_guard(int64_t table, bool on) {
    TORCH_CHECK_INDEX(table >= 0 && size_t(table) < engine_->num_tables(), "table ", table, " is outside [0, ",
                      engine_->num_tables(), ")");
    engine_->SetWriteGuard(size_t(table), on);
  }

  c10::Dict<std::string, double> counters() {
    const EngineCounters c = engine_->counters();
    c10::Dict<std::string, double> d;
    d.insert("plan_seconds", c.plan_seconds);
    d.insert("plan_cpu_ns", double(c.plan_cpu_ns));
    d.insert("wait_seconds", c.wait_seconds);
    d.insert("steps_prefetched", double(c.steps_prefetched));
    d.insert("steps", double(c.steps));
    d.insert("rows_written_back", double(c.rows_written_back));
    return d;
  }

  c10::Dict<std::string, double> table_counters(int64_t table) {
    TORCH_CHECK_INDEX(table >= 0 && size_t(table) < engine_->num_tables(), "table ", table, " is outside [0, ",
                      engine_->num_tables(), ")");
    const EngineTableCounters c = engine_->table_counters(size_t(table));
    c10::Dict<std::string, double> d;
    d.insert("rows_loaded", double(c.rows_loaded));
    d.insert("rows_written_back", double(c.rows_written_back));
    d.insert("lazy_rows", double(c.lazy_rows));
    d.insert("move_seconds", c.move_seconds);
    return d;
  }

  void shutdown(bool cancel) {
    if (getpid() == owner_pid_) engine_->Shutdown(cancel);  // a forked child has no threads to stop
  }

 private:
  struct Kept {
    at::Tensor indices, offsets, remapped;
  };

  static uint64_t VersionOf(const at::Tensor& indices, const at::Tensor& offsets) {
    return (uint64_t(indices.unsafeGetTensorImpl()->version_counter().current_version()) << 32) ^
           uint64_t(offsets.unsafeGetTensorImpl()->version_counter().current_version());
  }

  Kept Keep(const at::Tensor& indices, const at::Tensor& offsets) {
    CheckIndexVector(indices, "indices");
    CheckIndexVector(offsets, "offsets");
    TORCH_CHECK_VALUE(offsets.numel() >= 1, "offsets must have at least one entry");
    return Kept{indices, offsets, SlotBuffer(indices.numel())};
  }

  StepInput Input(const Kept& kept, const std::vector<int64_t>& feature_batch, bool train) {
    StepInput in;
    in.indices = kept.indices.data_ptr<int64_t>();
    in.n = size_t(kept.indices.numel());
    in.offsets = kept.offsets.data_ptr<int64_t>();
    in.num_offsets = size_t(kept.offsets.numel());
    in.feature_batch = feature_batch;
    in.train = train;
    in.remapped = kept.remapped.data_ptr<int64_t>();
    in.version = VersionOf(kept.indices, kept.offsets);
    return in;
  }

  // n slots of a pooled buffer no one else refers to (else a new one).
  at::Tensor SlotBuffer(int64_t n) {
    for (at::Tensor& b : pool_)
      if (b.storage().use_count() == 1 && b.numel() >= n) return b.narrow(0, 0, n);
    at::Tensor b = at::empty({std::max<int64_t>(n, 1)}, at::kLong);
    if (pool_.size() < kPoolMax) {
      pool_.push_back(b);
    } else {
      for (at::Tensor& old : pool_)  // replace a smaller free one, so the pool follows the batch size
        if (old.storage().use_count() == 1) {
          old = b;
          break;
        }
    }
    return b.narrow(0, 0, n);
  }

  void CheckOwner() const {
    TORCH_CHECK(getpid() == owner_pid_, "this step engine was made by process ", owner_pid_,
                "; a forked child cannot use it");
  }

  c10::intrusive_ptr<c10::intrusive_ptr_target> keep_index_, keep_mover_, keep_virtual_;
  std::unique_ptr<StepEngine> engine_;
  std::deque<Kept> kept_;  // the pending steps' tensors, in step order
  std::vector<at::Tensor> pool_;
  std::vector<at::Tensor> keep_slots_, keep_bitmaps_;
  const pid_t owner_pid_ = getpid();
};

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::StepEngineHandle;
  m.class_<StepEngineHandle>("StepEngine")
      .def(torch::init<c10::IValue, c10::IValue, std::vector<int64_t>, std::vector<int64_t>, bool,
                       std::vector<int64_t>, c10::IValue>(),
           "(KernelCacheIndex, StepMover, id bounds per table, table of each feature ([]: one per table), "
           "background threads, hook addresses [before_write, fault], VirtualIds or None): a kernel's step "
           "engine.")
      .def("submit", &StepEngineHandle::submit,
           "(indices, offsets, feature_batch, train) -> batch problem (kind 0: queued as the next step).")
      .def("take", &StepEngineHandle::take,
           "(indices, offsets, feature_batch, train) -> (slots, prefetched, mismatch, problem, outcome).")
      .def("drain", &StepEngineHandle::drain, "Waits for the pending steps -> outcome (first failure, overflow).")
      .def("drop_pending", &StepEngineHandle::drop_pending, "Forgets the pending steps (after drain) -> how many.")
      .def("mark_pending_created", &StepEngineHandle::mark_pending_created,
           "Marks the rows pending steps gave to new ids as trained.")
      .def("pending", &StepEngineHandle::pending, "Steps submitted and not taken.")
      .def("in_flight", &StepEngineHandle::in_flight, "Steps whose stages have not all run.")
      .def("wait_for_moves", &StepEngineHandle::wait_for_moves, "Returns once no step is moving.")
      .def("on_stage_thread", &StepEngineHandle::on_stage_thread, "Whether the caller is a stage thread.")
      .def("last_taken_step", &StepEngineHandle::last_taken_step, "The last step taken (-1: none).")
      .def("set_lookahead", &StepEngineHandle::set_lookahead,
           "(steps): the look-ahead window; only with no step pending (ValueError otherwise).")
      .def("lookahead", &StepEngineHandle::lookahead, "The look-ahead window (steps).")
      .def("set_slots", &StepEngineHandle::set_slots, "(weights, states): each table's TBE slots.")
      .def("set_dirty_bitmaps", &StepEngineHandle::set_dirty_bitmaps, "(bitmaps): each table's trained rows.")
      .def("set_write_guard", &StepEngineHandle::set_write_guard,
           "(table, on): write-backs of the table call the before_write hook first.")
      .def("counters", &StepEngineHandle::counters, "The engine's counters.")
      .def("table_counters", &StepEngineHandle::table_counters, "(table) -> rows moved and move seconds.")
      .def("shutdown", &StepEngineHandle::shutdown, "(cancel): stops the stage threads.");
}
