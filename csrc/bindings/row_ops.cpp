// Row gathers and scatters between the TBE's cache slots and store rows (torch.ops.mtrains).
//
// Plain per-row memcpy in the calling thread: the prefetch thread runs these beside the
// training step, and on a small machine an extra OpenMP team would only fight the step's
// own threads for cores. Byte copies also move fp32 optimizer state inside fp16 rows
// without conversion (see torchrec_mtrains/kernels/row_codec.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <tuple>
#include <algorithm>
#include <type_traits>

#include "common/crc32c.h"
#include "kernel/slot_rows.h"
#include "storage/lazy_init.h"

namespace mtrains {
namespace {

void CheckMatrix(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(), name,
                    " must be a contiguous 2-D CPU tensor");
}

void CheckSlots(const at::Tensor& slots, int64_t rows, const char* what) {
  TORCH_CHECK_VALUE(slots.device().is_cpu() && slots.scalar_type() == at::kLong && slots.dim() == 1 &&
                        slots.is_contiguous(),
                    what, " indices must be a contiguous 1-D int64 CPU tensor");
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < slots.numel(); ++i)
    TORCH_CHECK_INDEX(s[i] >= 0 && s[i] < rows, what, " index ", s[i], " at position ", i,
                      " is outside [0, ", rows, ")");
}

size_t RowBytes(const at::Tensor& t) { return size_t(t.size(1)) * t.element_size(); }

// Rows at random places of a large table each cost cache (and TLB) misses on every line;
// asking for the lines of the row kAheadRows positions ahead overlaps those misses (a
// 26K-row batch of 516-byte rows: 12.9 ms -> 6.5 ms for a checksum pass on this VM).
constexpr int64_t kAheadRows = 8;
constexpr int64_t kVerifyChunk = 64;  // rows copied before their checks (GatherRows)

}  // namespace

// rows[i] = weights[slots[i]] ++ state[slots[i]] (bytes), in `out_dtype`.
at::Tensor PackRows(const at::Tensor& weights, const c10::optional<at::Tensor>& state,
                    const at::Tensor& slots, at::ScalarType out_dtype) {
  CheckMatrix(weights, "weights");
  CheckSlots(slots, weights.size(0), "pack_rows");
  const size_t wb = RowBytes(weights);
  size_t sb = 0;
  if (state.has_value()) {
    CheckMatrix(*state, "state");
    TORCH_CHECK_VALUE(state->size(0) == weights.size(0), "state and weights differ in rows");
    sb = RowBytes(*state);
  }
  const size_t elem = c10::elementSize(out_dtype);
  TORCH_CHECK_VALUE((wb + sb) % elem == 0, "row bytes ", wb + sb, " are not a multiple of ", elem);
  const int64_t n = slots.numel();
  at::Tensor out = at::empty({n, int64_t((wb + sb) / elem)}, at::TensorOptions().dtype(out_dtype));
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  const auto* w = static_cast<const uint8_t*>(weights.data_ptr());
  const auto* st = sb ? static_cast<const uint8_t*>(state->data_ptr()) : nullptr;
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAheadRows < n) {
      SlotRows::PrefetchBytes(w + s[i + kAheadRows] * wb, wb, false);
      if (sb) SlotRows::PrefetchBytes(st + s[i + kAheadRows] * sb, sb, false);
    }
    std::memcpy(o + i * (wb + sb), w + s[i] * wb, wb);
    if (sb) std::memcpy(o + i * (wb + sb) + wb, st + s[i] * sb, sb);
  }
  return out;
}

// weights[slots[i]] ++ state[slots[i]] = rows[i] (bytes).
void UnpackRows(const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& weights,
                const c10::optional<at::Tensor>& state) {
  CheckMatrix(rows, "rows");
  CheckMatrix(weights, "weights");
  CheckSlots(slots, weights.size(0), "unpack_rows");
  const size_t wb = RowBytes(weights), sb = state.has_value() ? RowBytes(*state) : 0;
  if (state.has_value()) {
    CheckMatrix(*state, "state");
    TORCH_CHECK_VALUE(state->size(0) == weights.size(0), "state and weights differ in rows");
  }
  TORCH_CHECK_VALUE(rows.size(0) == slots.numel() && RowBytes(rows) == wb + sb, "rows have ",
                    RowBytes(rows), " bytes per row for ", slots.numel(), " slots; expected ", wb + sb);
  const auto* r = static_cast<const uint8_t*>(rows.data_ptr());
  auto* w = static_cast<uint8_t*>(weights.data_ptr());
  auto* st = sb ? static_cast<uint8_t*>(state->data_ptr()) : nullptr;
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t n = slots.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAheadRows < n) {
      SlotRows::PrefetchBytes(w + s[i + kAheadRows] * wb, wb, true);
      if (sb) SlotRows::PrefetchBytes(st + s[i + kAheadRows] * sb, sb, true);
    }
    std::memcpy(w + s[i] * wb, r + i * (wb + sb), wb);
    if (sb) std::memcpy(st + s[i] * sb, r + i * (wb + sb) + wb, sb);
  }
}

