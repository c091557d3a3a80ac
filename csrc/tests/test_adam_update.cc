// Standalone driver for the Adam-family row update (kernel/adam_update.h), run plain and
// under ASan/UBSan and TSan by scripts/sanitize.sh: each kind against a scalar reference
// written from FBGEMM's definitions (in double), dims that are and are not multiples of the
// vector width, clipping, weight decay, fp16 weights, and the fp16 conversions.
//
// Usage: test_adam_update [scratch_dir]   (the directory is unused)
// Exits 0 when every case passes; a failed CHECK aborts with file, line and message.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <vector>

#include "kernel/adam_update.h"
#include "storage/lazy_init.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

// FBGEMM's update of one row, in double (the reference the fp32 update must stay near).
void Reference(const AdamTerms& t, int dim, std::vector<double> g, std::vector<double>& w, std::vector<double>& m1,
               std::vector<double>& m2) {
  if (t.max_gradient >= 0)
    for (double& x : g) x = std::fmin(std::fmax(x, -t.max_gradient), t.max_gradient);
  const double b1 = t.beta1, b2 = t.beta2;
  const double c1 = 1 - std::pow(b1, double(t.step)), c2 = 1 - std::pow(b2, double(t.step));
  const bool per_weight = t.per_weight_momentum2();
  double row_v = 0;
  if (!per_weight) {
    double sq = 0;
    for (double x : g) sq += x * x;
    row_v = m2[0] = b2 * m2[0] + (1 - b2) * sq / dim;
  }
  std::vector<double> r(static_cast<size_t>(dim));
  double w_sq = 0, r_sq = 0;
  for (int d = 0; d < dim; ++d) {
    m1[d] = b1 * m1[d] + (1 - b1) * g[d];
    double v = row_v;
    if (per_weight) v = m2[d] = b2 * m2[d] + (1 - b2) * g[d] * g[d];
    r[d] = m1[d] / c1 / (std::sqrt(v / c2) + t.eps) + t.weight_decay * w[d];
    w_sq += w[d] * w[d];
    r_sq += r[d] * r[d];
  }
  double step = t.learning_rate;
  if (t.lamb()) {
    if (r_sq == 0) return;
    step *= std::sqrt(w_sq) / std::sqrt(r_sq);
  }
  for (int d = 0; d < dim; ++d) w[d] -= step * r[d];
}

double Wave(int i, double scale) { return scale * std::sin(0.7 * i + 0.3) + 0.1 * scale * std::cos(1.3 * i); }

// Ten steps of one row of every kind and dim against the reference.
void TestMatchesReference() {
  for (int kind = 0; kind < 4; ++kind) {
    for (int dim : {4, 8, 12, 36, 128}) {
      for (float decay : {0.0f, 0.01f}) {
        for (float clip : {-1.0f, 0.05f}) {
          AdamTerms t;
          t.kind = AdamKind(kind);
          t.weight_decay = decay;
          t.max_gradient = clip;
          const int values = int(t.StateValues(dim));
          std::vector<float> w(static_cast<size_t>(dim)), state(static_cast<size_t>(values), 0.0f);
          std::vector<double> rw(static_cast<size_t>(dim)), m1(static_cast<size_t>(dim), 0.0), m2(static_cast<size_t>(values - dim), 0.0);
          for (int d = 0; d < dim; ++d) rw[size_t(d)] = w[size_t(d)] = float(Wave(d, 0.2));
          for (int s = 1; s <= 10; ++s) {
            t.step = s;
            std::vector<float> g(static_cast<size_t>(dim));
            std::vector<double> rg(static_cast<size_t>(dim));
            for (int d = 0; d < dim; ++d) rg[size_t(d)] = g[size_t(d)] = float(Wave(d * s + 5, 0.1));
            UpdateRow<float>(t, dim, g.data(), w.data(), state.data());
            Reference(t, dim, rg, rw, m1, m2);
          }
          // Within 1e-6 of each vector's scale (fp32 against the double reference).
          double w_scale = 1, m1_scale = 0, m2_scale = 0;
          for (int d = 0; d < dim; ++d) m1_scale = std::fmax(m1_scale, std::fabs(m1[size_t(d)]));
          for (double v : m2) m2_scale = std::fmax(m2_scale, v);
          for (int d = 0; d < dim; ++d) {
            CHECK(std::fabs(w[size_t(d)] - rw[size_t(d)]) <= 1e-6 * w_scale)
                << "kind " << kind << " dim " << dim << " weight " << d << ": " << w[size_t(d)] << " vs "
                << rw[size_t(d)];
            CHECK(std::fabs(state[size_t(d)] - m1[size_t(d)]) <= 1e-6 * m1_scale)
                << "kind " << kind << " dim " << dim << " momentum1 " << d;
          }
          for (int k = 0; k < values - dim; ++k)
            CHECK(std::fabs(state[size_t(dim + k)] - m2[size_t(k)]) <= 1e-5 * m2_scale)
                << "kind " << kind << " dim " << dim << " momentum2 " << k;
        }
      }
    }
  }
}

