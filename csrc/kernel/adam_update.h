// AdamUpdate: FBGEMM's Adam, partial row-wise Adam, LAMB and partial row-wise LAMB on
// the rows one step touched, from each row's summed gradient.
//
// FBGEMM's CPU TBE refuses these optimizers, so a tiered table computes its rows' gradients
// itself (torchrec_mtrains/kernels/adam_family.py) and updates them here, with FBGEMM's
// CUDA definitions (fbgemm_gpu/codegen/genscript/optimizers.py):
//
//   m = beta1 m + (1 - beta1) g                       (per weight)
//   v = beta2 v + (1 - beta2) g^2                     (per weight; partial: mean of g^2, per row)
//   r = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay w
//   Adam:  w -= lr r
//   LAMB:  w -= lr (|w| / |r|) r                      (row norms)
//
// with w the weights before the update and t the step count (from 1). A row's optimizer
// state is laid out [momentum1 (dim fp32), momentum2 (dim fp32, or one for the partial
// row-wise ones)] (torchrec_mtrains/layout.py).
//
// One difference: a LAMB row whose r is all zero (a zero gradient with no decay) keeps its
// weights, where FBGEMM's |w| / 0 would write NaN into them.
#pragma once

#include <cstdint>

namespace mtrains {

enum class AdamKind : int64_t {
  kAdam = 0,
  kPartialRowwiseAdam = 1,
  kLamb = 2,
  kPartialRowwiseLamb = 3,
};

struct AdamTerms {
  AdamKind kind = AdamKind::kAdam;
  float learning_rate = 0.01f;
  float eps = 1e-8f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float weight_decay = 0.0f;
  int64_t step = 1;          // t, the bias correction's step count (>= 1)
  float max_gradient = -1;   // clamp each summed gradient to [-max, max]; < 0: no clipping

  bool per_weight_momentum2() const { return kind == AdamKind::kAdam || kind == AdamKind::kLamb; }
  bool lamb() const { return kind == AdamKind::kLamb || kind == AdamKind::kPartialRowwiseLamb; }
  // fp32 state values per row of `dim` weights.
  int64_t StateValues(int64_t dim) const { return dim + (per_weight_momentum2() ? dim : 1); }
};

// The bias corrections 1 - beta1^t and 1 - beta2^t of a step: the same for every row, so
// computed once per step (Corrections(terms)).
struct AdamCorrections {
  float first = 1;
  float second = 1;
};
AdamCorrections Corrections(const AdamTerms& terms);

// An fp16 weight's IEEE binary16 bits (torch's at::Half has the same layout): this code
// builds without torch, for the sanitizer drivers.
struct Fp16Bits {
  uint16_t bits;
};

// Updates one row in place: `weights` (dim values of T: float or Fp16Bits), `state`
// (StateValues(dim) fp32), from `grad` (dim fp32: the row's summed gradient, clipped here
// when the terms say so; overwritten as scratch). `corrections` is Corrections(terms).
template <typename T>
void UpdateRow(const AdamTerms& terms, const AdamCorrections& corrections, int64_t dim, float* grad, T* weights,
               float* state);

// The same, computing the corrections itself.
template <typename T>
void UpdateRow(const AdamTerms& terms, int64_t dim, float* grad, T* weights, float* state) {
  UpdateRow<T>(terms, Corrections(terms), dim, grad, weights, state);
}

}  // namespace mtrains
