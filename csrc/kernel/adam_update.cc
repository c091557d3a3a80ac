#include "kernel/adam_update.h"

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>

namespace mtrains {

template <typename T>
void UpdateRow(const AdamTerms& terms, int64_t dim, float* grad, T* weights, float* state) {
  const float b1 = terms.beta1, b2 = terms.beta2, eps = terms.eps, wd = terms.weight_decay;
  const float t = float(terms.step);
  const float correction1 = 1.0f - std::pow(b1, t);
  const float correction2 = 1.0f - std::pow(b2, t);
  float* m1 = state;
  float* m2 = state + dim;
  if (terms.max_gradient >= 0) {
    const float c = terms.max_gradient;
    for (int64_t d = 0; d < dim; ++d) grad[d] = std::min(std::max(grad[d], -c), c);
  }
  // Partial row-wise: one second moment per row, from the mean of the squared gradient.
  float row_denominator = 0;  // sqrt(v_hat) + eps of a partial row-wise row
  if (!terms.per_weight_momentum2()) {
    float sum_sq = 0;
    for (int64_t d = 0; d < dim; ++d) sum_sq += grad[d] * grad[d];
    const float v = b2 * m2[0] + (1.0f - b2) * (sum_sq / float(dim));
    m2[0] = v;
    row_denominator = std::sqrt(v / correction2) + eps;
  }
  // grad becomes r, the update's direction (the summed gradient is no longer needed).
  float w_sq = 0, r_sq = 0;
  for (int64_t d = 0; d < dim; ++d) {
    const float g = grad[d];
    const float m = b1 * m1[d] + (1.0f - b1) * g;
    m1[d] = m;
    float denominator = row_denominator;
    if (terms.per_weight_momentum2()) {
      const float v = b2 * m2[d] + (1.0f - b2) * g * g;
      m2[d] = v;
      denominator = std::sqrt(v / correction2) + eps;
    }
    const float w = float(weights[d]);
    const float r = m / correction1 / denominator + wd * w;
    grad[d] = r;
    w_sq += w * w;
    r_sq += r * r;
  }
  float step_size = terms.learning_rate;
  if (terms.lamb()) {
    if (r_sq == 0.0f) return;  // FBGEMM would divide by zero (see the header)
    step_size *= std::sqrt(w_sq) / std::sqrt(r_sq);
  }
  for (int64_t d = 0; d < dim; ++d) weights[d] = T(float(weights[d]) - step_size * grad[d]);
}

template void UpdateRow<float>(const AdamTerms&, int64_t, float*, float*, float*);
template void UpdateRow<c10::Half>(const AdamTerms&, int64_t, float*, c10::Half*, float*);

}  // namespace mtrains
