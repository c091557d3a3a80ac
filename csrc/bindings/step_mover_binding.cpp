// TorchScript binding of StepMover (torch.classes.mtrains.StepMover): a kernel's row moves
// for one step, every table in one call that releases the GIL (kernel/step_mover.h).
//
// Tables are attached by the Python stores that own their rows: set_mapped for rows in
// memory (DramStore's tensor, ScmStore's mapping), attach_block_store for a BlockStore. The
// mover keeps what it was given alive (tensors, the store object) until detached.
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "bindings/block_store_handle.h"
#include "bindings/engine_parts.h"
#include "bindings/slot_tensors.h"
#include "bindings/id_index_handle.h"
#include "kernel/block_store_tier_rows.h"
#include "kernel/mapped_tier_rows.h"
#include "kernel/step_mover.h"
#include "kernel/virtual_tier_rows.h"

namespace mtrains {
namespace {

using StatusTuple = std::tuple<int64_t, int64_t, std::string>;

StatusTuple ToTuple(const Status& st) { return {static_cast<int64_t>(st.code()), st.sys_errno(), st.message()}; }

DType DTypeOf(at::ScalarType t) {
  if (t == at::kFloat) return DType::kFloat32;
  if (t == at::kHalf) return DType::kFloat16;
  TORCH_CHECK_VALUE(t == at::kBFloat16, "dtype ", t, " must be float32, float16 or bfloat16");
  return DType::kBFloat16;
}

void CheckVector(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous(), name,
                    " must be a contiguous 1-D int64 CPU tensor");
}

class StepMoverHandle : public torch::CustomClassHolder {
 public:
  explicit StepMoverHandle(int64_t num_tables) {
    TORCH_CHECK_VALUE(num_tables >= 1, "a step mover needs at least one table");
    mover_ = std::make_unique<StepMover>(size_t(num_tables));
    keep_.resize(size_t(num_tables));
  }

  // Table `table`'s rows are `rows` ([num_rows, dim + state_dim], dtype of the table), each
  // with a word in `words` (empty: none; uint8 flags; int32 crc32c), never-written rows
  // reading as their lazy initial value (seed, lo, hi). `name` and `first_row_offset`
  // (the byte offset of row 0 in its file) go into error messages.
  void set_mapped(int64_t table, const at::Tensor& rows, const at::Tensor& words, int64_t dim, int64_t state_dim,
                  int64_t seed, double lo, double hi, const std::string& name, int64_t first_row_offset) {
    CheckTable(table);
    TORCH_CHECK_VALUE(rows.device().is_cpu() && rows.dim() == 2 && rows.is_contiguous() && rows.size(0) >= 1 &&
                          rows.size(1) == dim + state_dim,
                      "rows must be a contiguous 2-D CPU tensor of dim + state_dim columns");
    MappedTierRows::Layout l;
    l.rows = static_cast<uint8_t*>(rows.data_ptr());
    l.num_rows = uint64_t(rows.size(0));
    l.dim = uint32_t(dim);
    l.state_dim = uint32_t(state_dim);
    l.dtype = DTypeOf(rows.scalar_type());
    l.seed = uint64_t(seed);
    l.init_lo = lo;
    l.init_hi = hi;
    l.name = name;
    l.first_row_offset = uint64_t(first_row_offset);
    if (words.numel()) {
      TORCH_CHECK_VALUE(words.device().is_cpu() && words.dim() == 1 && words.is_contiguous() &&
                            words.size(0) == rows.size(0) && (words.element_size() == 1 || words.scalar_type() == at::kInt),
                        "words must be a contiguous vector of one uint8 flag or int32 checksum per row");
      l.words = words.data_ptr();
      l.kind = words.element_size() == 1 ? MappedTierRows::Words::kWrittenFlags : MappedTierRows::Words::kChecksums;
    }
    mover_->SetTier(size_t(table), std::make_unique<MappedTierRows>(std::move(l)));
    keep_[size_t(table)] = {rows, words};
  }

