#include "kernel/adam_update.h"

#include "storage/lazy_init.h"


#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// The element-wise passes' clones (see below). ThreadSanitizer's runtime is not set up when
// the clones' resolvers run, at load time, and the program crashes there: its builds keep
// the default code only.
#if defined(__SANITIZE_THREAD__)
#define MTRAINS_AVX2_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MTRAINS_AVX2_CLONES
#endif
#endif
#ifndef MTRAINS_AVX2_CLONES
#define MTRAINS_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#endif

namespace mtrains {
namespace {

// Sums of squares (partial row-wise g^2, LAMB's |w|^2 and |r|^2) run in 16 interleaved
// partial sums over the first dim - dim % 16 values (value d in sum d % 16), folded as
// t_l = (s_l + s_l+4) + (s_l+8 + s_l+12) and (t0 + t1) + (t2 + t3), then the rest in order:
// the same on every machine, with or without SSE. Four independent vector sums, not one: a
// single one waited on its own adds (dim / 4 in a row), which made LAMB's two sums a row
// cost as much as its memory traffic.
constexpr int64_t kLanes = 16;

// The sum of squares of x[0..dim) from the lanes of its first dim - dim % kLanes values:
// the lanes folded, then the rest added in order.
float FoldLanes(const float* lanes, const float* x, int64_t dim) {
  float t[4];
  for (int l = 0; l < 4; ++l) t[l] = (lanes[l] + lanes[l + 4]) + (lanes[l + 8] + lanes[l + 12]);
  float total = (t[0] + t[1]) + (t[2] + t[3]);
  for (int64_t d = dim - dim % kLanes; d < dim; ++d) total += x[d] * x[d];
  return total;
}

// The sums of squares of kArrays arrays of dim values, in one pass, each grouped as above.
template <int kArrays>
void SumsOfSquares(const float* const (&x)[kArrays], int64_t dim, float (&total)[kArrays]) {
  const int64_t body = dim - dim % kLanes;
  float lanes[kArrays][kLanes] = {};
#if defined(__SSE2__)
  __m128 acc[kArrays][4];
  for (int a = 0; a < kArrays; ++a)
    for (int j = 0; j < 4; ++j) acc[a][j] = _mm_setzero_ps();
  for (int64_t d = 0; d < body; d += kLanes) {
    for (int a = 0; a < kArrays; ++a)
      for (int j = 0; j < 4; ++j) {
        const __m128 v = _mm_loadu_ps(x[a] + d + 4 * j);
        acc[a][j] = _mm_add_ps(acc[a][j], _mm_mul_ps(v, v));
      }
  }
  for (int a = 0; a < kArrays; ++a)
    for (int j = 0; j < 4; ++j) _mm_storeu_ps(lanes[a] + 4 * j, acc[a][j]);
#else
  for (int a = 0; a < kArrays; ++a)
    for (int64_t d = 0; d < body; ++d) lanes[a][d % kLanes] += x[a][d] * x[a][d];
#endif
  for (int a = 0; a < kArrays; ++a) total[a] = FoldLanes(lanes[a], x[a], dim);
}

float SumOfSquares(const float* x, int64_t dim) {
  float total[1];
  SumsOfSquares<1>({x}, dim, total);
  return total[0];
}

// The constants of a row's element-wise pass.
struct RowTerms {
  float b1, one_minus_b1, b2, one_minus_b2, eps, wd, correction1, correction2;
  float row_denominator;  // sqrt(v_hat) + eps of a partial row-wise row
};

// The element-wise passes, written as the scalar formula and vectorised by the compiler:
// cloned for AVX2 (picked at load time where the CPU has it; the extension is built for
// SSE4.2). Neither clone fuses a multiply and an add (AVX2 without FMA), and vector add,
// mul, div and sqrt round as the scalar ones, so every clone computes the same bits.
// Adam / LAMB, one weight: m and v updated in place; returns r = m / c1 / (sqrt(v / c2) +
// eps) + wd w. Inlined into each pass below (and so into each of its clones).
__attribute__((always_inline)) inline float PerWeightR(const RowTerms& c, float g, float w, float& m1,
                                                       float& m2) {
  const float m = c.b1 * m1 + c.one_minus_b1 * g;
  const float v = c.b2 * m2 + c.one_minus_b2 * g * g;
  m1 = m;
  m2 = v;
  return m / c.correction1 / (__builtin_sqrtf(v / c.correction2) + c.eps) + c.wd * w;
}

// Adam / LAMB: m and v per weight; r into grad.
MTRAINS_AVX2_CLONES void PerWeightDirection(const RowTerms& c, int64_t dim, float* __restrict__ grad,
                                            const float* __restrict__ w, float* __restrict__ m1,
                                            float* __restrict__ m2) {
  const RowTerms k = c;  // a local copy: the loop's constants, not loads through a pointer
  for (int64_t d = 0; d < dim; ++d) grad[d] = PerWeightR(k, grad[d], w[d], m1[d], m2[d]);
}

// Adam: PerWeightDirection and Step in one pass, w -= lr r (the same operations in the same
// order, so the same bits, with one pass less over the row).
MTRAINS_AVX2_CLONES void PerWeightStep(const RowTerms& c, float learning_rate, int64_t dim,
                                       const float* __restrict__ grad, float* __restrict__ w,
                                       float* __restrict__ m1, float* __restrict__ m2) {
  const RowTerms k = c;
  for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - learning_rate * PerWeightR(k, grad[d], w[d], m1[d], m2[d]);
}

// Partial row-wise, one weight: m updated in place; returns r = m / c1 / den + wd w, den the
// row's one denominator. Inlined as PerWeightR is.
__attribute__((always_inline)) inline float RowR(const RowTerms& c, float g, float w, float& m1) {
  const float m = c.b1 * m1 + c.one_minus_b1 * g;
  m1 = m;
  return m / c.correction1 / c.row_denominator + c.wd * w;
}

// Partial row-wise: m per weight, r into grad.
MTRAINS_AVX2_CLONES void RowDirection(const RowTerms& c, int64_t dim, float* __restrict__ grad,
                                      const float* __restrict__ w, float* __restrict__ m1) {
  const RowTerms k = c;
  for (int64_t d = 0; d < dim; ++d) grad[d] = RowR(k, grad[d], w[d], m1[d]);
}

// LAMB: PerWeightDirection, and in the same pass the first dim - dim % kLanes values of r^2
// and w^2 added into their lanes (value d into lane d % kLanes, in order: as SumsOfSquares).
MTRAINS_AVX2_CLONES void PerWeightDirectionLanes(const RowTerms& c, int64_t dim, float* __restrict__ grad,
                                                 const float* __restrict__ w, float* __restrict__ m1,
                                                 float* __restrict__ m2, float* __restrict__ r_lanes,
                                                 float* __restrict__ w_lanes) {
  const RowTerms k = c;
  const int64_t body = dim - dim % kLanes;
  float rl[kLanes] = {}, wl[kLanes] = {};
  for (int64_t d0 = 0; d0 < body; d0 += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const int64_t d = d0 + l;
      const float r = PerWeightR(k, grad[d], w[d], m1[d], m2[d]);
      grad[d] = r;
      rl[l] += r * r;
      wl[l] += w[d] * w[d];
    }
  }
  for (int64_t l = 0; l < kLanes; ++l) {
    r_lanes[l] = rl[l];
    w_lanes[l] = wl[l];
  }
  PerWeightDirection(c, dim - body, grad + body, w + body, m1 + body, m2 + body);
}

// Partial row-wise Adam: RowDirection and Step in one pass (as PerWeightStep).
MTRAINS_AVX2_CLONES void RowStep(const RowTerms& c, float learning_rate, int64_t dim, const float* __restrict__ grad,
                                 float* __restrict__ w, float* __restrict__ m1) {
  const RowTerms k = c;
  for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - learning_rate * RowR(k, grad[d], w[d], m1[d]);
}

// w -= step r.
MTRAINS_AVX2_CLONES void Step(float step, int64_t dim, const float* __restrict__ r, float* __restrict__ w) {
  for (int64_t d = 0; d < dim; ++d) w[d] = w[d] - step * r[d];
}

// The update of one row of fp32 weights `w` (see UpdateRow). kPerWeight: a second moment
// per weight (Adam, LAMB); kLamb: LAMB's trust ratio. Every element-wise operation is the
// scalar formula's, in its order (SSE's add, mul, div and sqrt round as the scalar ones):
// only the sums of squares are grouped as SumOfSquares groups them.
template <bool kPerWeight, bool kLamb>
void UpdateFloatRow(const AdamTerms& terms, const AdamCorrections& corrections, int64_t dim, float* grad, float* w,
                    float* state) {
  RowTerms c{terms.beta1, 1.0f - terms.beta1, terms.beta2, 1.0f - terms.beta2, terms.eps, terms.weight_decay,
             corrections.first, corrections.second, 0.0f};
  float* m1 = state;
  float* m2 = state + dim;
  if (!kPerWeight) {
    // Partial row-wise: one second moment per row, from the mean of the squared gradient.
    const float v = c.b2 * m2[0] + c.one_minus_b2 * (SumOfSquares(grad, dim) / float(dim));
    m2[0] = v;
    c.row_denominator = std::sqrt(v / c.correction2) + c.eps;
  }
  if (!kLamb) {  // the step's size is known: one pass
    if (kPerWeight) {
      PerWeightStep(c, terms.learning_rate, dim, grad, w, m1, m2);
    } else {
      RowStep(c, terms.learning_rate, dim, grad, w, m1);
    }
    return;
  }
  // LAMB: grad becomes r, the update's direction (the summed gradient is no longer needed),
  // whose norm, with the weights', sizes the step.
  float r_and_w_sq[2];
  if (kPerWeight) {
    float lanes[2][kLanes];
    PerWeightDirectionLanes(c, dim, grad, w, m1, m2, lanes[0], lanes[1]);
    r_and_w_sq[0] = FoldLanes(lanes[0], grad, dim);
    r_and_w_sq[1] = FoldLanes(lanes[1], w, dim);
  } else {
    RowDirection(c, dim, grad, w, m1);
    SumsOfSquares<2>({grad, w}, dim, r_and_w_sq);
  }
  if (r_and_w_sq[0] == 0.0f) return;  // FBGEMM would divide by zero (see the header)
  Step(terms.learning_rate * (std::sqrt(r_and_w_sq[1]) / std::sqrt(r_and_w_sq[0])), dim, grad, w);
}

void UpdateFloat(const AdamTerms& terms, const AdamCorrections& corrections, int64_t dim, float* grad, float* w,
                 float* state) {
  switch (terms.kind) {
    case AdamKind::kAdam: return UpdateFloatRow<true, false>(terms, corrections, dim, grad, w, state);
    case AdamKind::kPartialRowwiseAdam: return UpdateFloatRow<false, false>(terms, corrections, dim, grad, w, state);
    case AdamKind::kLamb: return UpdateFloatRow<true, true>(terms, corrections, dim, grad, w, state);
    case AdamKind::kPartialRowwiseLamb: return UpdateFloatRow<false, true>(terms, corrections, dim, grad, w, state);
  }
}

}  // namespace