namespace {

DType DTypeOf(at::ScalarType t) {
  if (t == at::kFloat) return DType::kFloat32;
  if (t == at::kHalf) return DType::kFloat16;
  TORCH_CHECK_VALUE(t == at::kBFloat16, "dtype ", t, " must be float32, float16 or bfloat16");
  return DType::kBFloat16;
}

// A row's checksum in an SCM table: crc32c of its bytes, with 0 (kept for "never written")
// mapped to 1.
inline uint32_t RowSum(const uint8_t* row, size_t bytes) {
  const uint32_t c = Crc32c(0, row, bytes);
  return c ? c : 1u;
}

// An SCM table's per-row word after the rows (`Tail`): a written flag (uint8_t, first
// format) or the row's checksum (uint32_t, an int32 tensor; RowSum). 0: never written.
template <typename Tail>
void CheckTail(const at::Tensor& tail, const at::Tensor& data, const char* what) {
  TORCH_CHECK_VALUE(tail.dim() == 1 && tail.element_size() == sizeof(Tail) && tail.is_contiguous() &&
                        tail.size(0) == data.size(0) &&
                        (!std::is_same_v<Tail, uint32_t> || tail.scalar_type() == at::kInt),
                    what, ": the per-row ", sizeof(Tail), "-byte words must be a contiguous vector with one "
                    "entry per row", std::is_same_v<Tail, uint32_t> ? " (int32)" : "");
}

// Rows `ids` of an SCM table in memory. Rows whose word is 0 were never written and read as
// their deterministic initial value. Returns the rows, how many were initialised and, with
// checksums, the position in `ids` of the first row whose bytes do not match (-1 if none;
// the rows are then not to be used).
template <typename Tail>
std::tuple<at::Tensor, int64_t, int64_t> GatherRows(const at::Tensor& data, const at::Tensor& tail,
                                                     const at::Tensor& ids, int64_t dim, int64_t state_dim,
                                                     int64_t seed, double lo, double hi, const char* what) {
  CheckMatrix(data, "data");
  CheckTail<Tail>(tail, data, what);
  TORCH_CHECK_VALUE(dim + state_dim == data.size(1), "dim + state_dim must equal the row width");
  CheckSlots(ids, data.size(0), what);
  const DType dtype = DTypeOf(data.scalar_type());
  const size_t rb = RowBytes(data);
  const int64_t n = ids.numel();
  at::Tensor out = at::empty({n, data.size(1)}, data.options());
  auto* o = static_cast<uint8_t*>(out.data_ptr());
  const auto* d = static_cast<const uint8_t*>(data.data_ptr());
  const auto* word = static_cast<const Tail*>(tail.data_ptr());
  const int64_t* s = ids.data_ptr<int64_t>();
  int64_t lazy = 0;
  // Rows are copied a chunk at a time and each chunk's copies checked after it: checking a
  // row right after its copy stalls on the copy's stores (3.5 ms -> 0.9 ms for 13K rows of
  // 516 bytes on this VM). The copy is what is checked: the row handed back is the one
  // that was verified.
  Tail want[kVerifyChunk];
  for (int64_t lo_row = 0; lo_row < n; lo_row += kVerifyChunk) {
    const int64_t hi_row = std::min(n, lo_row + kVerifyChunk);
    for (int64_t i = lo_row; i < hi_row; ++i) {
      if (i + kAheadRows < n) {  // each row costs misses on its bytes and one on its word
        __builtin_prefetch(word + s[i + kAheadRows]);
        SlotRows::PrefetchBytes(d + s[i + kAheadRows] * rb, rb, false);
      }
      want[i - lo_row] = word[s[i]];
      if (want[i - lo_row] == 0) {
        LazyInitRow(uint64_t(seed), uint64_t(s[i]), lo, hi, uint32_t(dim), uint32_t(state_dim), dtype,
                    o + i * rb);
        ++lazy;
        continue;
      }
      std::memcpy(o + i * rb, d + s[i] * rb, rb);
    }
    if constexpr (std::is_same_v<Tail, uint32_t>) {
      for (int64_t i = lo_row; i < hi_row; ++i)
        if (want[i - lo_row] && RowSum(o + i * rb, rb) != want[i - lo_row]) return {out, lazy, i};
    }
  }
  return {out, lazy, -1};
}

std::tuple<at::Tensor, int64_t> GatherRowsOrInit(const at::Tensor& data, const at::Tensor& written,
                                                  const at::Tensor& ids, int64_t dim, int64_t state_dim,
                                                  int64_t seed, double lo, double hi) {
  auto [rows, lazy, bad] = GatherRows<uint8_t>(data, written, ids, dim, state_dim, seed, lo, hi,
                                               "gather_rows_or_init");
  return {rows, lazy};
}

std::tuple<at::Tensor, int64_t, int64_t> GatherRowsChecked(const at::Tensor& data, const at::Tensor& sums,
                                                            const at::Tensor& ids, int64_t dim,
                                                            int64_t state_dim, int64_t seed, double lo,
                                                            double hi) {
  return GatherRows<uint32_t>(data, sums, ids, dim, state_dim, seed, lo, hi, "gather_rows_checked");
}

// data[ids[i]] = rows[i] (the last of repeated ids wins, every id checked before any row is
// written) and each written row's word set: 1, or its checksum.
template <typename Tail>
void ScatterRows(const at::Tensor& rows, const at::Tensor& ids, const at::Tensor& data, const at::Tensor& tail,
                 const char* what) {
  CheckTail<Tail>(tail, data, what);
  CheckMatrix(rows, "rows");
  CheckMatrix(data, "data");
  CheckSlots(ids, data.size(0), what);  // every id, before any row is written
  const size_t rb = RowBytes(data);
  TORCH_CHECK_VALUE(rows.size(0) == ids.numel() && RowBytes(rows) == rb, what, ": rows have ", RowBytes(rows),
                    " bytes per row for ", ids.numel(), " ids; expected ", rb);
  const auto* r = static_cast<const uint8_t*>(rows.data_ptr());
  auto* d = static_cast<uint8_t*>(data.data_ptr());
  auto* word = static_cast<Tail*>(tail.data_ptr());
  const int64_t* s = ids.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAheadRows < n) {
      __builtin_prefetch(word + s[i + kAheadRows], 1);
      SlotRows::PrefetchBytes(d + s[i + kAheadRows] * rb, rb, true);
    }
    std::memcpy(d + s[i] * rb, r + i * rb, rb);
    if constexpr (std::is_same_v<Tail, uint32_t>) {
      word[s[i]] = RowSum(r + i * rb, rb);  // the bytes just copied, read where they are hot
    } else {
      word[s[i]] = 1;
    }
  }
}