  // Table `table`'s rows are in `store` (a torch.classes.mtrains.BlockStore).
  StatusTuple attach_block_store(int64_t table, const c10::IValue& store) {
    CheckTable(table);
    BlockStore* raw = nullptr;
    c10::intrusive_ptr<c10::intrusive_ptr_target> keep;
    Status st = BlockStoreOfHandle(store, &raw, &keep);
    if (!st.ok()) return ToTuple(st);
    mover_->SetTier(size_t(table), std::make_unique<BlockStoreTierRows>(raw));
    store_keep_.resize(mover_->num_tables());
    store_keep_[size_t(table)] = std::move(keep);
    keep_[size_t(table)].clear();
    return ToTuple(st);
  }

  // Table `table` becomes a virtual table over its tier: rows `index` marks fresh load as
  // the initial value of (seed, id + id_offset) (kernel/virtual_tier_rows.h). Call it again
  // after each attach (a new tier replaces the wrapped one).
  StatusTuple wrap_virtual(int64_t table, const c10::intrusive_ptr<IdIndexHandle>& index, int64_t seed, double lo,
                           double hi, int64_t dim, int64_t state_dim, at::ScalarType dtype, int64_t id_offset) {
    CheckTable(table);
    InitialRows init;
    init.seed = uint64_t(seed);
    init.lo = lo;
    init.hi = hi;
    init.dim = uint32_t(dim);
    init.state_dim = uint32_t(state_dim);
    init.dtype = DTypeOf(dtype);
    init.id_offset = id_offset;
    std::shared_ptr<IdIndex> shared = index->index();
    return ToTuple(mover_->WrapTier(size_t(table), [&](std::unique_ptr<TierRows> tier) {
      return std::make_unique<VirtualTierRows>(std::move(tier), shared, init);
    }));
  }

  // Forgets table `table`'s tier (and what kept it alive).
  void detach(int64_t table) {
    CheckTable(table);
    mover_->SetTier(size_t(table), nullptr);
    keep_[size_t(table)].clear();
    if (size_t(table) < store_keep_.size()) store_keep_[size_t(table)].reset();
  }

  // Moves the rows of tables `tables[k]` (TBE `weights[k]`, `states[k]`: empty for none),
  // in order, stopping at the first failure.
  // -> (k of the failed table or -1, its status, per table the positions in its load list
  //     of loads past its TBE, their rows [n, row width] in the weights' dtype, and how
  //     many rows read were never written)
  std::tuple<int64_t, StatusTuple, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<int64_t>> move(
      const std::vector<int64_t>& tables, const std::vector<at::Tensor>& weights,
      const std::vector<at::Tensor>& states, const std::vector<at::Tensor>& evict_ids,
      const std::vector<at::Tensor>& evict_slots, const std::vector<at::Tensor>& load_ids,
      const std::vector<at::Tensor>& load_slots) {
    TORCH_CHECK(getpid() == owner_pid_, "this step mover was made by process ", owner_pid_,
                "; a forked child cannot use it");
    const size_t n = tables.size();
    TORCH_CHECK_VALUE(weights.size() == n && states.size() == n && evict_ids.size() == n &&
                          evict_slots.size() == n && load_ids.size() == n && load_slots.size() == n,
                      "move needs one of each tensor per table");
    std::vector<at::Tensor> positions, rows;
    std::vector<int64_t> lazy;
    for (size_t k = 0; k < n; ++k) {
      CheckTable(tables[k]);
      CheckVector(evict_ids[k], "evict_ids");
      CheckVector(evict_slots[k], "evict_slots");
      CheckVector(load_ids[k], "load_ids");
      CheckVector(load_slots[k], "load_slots");
      TORCH_CHECK_VALUE(evict_ids[k].numel() == evict_slots[k].numel() && load_ids[k].numel() == load_slots[k].numel(),
                        "ids and slots differ in length");
      TableMove m;
      m.table = size_t(tables[k]);
      m.slots = SlotsOf(weights[k], states[k]);
      m.evict_ids = evict_ids[k].data_ptr<int64_t>();
      m.evict_slots = evict_slots[k].data_ptr<int64_t>();
      m.num_evict = size_t(evict_ids[k].numel());
      m.load_ids = load_ids[k].data_ptr<int64_t>();
      m.load_slots = load_slots[k].data_ptr<int64_t>();
      m.num_load = size_t(load_ids[k].numel());
      Status st = mover_->Move(m, &result_);
      if (!st.ok()) return {int64_t(k), ToTuple(st), positions, rows, lazy};
      const int64_t width = int64_t(m.slots.row_bytes() / weights[k].element_size());
      const int64_t over = int64_t(result_.overflow_positions.size());
      lazy.push_back(int64_t(result_.lazy_rows));
      positions.push_back(at::empty({over}, at::kLong));
      rows.push_back(at::empty({over, width}, weights[k].options()));
      if (over) {
        std::memcpy(positions.back().data_ptr(), result_.overflow_positions.data(), size_t(over) * sizeof(int64_t));
        std::memcpy(rows.back().data_ptr(), result_.overflow_rows.data(), result_.overflow_rows.size());
      }
    }
    return {-1, ToTuple(Status::Ok()), positions, rows, lazy};
  }

