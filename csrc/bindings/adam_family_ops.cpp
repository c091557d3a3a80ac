// The backward of a tiered table trained with Adam, partial row-wise Adam, LAMB or partial
// row-wise LAMB (torch.ops.mtrains.adam_family_backward; torchrec_mtrains/kernels/adam_family.py).
//
// A first pass over the step's indices, in one share of whole bags per thread, finds each
// touched slot (its position) and what each index adds to it (the output gradient's row: the
// bag's, scaled by the index's per-sample weight and, for MEAN, by 1/L; a sequence's own
// row); a stable counting sort, each share placing its own indices, groups them by slot; the
// position map is cleared as soon as it has been read; and the slots, handed to torch's
// intra-op threads (OpenMP: the extension is built with -fopenmp) in chunks, each sum their
// indices' gradients in index order (so the sums are the same whatever the threads) and
// update at once (kernel/adam_update.h).
// `positions[t]` (int32, one per slot of table t, -1 when free) maps a touched slot to its
// position while the call runs and is left all -1 again.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel/adam_update.h"
#include "kernel/slot_rows.h"

namespace mtrains {
namespace {

// Indices ahead whose slot's position the first pass fetches: the position map is read at
// random, a cache miss an index once the rows' update has pushed it out (2.3 -> 0.9 ms for
// 82K indices on this VM).
constexpr int64_t kPositionLookahead = 16;
// Rows ahead whose weights and state the update fetches while it sums the current one. They
// are fetched into L2 (locality 1), not L1: a 128-dim row's 24 lines at once filled L1's few miss
// buffers and each further prefetch waited for one: a random read-modify-write of 26K such
// rows took 2.9 ms on two threads fetched into L1, 2.1 ms fetched into L2.
constexpr int64_t kRowLookahead = 2;
constexpr int kRowLocality = 1;
// The update's positions go to the threads in chunks of about equal cost, taken in turn as
// each thread finishes one: a row's update (1.5 KB of weights and momenta read and written)
// costs some 10-50 of its indices' gradient sums (a 512 B row each, mostly cached) depending
// on the machine's memory, and the hot rows, touched first, carry most indices -- split by
// positions alone, the first thread summed 4x the second's indices and ran 1.5x as long.
constexpr int64_t kRowCost = 16;
constexpr int64_t kChunksPerThread = 8;
// Below this many indices per thread the first pass runs on one thread.
constexpr int64_t kIndicesPerShare = 4096;
constexpr int32_t kFree = -1;  // an untouched slot's entry in the position map
constexpr int64_t kSum = 0, kMean = 1, kNone = 2;  // FBGEMM's PoolingMode values

// What one index adds to its slot's summed gradient: a row of the output gradient, scaled.
struct Contribution {
  const float* grad;
  float scale;
};

// A table's touched slots and what each index adds to them, grouped by slot.
struct TableGrads {
  int64_t dim = 0;
  int32_t* position = nullptr;  // slot -> its claim (ClaimCode) while the call runs; kFree when untouched
  int64_t rows = 0;
  std::vector<int64_t> slots;       // position -> slot
  std::vector<int64_t> first;       // position -> its first entry in `adds` (one past the last at the end)
  std::vector<Contribution> adds;   // what each index adds, by position, in index order within one