void ScatterRowsMark(const at::Tensor& rows, const at::Tensor& ids, const at::Tensor& data,
                     const at::Tensor& written) {
  ScatterRows<uint8_t>(rows, ids, data, written, "scatter_rows_mark");
}

void ScatterRowsChecked(const at::Tensor& rows, const at::Tensor& ids, const at::Tensor& data,
                        const at::Tensor& sums) {
  ScatterRows<uint32_t>(rows, ids, data, sums, "scatter_rows_checked");
}

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("gather_rows_or_init(Tensor data, Tensor written, Tensor ids, int dim, int state_dim, "
        "int seed, float lo, float hi) -> (Tensor, int)");
  m.def("scatter_rows_mark(Tensor rows, Tensor ids, Tensor(a!) data, Tensor(b!) written) -> ()");
  m.def("gather_rows_checked(Tensor data, Tensor sums, Tensor ids, int dim, int state_dim, "
        "int seed, float lo, float hi) -> (Tensor, int, int)");
  m.def("scatter_rows_checked(Tensor rows, Tensor ids, Tensor(a!) data, Tensor(b!) sums) -> ()");
  m.def("pack_rows(Tensor weights, Tensor? state, Tensor slots, ScalarType out_dtype) -> Tensor");
  m.def("unpack_rows(Tensor rows, Tensor slots, Tensor(a!) weights, Tensor(b!)? state) -> ()");
}

TORCH_LIBRARY_IMPL(mtrains, CPU, m) {
  m.impl("pack_rows", &mtrains::PackRows);
  m.impl("unpack_rows", &mtrains::UnpackRows);
  m.impl("gather_rows_or_init", &mtrains::GatherRowsOrInit);
  m.impl("scatter_rows_mark", &mtrains::ScatterRowsMark);
  m.impl("gather_rows_checked", &mtrains::GatherRowsChecked);
  m.impl("scatter_rows_checked", &mtrains::ScatterRowsChecked);
}