// fp16 weights: the update in fp32 from the fp16 values, rounded to nearest once.
void TestFp16Weights() {
  AdamTerms t;
  const int dim = 20;
  std::vector<Fp16Bits> w(static_cast<size_t>(dim));
  std::vector<float> wf(static_cast<size_t>(dim)), s16(static_cast<size_t>(2 * dim), 0.0f), s32(static_cast<size_t>(2 * dim), 0.0f);
  for (int d = 0; d < dim; ++d) {
    w[size_t(d)].bits = FloatToHalf(float(Wave(d, 0.3)));
    wf[size_t(d)] = HalfToFloat(w[size_t(d)].bits);
  }
  std::vector<float> g(static_cast<size_t>(dim)), g2(static_cast<size_t>(dim));
  for (int d = 0; d < dim; ++d) g[size_t(d)] = g2[size_t(d)] = float(Wave(d + 3, 0.05));
  UpdateRow<Fp16Bits>(t, dim, g.data(), w.data(), s16.data());
  UpdateRow<float>(t, dim, g2.data(), wf.data(), s32.data());
  for (int d = 0; d < dim; ++d) {
    CHECK(w[size_t(d)].bits == FloatToHalf(wf[size_t(d)])) << "weight " << d;
    CHECK(s16[size_t(d)] == s32[size_t(d)]) << "momentum1 " << d;
  }
}

// Every non-NaN half converts to float and back to itself.
void TestHalfRoundTrip() {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0;
    if (nan) {
      CHECK(std::isnan(HalfToFloat(uint16_t(h)))) << h;
      continue;
    }
    CHECK(FloatToHalf(HalfToFloat(uint16_t(h))) == h) << "half bits " << h;
  }
  CHECK(HalfToFloat(0x3C00) == 1.0f && HalfToFloat(0xC000) == -2.0f && HalfToFloat(0x0001) == std::ldexp(1.0f, -24));
}

// A LAMB row whose update direction is all zero keeps its weights (no NaN).
void TestLambZeroDirection() {
  AdamTerms t;
  t.kind = AdamKind::kLamb;
  std::vector<float> w = {0.5f, -0.25f, 0.125f, 1.0f}, g(4, 0.0f), s(8, 0.0f);
  const std::vector<float> before = w;
  UpdateRow<float>(t, 4, g.data(), w.data(), s.data());
  for (int d = 0; d < 4; ++d) CHECK(w[size_t(d)] == before[size_t(d)]) << d;
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("adam update: every kind against FBGEMM's definitions", TestMatchesReference);
  Run("adam update: fp16 weights round once", TestFp16Weights);
  Run("adam update: half conversions round-trip", TestHalfRoundTrip);
  Run("adam update: a zero LAMB direction keeps the row", TestLambZeroDirection);
  std::fprintf(stderr, "test_adam_update: all passed\n");
  return 0;
}