AdamCorrections Corrections(const AdamTerms& terms) {
  const float t = float(terms.step);
  return AdamCorrections{1.0f - std::pow(terms.beta1, t), 1.0f - std::pow(terms.beta2, t)};
}

template <typename T>
void UpdateRow(const AdamTerms& terms, const AdamCorrections& corrections, int64_t dim, float* grad, T* weights,
               float* state) {
  if (terms.max_gradient >= 0) {
    const float c = terms.max_gradient;
    for (int64_t d = 0; d < dim; ++d) grad[d] = std::min(std::max(grad[d], -c), c);
  }
  if constexpr (std::is_same_v<T, float>) {
    UpdateFloat(terms, corrections, dim, grad, weights, state);
  } else {
    // fp16 weights: updated in fp32 (as the fp32 path computes them), then rounded once.
    thread_local std::vector<float> row;
    row.resize(size_t(dim));
    for (int64_t d = 0; d < dim; ++d) row[size_t(d)] = HalfToFloat(weights[d].bits);
    UpdateFloat(terms, corrections, dim, grad, row.data(), state);
    for (int64_t d = 0; d < dim; ++d) weights[d].bits = FloatToHalf(row[size_t(d)]);  // round to nearest even
  }
}

template void UpdateRow<float>(const AdamTerms&, const AdamCorrections&, int64_t, float*, float*, float*);
template void UpdateRow<Fp16Bits>(const AdamTerms&, const AdamCorrections&, int64_t, float*, Fp16Bits*, float*);

}  // namespace mtrains