  StepMover* mover() { return mover_.get(); }

  // Table `table`'s moves so far: rows and the CPU ns of each stage.
  c10::Dict<std::string, int64_t> counters(int64_t table) {
    CheckTable(table);
    const MoveCounters c = mover_->counters(size_t(table));
    c10::Dict<std::string, int64_t> d;
    d.insert("moves", int64_t(c.moves));
    d.insert("rows_loaded", int64_t(c.rows_loaded));
    d.insert("rows_written_back", int64_t(c.rows_written_back));
    d.insert("lazy_rows", int64_t(c.cpu.lazy_rows));
    d.insert("write_back_ns", int64_t(c.cpu.write_back_ns));
    d.insert("read_ns", int64_t(c.cpu.read_ns));
    d.insert("verify_ns", int64_t(c.cpu.verify_ns));
    d.insert("copy_ns", int64_t(c.cpu.copy_ns));
    return d;
  }

 private:
  void CheckTable(int64_t table) const {
    TORCH_CHECK_INDEX(table >= 0 && size_t(table) < mover_->num_tables(), "table ", table, " is outside [0, ",
                      mover_->num_tables(), ")");
  }

  std::unique_ptr<StepMover> mover_;
  std::vector<std::vector<at::Tensor>> keep_;  // per table: the tensors a mapped tier uses
  std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> store_keep_;  // per table: its BlockStore object
  MoveResult result_;  // scratch of move (the kernel's I/O worker moves, one step at a time)
  const pid_t owner_pid_ = getpid();
};

}  // namespace

StepMover* StepMoverOfHandle(const c10::IValue& handle, c10::intrusive_ptr<c10::intrusive_ptr_target>* keep) {
  TORCH_CHECK_VALUE(handle.isObject() && handle.type() == c10::getCustomClassType<c10::intrusive_ptr<StepMoverHandle>>(),
                    "expected a torch.classes.mtrains.StepMover, got ", handle.type()->str());
  auto h = handle.toCustomClass<StepMoverHandle>();
  *keep = h;
  return h->mover();
}

}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::StepMoverHandle;
  m.class_<StepMoverHandle>("StepMover")
      .def(torch::init<int64_t>(), "(num_tables): a kernel's row moves, every table per call.")
      .def("set_mapped", &StepMoverHandle::set_mapped,
           "(table, rows, words, dim, state_dim, seed, lo, hi, name, first_row_offset): the table's rows are "
           "in memory.")
      .def("attach_block_store", &StepMoverHandle::attach_block_store,
           "(table, BlockStore object) -> status: the table's rows are in the store.")
      .def("wrap_virtual", &StepMoverHandle::wrap_virtual,
           "(table, id_index, seed, lo, hi, dim, state_dim, dtype, id_offset) -> status: a virtual table's tier.")
      .def("detach", &StepMoverHandle::detach, "(table): forgets the table's tier.")
      .def("move", &StepMoverHandle::move,
           "(tables, weights, states, evict_ids, evict_slots, load_ids, load_slots) -> (failed table's "
           "position or -1, status, and per table: overflow positions, overflow rows, rows never written).")
      .def("counters", &StepMoverHandle::counters, "(table) -> rows moved and CPU ns per stage.");
}