  void Prefetch(int64_t slot) const {
    if (slot >= 0 && slot < rows) __builtin_prefetch(position + slot, 1, 3);
  }
};

// One thread's share of the first pass (a run of whole bags), per table: the slots it
// touched first (claimed), in order, and for each of its indices in index order, its slot's
// claim (then position) and what it adds; then how many of its indices each position has.
struct Share {
  int64_t index = 0;  // k of num_shares, in bag order
  std::vector<std::vector<int64_t>> claimed;
  std::vector<std::vector<int32_t>> position_of;  // a ClaimCode, then the position
  std::vector<std::vector<Contribution>> adds;
  std::vector<std::vector<int64_t>> count;  // per position, then where its next entry goes in the table's `adds`
  explicit Share(size_t tables) : claimed(tables), position_of(tables), adds(tables), count(tables) {}
};

// What the position map holds for a claimed slot: which share claimed it, and its place in
// that share's claimed list. Written once by the claim, so every index reads its slot's
// owner in the first pass and the map is not read again; the positions (every share's
// claims in share order) follow once all shares are done.
// The share sits in the low bits (a shift and a mask to read, not a division).
struct ClaimCode {
  int share_bits;  // enough bits for every share's number
  int32_t Encode(int64_t share, int64_t claimed) const { return int32_t((claimed << share_bits) | share); }
  int64_t Share(int32_t code) const { return code & ((int32_t(1) << share_bits) - 1); }
  int64_t Claimed(int32_t code) const { return code >> share_bits; }
};

// Where a batch's bags sit. Bags are ordered as the offsets order them: feature by feature,
// and under a variable batch rank by rank within a feature; a pooled output gradient is
// [batch, sum(dims)] (a fixed batch) or rank by rank, feature by feature (a variable one).
struct BagLayout {
  std::vector<int64_t> feature_end;   // one past each feature's last bag
  std::vector<int64_t> output_start;  // each bag's row in the pooled output gradient
  int64_t output_numel = 0;           // the pooled output gradient's size
};

BagLayout LayoutOf(int64_t num_features, int64_t num_bags, const std::vector<int64_t>& dims,
                   at::IntArrayRef batch_sizes, int64_t total_dim) {
  const bool fixed = batch_sizes.empty();
  const int64_t ranks = fixed ? 1 : int64_t(batch_sizes.size()) / num_features;
  auto bags = [&](int64_t f, int64_t r) { return fixed ? num_bags / num_features : batch_sizes[size_t(f * ranks + r)]; };
  BagLayout out;
  out.feature_end.resize(static_cast<size_t>(num_features));
  std::vector<int64_t> start_of(static_cast<size_t>(num_features * ranks), 0);  // (feature, rank) -> output start
  for (int64_t r = 0, at = 0; r < ranks; ++r) {
    for (int64_t f = 0; f < num_features; ++f) {
      start_of[size_t(f * ranks + r)] = at;
      at += bags(f, r) * dims[size_t(f)];
      out.output_numel = at;
    }
  }
  out.output_start.reserve(size_t(num_bags));
  for (int64_t f = 0, column = 0, bag = 0; f < num_features; column += dims[size_t(f)], ++f) {
    for (int64_t r = 0; r < ranks; ++r) {
      for (int64_t b = 0; b < bags(f, r); ++b, ++bag)
        out.output_start.push_back(fixed ? b * total_dim + column : start_of[size_t(f * ranks + r)] + b * dims[size_t(f)]);
    }
    out.feature_end[size_t(f)] = bag;
  }
  return out;
}

// The step's batch, as the first pass reads it.
struct BatchView {
  const int64_t* offsets;
  const int64_t* indices;
  const float* per_sample_weights;  // nullptr: all 1
  const float* grad;                // the output gradient
  const BagLayout* layout;
  at::IntArrayRef feature_tables;
  int64_t pooling;
};

// The first pass over bags [bag_begin, bag_end): each index's slot is checked, claimed by
// this share when no share has touched it yet (kFree -> its ClaimCode, atomically: shares race for
// a hot row), and its contribution recorded.
void FirstPassShare(const BatchView& batch, const ClaimCode& codes, int64_t bag_begin, int64_t bag_end,
                    std::vector<TableGrads>& tables, Share& share) {
  const BagLayout& layout = *batch.layout;
  const int64_t* off = batch.offsets;
  const int64_t* idx = batch.indices;
  const int64_t num_features = int64_t(batch.feature_tables.size()), index_end = off[bag_end];
  const int64_t first_feature =
      std::upper_bound(layout.feature_end.begin(), layout.feature_end.end(), bag_begin) - layout.feature_end.begin();
  // Each table's indices in this share, so that its lists grow once.
  std::vector<int64_t> table_indices(tables.size(), 0);
  for (int64_t f = first_feature, bag = bag_begin; f < num_features && bag < bag_end; ++f) {
    const int64_t end_bag = std::min(bag_end, layout.feature_end[size_t(f)]);
    table_indices[size_t(batch.feature_tables[size_t(f)])] += off[end_bag] - off[bag];
    bag = end_bag;
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    share.position_of[t].reserve(size_t(table_indices[t]));
    share.adds[t].reserve(size_t(table_indices[t]));
  }
  int64_t bag = bag_begin;
  for (int64_t f = first_feature; f < num_features && bag < bag_end; ++f) {
    const size_t t = size_t(batch.feature_tables[size_t(f)]);
    TableGrads& table = tables[t];
    for (; bag < std::min(bag_end, layout.feature_end[size_t(f)]); ++bag) {
      const int64_t begin = off[bag], end = off[bag + 1];
      const float mean = batch.pooling == kMean && end > begin ? 1.0f / float(end - begin) : 1.0f;
      for (int64_t i = begin; i < end; ++i) {
        if (i + kPositionLookahead < index_end) table.Prefetch(idx[i + kPositionLookahead]);
        const int64_t slot = idx[i];
        TORCH_CHECK_INDEX(slot >= 0 && slot < table.rows, "slot ", slot, " is outside the table's ", table.rows,
                          " slots");
        int32_t* position = table.position + slot;
        // A claim is written once, so a claim read here is the slot's for the whole call.
        int32_t code = __atomic_load_n(position, __ATOMIC_RELAXED);
        if (code == kFree) {
          const int32_t mine = codes.Encode(share.index, int64_t(share.claimed[t].size()));
          if (__atomic_compare_exchange_n(position, &code, mine, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            share.claimed[t].push_back(slot);
            code = mine;
          }  // else `code` is now the share's that won the race
        }
        share.position_of[t].push_back(code);
        const float* row_grad =
            batch.pooling == kNone ? batch.grad + i * table.dim : batch.grad + layout.output_start[size_t(bag)];
        share.adds[t].push_back({row_grad, (batch.per_sample_weights ? batch.per_sample_weights[i] : 1.0f) * mean});
      }
    }
  }
}

// After the shares' first pass: every table's positions numbered share by share (each
// share's claimed slots in its order of first touch), then the contributions grouped by
// position in index order -- a stable counting sort, each share counting and placing its own
// indices (the shares are runs of indices in order, so share by share is index order) --
// and the position map left all kFree again (`reset` says so).
void GroupByPosition(const ClaimCode& codes, std::vector<Share>& shares, std::vector<TableGrads>& tables,
                     bool& reset) {
  const int64_t num_shares = int64_t(shares.size()), num_tables = int64_t(tables.size());
  // Each table's first position of each share (its claims come after the earlier shares').
  std::vector<std::vector<int64_t>> position_base(static_cast<size_t>(num_tables));
  for (int64_t t = 0; t < num_tables; ++t) {
    int64_t positions_so_far = 0, indices_so_far = 0;
    for (int64_t k = 0; k < num_shares; ++k) {
      position_base[size_t(t)].push_back(positions_so_far);
      positions_so_far += int64_t(shares[size_t(k)].claimed[size_t(t)].size());
      indices_so_far += int64_t(shares[size_t(k)].position_of[size_t(t)].size());
    }
    tables[size_t(t)].slots.resize(size_t(positions_so_far));
    tables[size_t(t)].first.assign(size_t(positions_so_far + 1), 0);
    tables[size_t(t)].adds.resize(size_t(indices_so_far));
  }
  at::parallel_for(0, num_shares, 1, [&](int64_t share_begin, int64_t share_end) {
    for (int64_t k = share_begin; k < share_end; ++k)
      for (int64_t t = 0; t < num_tables; ++t) {
        TableGrads& table = tables[size_t(t)];
        Share& share = shares[size_t(k)];
        const std::vector<int64_t>& base = position_base[size_t(t)];
        const std::vector<int64_t>& claimed = share.claimed[size_t(t)];
        std::copy(claimed.begin(), claimed.end(), table.slots.begin() + base[size_t(k)]);
        std::vector<int64_t>& count = share.count[size_t(t)];
        count.assign(table.slots.size(), 0);
        for (int32_t& code : share.position_of[size_t(t)]) {
          code = int32_t(base[size_t(codes.Share(code))] + codes.Claimed(code));  // from here on, the position
          ++count[size_t(code)];
        }
      }
  });
  // Each position's entries: share 0's, then share 1's, ...; each count becomes where the
  // share's next entry for that position goes.
  for (int64_t t = 0; t < num_tables; ++t) {
    TableGrads& table = tables[size_t(t)];
    int64_t at = 0;
    for (size_t p = 0; p < table.slots.size(); ++p) {
      table.first[p] = at;
      for (int64_t k = 0; k < num_shares; ++k) {
        int64_t& count = shares[size_t(k)].count[size_t(t)][p];
        const int64_t n = count;
        count = at;
        at += n;
      }
    }
    table.first[table.slots.size()] = at;
  }
  at::parallel_for(0, num_shares, 1, [&](int64_t share_begin, int64_t share_end) {
    for (int64_t k = share_begin; k < share_end; ++k)
      for (int64_t t = 0; t < num_tables; ++t) {
        TableGrads& table = tables[size_t(t)];
        Share& share = shares[size_t(k)];
        std::vector<int64_t>& next = share.count[size_t(t)];
        const std::vector<int32_t>& position_of = share.position_of[size_t(t)];
        const std::vector<Contribution>& adds = share.adds[size_t(t)];
        for (size_t j = 0; j < position_of.size(); ++j) table.adds[size_t(next[size_t(position_of[j])]++)] = adds[j];
        for (int64_t slot : share.claimed[size_t(t)]) table.position[slot] = kFree;
      }
  });
  reset = true;
}

// out += scale * grad over dim values: the hot loop of the gradient sums. Cloned for AVX2
// (picked at load time where the CPU has it; the extension is built for SSE4.2): 8% off the
// Adam backward of a 128-dim table. Element by element, so every clone sums alike.
__attribute__((target_clones("avx2", "default"))) void AddScaled(float* __restrict__ out,
                                                                 const float* __restrict__ grad, float scale,
                                                                 int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) out[d] += scale * grad[d];
}

template <typename T>
void UpdateTable(const AdamTerms& terms, const AdamCorrections& corrections, const TableGrads& grads,
                 at::Tensor& weights, at::Tensor& state) {
  const int64_t dim = grads.dim, n = int64_t(grads.slots.size());
  if (n == 0) return;
  const int64_t state_values = state.size(1);
  T* w = static_cast<T*>(weights.data_ptr());  // float, or fp16 bits (at::Half's layout)
  float* s = state.data_ptr<float>();
  const std::vector<int64_t>& first = grads.first;
  const SlotRows rows{reinterpret_cast<uint8_t*>(w), size_t(dim) * sizeof(T), reinterpret_cast<uint8_t*>(s),
                      size_t(state_values) * sizeof(float), weights.size(0)};
  // Chunks of positions of about equal cost (kRowCost).
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads * kChunksPerThread, n / 16));
  const int64_t total = n * kRowCost + first[size_t(n)];
  std::vector<int64_t> bound(static_cast<size_t>(chunks + 1), n);
  bound[0] = 0;
  for (int64_t c = 1, p = 0; c < chunks; ++c) {
    while (p < n && p * kRowCost + first[size_t(p)] < total * c / chunks) ++p;
    bound[size_t(c)] = p;
  }
  std::atomic<int64_t> next_chunk{0};
  at::parallel_for(0, std::min(threads, chunks), 1, [&](int64_t, int64_t) {
    std::vector<float> sum(static_cast<size_t>(dim));
    for (int64_t c = next_chunk++; c < chunks; c = next_chunk++) {
      const int64_t begin = bound[size_t(c)], end = bound[size_t(c + 1)];
      for (int64_t p = begin; p < end; ++p) {
        // A coming row's weights and state from DRAM while this one sums.
        if (p + kRowLookahead < end) rows.Prefetch<kRowLocality>(grads.slots[size_t(p + kRowLookahead)], true);
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t k = first[size_t(p)]; k < first[size_t(p + 1)]; ++k) {
          const Contribution& add = grads.adds[size_t(k)];
          AddScaled(sum.data(), add.grad, add.scale, dim);
        }
        const int64_t slot = grads.slots[size_t(p)];
        UpdateRow<T>(terms, corrections, dim, sum.data(), w + slot * dim, s + slot * state_values);
      }
    }
  });
}

