#include "kernel/adam_update.h"

#include "storage/lazy_init.h"


#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mtrains {
namespace {

// Sums of squares (partial row-wise g^2, LAMB's |w|^2 and |r|^2) run in 4 interleaved
// partial sums over the first dim - dim % 4 values (value d in sum d % 4), added as
// (s0 + s1) + (s2 + s3), then the rest in order: the same on every machine, with or without
// SSE, and vectorisable.
constexpr int64_t kLanes = 4;

float LaneTotal(const float* lanes) { return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]); }

float SumOfSquares(const float* x, int64_t dim) {
  const int64_t body = dim - dim % kLanes;
  float lanes[kLanes] = {0, 0, 0, 0};
#if defined(__SSE2__)
  __m128 acc = _mm_setzero_ps();
  for (int64_t d = 0; d < body; d += kLanes) {
    const __m128 v = _mm_loadu_ps(x + d);
    acc = _mm_add_ps(acc, _mm_mul_ps(v, v));
  }
  _mm_storeu_ps(lanes, acc);
#else
  for (int64_t d = 0; d < body; ++d) lanes[d % kLanes] += x[d] * x[d];
#endif
  float total = LaneTotal(lanes);
  for (int64_t d = body; d < dim; ++d) total += x[d] * x[d];
  return total;
}

// The constants of a row's element-wise pass.
struct RowTerms {
  float b1, one_minus_b1, b2, one_minus_b2, eps, wd, correction1, correction2;
  float row_denominator;  // sqrt(v_hat) + eps of a partial row-wise row
};

// One weight: its momenta updated, r (the update's direction) returned.
template <bool kPerWeight>
inline float ElementR(const RowTerms& c, float g, float w, float* m1, float* m2) {
  const float m = c.b1 * *m1 + c.one_minus_b1 * g;
  *m1 = m;
  float denominator = c.row_denominator;
  if (kPerWeight) {
    const float v = c.b2 * *m2 + c.one_minus_b2 * g * g;
    *m2 = v;
    denominator = std::sqrt(v / c.correction2) + c.eps;
  }
  return m / c.correction1 / denominator + c.wd * w;
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
  // grad becomes r, the update's direction (the summed gradient is no longer needed).
  const int64_t body = dim - dim % kLanes;
  int64_t d = 0;
#if defined(__SSE2__)
  {
    const __m128 b1 = _mm_set1_ps(c.b1), omb1 = _mm_set1_ps(c.one_minus_b1), b2 = _mm_set1_ps(c.b2),
                 omb2 = _mm_set1_ps(c.one_minus_b2), eps = _mm_set1_ps(c.eps), wd = _mm_set1_ps(c.wd),
                 c1 = _mm_set1_ps(c.correction1), c2 = _mm_set1_ps(c.correction2),
                 row_den = _mm_set1_ps(c.row_denominator);
    for (; d < body; d += kLanes) {
      const __m128 g = _mm_loadu_ps(grad + d);
      const __m128 m = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(m1 + d)), _mm_mul_ps(omb1, g));
      _mm_storeu_ps(m1 + d, m);
      __m128 denominator = row_den;
      if (kPerWeight) {
        const __m128 v = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(m2 + d)), _mm_mul_ps(_mm_mul_ps(omb2, g), g));
        _mm_storeu_ps(m2 + d, v);
        denominator = _mm_add_ps(_mm_sqrt_ps(_mm_div_ps(v, c2)), eps);
      }
      const __m128 r = _mm_add_ps(_mm_div_ps(_mm_div_ps(m, c1), denominator), _mm_mul_ps(wd, _mm_loadu_ps(w + d)));
      _mm_storeu_ps(grad + d, r);
    }
  }
#endif
  for (; d < dim; ++d) grad[d] = ElementR<kPerWeight>(c, grad[d], w[d], m1 + d, m2 + d);
  float step_size = terms.learning_rate;
  if (kLamb) {
    const float r_sq = SumOfSquares(grad, dim);
    if (r_sq == 0.0f) return;  // FBGEMM would divide by zero (see the header)
    step_size *= std::sqrt(SumOfSquares(w, dim)) / std::sqrt(r_sq);
  }
  d = 0;
#if defined(__SSE2__)
  {
    const __m128 step = _mm_set1_ps(step_size);
    for (; d < body; d += kLanes)
      _mm_storeu_ps(w + d, _mm_sub_ps(_mm_loadu_ps(w + d), _mm_mul_ps(step, _mm_loadu_ps(grad + d))));
  }
#endif
  for (; d < dim; ++d) w[d] = w[d] - step_size * grad[d];
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