void AdamFamilyBackward(const at::Tensor& grad_output, const at::Tensor& indices, const at::Tensor& offsets,
                        const c10::optional<at::Tensor>& per_sample_weights, at::IntArrayRef feature_tables,
                        at::IntArrayRef batch_sizes, int64_t pooling, at::TensorList weights, at::TensorList states,
                        at::TensorList positions, int64_t kind, double learning_rate, double eps, double beta1,
                        double beta2, double weight_decay, int64_t step, double max_gradient) {
  const int64_t num_tables = int64_t(weights.size());
  const int64_t num_features = int64_t(feature_tables.size());
  TORCH_CHECK_VALUE(num_tables > 0 && int64_t(states.size()) == num_tables && int64_t(positions.size()) == num_tables,
                    "weights, states and positions must give one tensor per table");
  TORCH_CHECK_VALUE(kind >= 0 && kind <= 3, "kind must be 0..3 (AdamKind)");
  TORCH_CHECK_VALUE(step >= 1, "step must be >= 1");
  TORCH_CHECK_VALUE(pooling == kSum || pooling == kMean || pooling == kNone, "pooling must be SUM, MEAN or NONE");
  TORCH_CHECK_VALUE(indices.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong && indices.dim() == 1 &&
                        offsets.dim() == 1 && indices.is_contiguous() && offsets.is_contiguous(),
                    "indices and offsets must be contiguous 1-D int64 tensors");
  AdamTerms terms;
  terms.kind = AdamKind(kind);
  terms.learning_rate = float(learning_rate);
  terms.eps = float(eps);
  terms.beta1 = float(beta1);
  terms.beta2 = float(beta2);
  terms.weight_decay = float(weight_decay);
  terms.step = step;
  terms.max_gradient = float(max_gradient);

  std::vector<TableGrads> tables(static_cast<size_t>(num_tables));
  for (int64_t t = 0; t < num_tables; ++t) {
    const at::Tensor& w = weights[size_t(t)];
    const at::Tensor& s = states[size_t(t)];
    const at::Tensor& p = positions[size_t(t)];
    TORCH_CHECK_VALUE(w.dim() == 2 && w.is_contiguous() && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kHalf),
                      "table ", t, ": weights must be a contiguous 2-D fp32 or fp16 tensor");
    TORCH_CHECK_VALUE(s.dim() == 2 && s.is_contiguous() && s.scalar_type() == at::kFloat && s.size(0) == w.size(0) &&
                          s.size(1) == terms.StateValues(w.size(1)),
                      "table ", t, ": state must be contiguous fp32 [", w.size(0), ", ", terms.StateValues(w.size(1)),
                      "]");
    TORCH_CHECK_VALUE(p.dim() == 1 && p.is_contiguous() && p.scalar_type() == at::kInt && p.size(0) >= w.size(0),
                      "table ", t, ": positions must be contiguous int32 with one entry per slot");
    tables[size_t(t)].dim = w.size(1);
    tables[size_t(t)].rows = w.size(0);
    tables[size_t(t)].position = p.data_ptr<int32_t>();
  }
  std::vector<int64_t> dims(static_cast<size_t>(num_features), 0);
  int64_t total_dim = 0;
  for (int64_t f = 0; f < num_features; ++f) {
    TORCH_CHECK_VALUE(feature_tables[size_t(f)] >= 0 && feature_tables[size_t(f)] < num_tables,
                      "feature ", f, "'s table is out of range");
    dims[size_t(f)] = tables[size_t(feature_tables[size_t(f)])].dim;
    total_dim += dims[size_t(f)];
  }
  const int64_t num_bags = offsets.numel() - 1;
  TORCH_CHECK_VALUE(num_bags >= 0 && num_features > 0 && (!batch_sizes.empty() || num_bags % num_features == 0),
                    "offsets must have one entry per bag plus one");
  if (!batch_sizes.empty()) {
    TORCH_CHECK_VALUE(int64_t(batch_sizes.size()) % num_features == 0, "batch_sizes must give every feature's ranks");
    int64_t bags = 0;
    for (int64_t b : batch_sizes) bags += b;
    TORCH_CHECK_VALUE(bags == num_bags, "batch_sizes give ", bags, " bags, offsets ", num_bags);
  }
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t n = indices.numel();
  TORCH_CHECK_VALUE(num_bags == 0 || (off[0] == 0 && off[num_bags] == n), "offsets must run from 0 to len(indices)");
  const float* psw = nullptr;
  at::Tensor psw_float;
  if (per_sample_weights.has_value()) {
    psw_float = per_sample_weights->to(at::kFloat).contiguous();
    TORCH_CHECK_VALUE(psw_float.numel() == n, "per_sample_weights must have one weight per index");
    psw = psw_float.data_ptr<float>();
  }
  const at::Tensor grad = grad_output.to(at::kFloat).contiguous();
  const float* g = grad.data_ptr<float>();
  const BagLayout layout = LayoutOf(num_features, num_bags, dims, batch_sizes, total_dim);
  if (pooling == kNone) {
    TORCH_CHECK_VALUE(grad.numel() == n * (num_features ? dims[0] : 0), "the output gradient must be [len(indices), dim]");
  } else {
    TORCH_CHECK_VALUE(grad.numel() == layout.output_numel, "the output gradient's size does not match the batch");
  }
  for (int64_t bag = 0; bag < num_bags; ++bag) TORCH_CHECK_VALUE(off[bag] <= off[bag + 1], "offsets must not decrease");
  // The first pass, in shares of whole bags with about equal indices, one per thread: each
  // share claims the slots it touches first (kFree -> its ClaimCode, atomically: shares race
  // for a hot row), then every table's positions are numbered share by share, and each index
  // learns its slot's position. Which share claims a slot decides only its position, not the
  // row's sum or update, so the results do not depend on the threads.
  TORCH_CHECK_VALUE(n < std::numeric_limits<int32_t>::max(), "a step takes fewer than 2^31 indices, not ", n);
  int64_t num_shares = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / kIndicesPerShare));
  int share_bits = 0;
  while ((int64_t(1) << share_bits) < num_shares) ++share_bits;
  if ((n << share_bits) >= std::numeric_limits<int32_t>::max()) num_shares = 1, share_bits = 0;  // codes fit int32
  const ClaimCode codes{share_bits};
  std::vector<Share> shares(static_cast<size_t>(num_shares), Share(size_t(num_tables)));
  for (int64_t k = 0; k < num_shares; ++k) shares[size_t(k)].index = k;
  // Every touched slot's position goes back to kFree, whether the update completes or a bad
  // index stops the first pass (nothing is updated then).
  struct ResetPositions {
    std::vector<Share>& shares;
    std::vector<TableGrads>& tables;
    bool done = false;
    ~ResetPositions() {
      if (done) return;
      for (const Share& share : shares)
        for (size_t t = 0; t < tables.size(); ++t)
          for (int64_t slot : share.claimed[t]) tables[t].position[slot] = kFree;
    }
  } reset{shares, tables};
  std::vector<int64_t> share_bag(static_cast<size_t>(num_shares + 1), num_bags);  // each share's first bag
  share_bag[0] = 0;
  for (int64_t k = 1; k < num_shares; ++k)
    share_bag[size_t(k)] = std::upper_bound(off, off + num_bags, n * k / num_shares - 1) - off;
  const BatchView batch{off, idx, psw, g, &layout, feature_tables, pooling};
  at::parallel_for(0, num_shares, 1, [&](int64_t share_begin, int64_t share_end) {
    for (int64_t k = share_begin; k < share_end; ++k)
      FirstPassShare(batch, codes, share_bag[size_t(k)], share_bag[size_t(k + 1)], tables, shares[size_t(k)]);
  });
  GroupByPosition(codes, shares, tables, reset.done);
  const AdamCorrections corrections = Corrections(terms);
  for (int64_t t = 0; t < num_tables; ++t) {
    const TableGrads& table = tables[size_t(t)];
    at::Tensor w = weights[size_t(t)], s = states[size_t(t)];
    if (w.scalar_type() == at::kHalf) {
      UpdateTable<Fp16Bits>(terms, corrections, table, w, s);
    } else {
      UpdateTable<float>(terms, corrections, table, w, s);
    }
  }
}

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("adam_family_backward(Tensor grad_output, Tensor indices, Tensor offsets, Tensor? per_sample_weights, "
        "int[] feature_tables, int[] batch_sizes, int pooling, Tensor(a!)[] weights, Tensor(b!)[] states, "
        "Tensor(c!)[] positions, int kind, float learning_rate, float eps, float beta1, float beta2, "
        "float weight_decay, int step, float max_gradient) -> ()");
}

TORCH_LIBRARY_IMPL(mtrains, CPU, m) { m.impl("adam_family_backward", &mtrains::AdamFamilyBackward); }
