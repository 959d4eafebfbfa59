// test_token_logprobs_vocab_emu: the vocab-parallel log-probabilities' CUDA
// kernels (kernels/cross_entropy_vocab.cuh's stats and combine, then
// kernels/token_logprobs_vocab.cuh's sums and finish) run on the CPU under
// tests/emu/cuda_emu.h against the CPU op's passes
// (fsdp_cross_entropy_vocab_stats, fsdp_token_logprobs_vocab_sums /
// _finish) on the same inputs (bf16 ones given to the CPU op as floats),
// for tp = 1, 2, 3 and 4 slices of a row; the collectives between the
// passes done here as fsdp.tp does them (the all-gather of the stats, then
// combine; the sums added in rank order). The vocabularies and rows of
// test_cross_entropy_vocab_emu: slices starting at every alignment, 6 rows
// (an ignored one, one of large logits, one with -inf logits); the
// gradient in place, out of place at another alignment, and none; with the
// entropy (xsum) and without.
//   * sums and xsums: 1e-5 relative (fp32 exponentials summed in another
//     order);
//   * logp and entropy, each rank's (the same on every rank): 1e-5
//     relative + 1e-6, both dtypes (fp32 arithmetic on the same values);
//     ignored rows exactly 0;
//   * dlogits, max |error| / max |CPU op|: fp32 1e-5, bf16 4e-3 (one
//     rounding, 2^-9); every 16-byte access aligned, as the GPU needs.
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_rows.h"

#include "../../kernels/token_logprobs_vocab.cuh"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_token_logprobs_vocab_emu"};

template <typename T>
static const char *dtype_name() { return sizeof(T) == 4 ? "fp32" : "bf16"; }

static double rel(double a, double b) { return std::fabs(a - b) / std::fmax(std::fabs(b), 1e-30); }
/* the larger error, a NaN the largest (std::fmax would drop it) */
static double worse(double w, double e) { return std::isnan(e) ? INFINITY : std::fmax(w, e); }

/* grad: 0 none, 1 in place, 2 out of place one element further on */
template <typename T>
static void check_case(double tol, int64_t V, int ranks, int offset, int grad, bool ent) {
  const int64_t n = 6, cols = V / ranks;
  const int32_t ignore = -100;
  const int threads = 64;
  uint32_t s = (uint32_t)(V * 29 + ranks * 5 + offset);
  /* whole rows of logits, then each rank's columns of them in a buffer of its own at `offset` */
  std::vector<float> whole((size_t)(n * V));
  for (int64_t r = 0; r < n; r++)
    for (int64_t j = 0; j < V; j++) whole[(size_t)(r * V + j)] = 3 * rnd(s) + (r == 2 ? 90.0f : 0.0f);
  whole[(size_t)(3 * V + 5 % V)] = -INFINITY;
  whole[(size_t)(3 * V + V - 1)] = -INFINITY;
  const std::vector<int32_t> targets = {0, (int32_t)(V - 1), (int32_t)(7 % V), (int32_t)(cols % V), ignore, (int32_t)(V / 2)};
  const std::vector<float> coef = {0.5f, -1.25f, 0.75f, 2.0f, 1.0f, -0.3f};
  std::vector<std::vector<T>> x((size_t)ranks), d((size_t)ranks);
  std::vector<std::vector<float>> xf((size_t)ranks); /* the CPU op's: the stored values as floats */
  for (int k = 0; k < ranks; k++) {
    x[(size_t)k].assign((size_t)(n * cols + 16), from<T>(0));
    d[(size_t)k].assign((size_t)(n * cols + 16), from<T>(NAN));
    xf[(size_t)k].resize((size_t)(n * cols));
    for (int64_t r = 0; r < n; r++)
      for (int64_t j = 0; j < cols; j++) {
        T v = from<T>(whole[(size_t)(r * V + k * cols + j)]);
        x[(size_t)k][(size_t)(offset + r * cols + j)] = v;
        xf[(size_t)k][(size_t)(r * cols + j)] = ld(&v, 0);
      }
  }
  char what[200], line[400];
  const char *gname = grad == 0 ? "no gradient" : grad == 1 ? "gradient in place" : "gradient out of place";
  snprintf(what, sizeof what, "%s, vocab %lld over %d (columns at +%d), %s, %s", dtype_name<T>(), (long long)V, ranks,
           offset, gname, ent ? "entropy" : "no entropy");
  /* pass 1 on every rank, the all-gather, combine; the CPU path's max and sum in rank order */
  std::vector<float> gathered((size_t)(ranks * 2 * n)), st((size_t)(2 * n), NAN), cpu((size_t)(2 * n));
  for (int k = 0; k < ranks; k++) {
    float *g = gathered.data() + k * 2 * n;
    const T *xk = x[(size_t)k].data() + offset;
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float), [&] {
      fsdp_vce::vocab_stats<T>(g, g + n, xk, targets.data(), k * cols, cols, ignore);
    });
    std::vector<float> c((size_t)(2 * n));
    int rc = fsdp_cross_entropy_vocab_stats(c.data(), c.data() + n, xf[(size_t)k].data(), targets.data(), n, V, k * cols,
                                            cols, ignore);
    kit.expect(rc == 0, "the CPU stats run", rc, 0);
    for (int64_t i = 0; i < n; i++) {
      cpu[(size_t)i] = k ? std::fmax(cpu[(size_t)i], c[(size_t)i]) : c[(size_t)i];
      cpu[(size_t)(n + i)] = (k ? cpu[(size_t)(n + i)] : 0.0f) + c[(size_t)(n + i)];
    }
  }
  cuda_emu::launch({1, 1, 1}, 32, 0, [&] { fsdp_vce::vocab_combine<>(st.data(), st.data() + n, gathered.data(), n, ranks); });
  /* pass 2, the all-reduce */
  std::vector<float> sums((size_t)n, 0.0f), xsums((size_t)n, 0.0f), cpu_sums((size_t)n, 0.0f), cpu_xsums((size_t)n, 0.0f);
  std::vector<float> ps((size_t)n), pu((size_t)n);
  for (int k = 0; k < ranks; k++) {
    const T *xk = x[(size_t)k].data() + offset;
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float),
                     [&] { fsdp_tlv::vocab_sums<T>(ps.data(), ent ? pu.data() : nullptr, xk, st.data(), cols); });
    for (int64_t i = 0; i < n; i++) sums[(size_t)i] += ps[(size_t)i], xsums[(size_t)i] += ent ? pu[(size_t)i] : 0.0f;
    int rc = fsdp_token_logprobs_vocab_sums(ps.data(), ent ? pu.data() : nullptr, xf[(size_t)k].data(), cpu.data(), n, cols);
    kit.expect(rc == 0, "the CPU sums run", rc, 0);
    for (int64_t i = 0; i < n; i++) cpu_sums[(size_t)i] += ps[(size_t)i], cpu_xsums[(size_t)i] += ent ? pu[(size_t)i] : 0.0f;
  }
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    worst = worse(worse(worst, rel(sums[(size_t)i], cpu_sums[(size_t)i])), ent ? rel(xsums[(size_t)i], cpu_xsums[(size_t)i]) : 0);
  snprintf(line, sizeof line, "%s: the sums (and xsums) of exponentials", what);
  kit.expect(worst <= 1e-5, line, worst, 1e-5);
  /* pass 3 on every rank */
  double worst_lp = 0, worst_grad = 0, big = 0;
  bool zeros = true;
  for (int k = 0; k < ranks; k++) {
    T *xk = x[(size_t)k].data() + offset;
    T *dk = grad == 0 ? nullptr : grad == 1 ? xk : d[(size_t)k].data() + offset + 1;
    std::vector<float> lp((size_t)n, NAN), en((size_t)n, NAN), cpu_lp((size_t)n), cpu_en((size_t)n);
    std::vector<float> cpu_d((size_t)(n * cols));
    int rc = fsdp_token_logprobs_vocab_finish(cpu_lp.data(), ent ? cpu_en.data() : nullptr, grad ? cpu_d.data() : nullptr,
                                              xf[(size_t)k].data(), targets.data(), coef.data(), cpu.data(),
                                              cpu_sums.data(), ent ? cpu_xsums.data() : nullptr, cpu.data() + n, n, V,
                                              k * cols, cols, ignore);
    kit.expect(rc == 0, "the CPU finish runs", rc, 0);
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float), [&] {
      fsdp_tlv::vocab_finish<T>(lp.data(), ent ? en.data() : nullptr, dk, xk, targets.data(), coef.data(), st.data(),
                                sums.data(), ent ? xsums.data() : nullptr, st.data() + n, V, k * cols, cols, ignore);
    });
    for (int64_t i = 0; i < n; i++) {
      worst_lp = worse(worst_lp, std::fabs(lp[(size_t)i] - cpu_lp[(size_t)i]) / (std::fabs(cpu_lp[(size_t)i]) + 0.1));
      if (ent)
        worst_lp = worse(worst_lp, std::fabs(en[(size_t)i] - cpu_en[(size_t)i]) / (std::fabs(cpu_en[(size_t)i]) + 0.1));
      if (targets[(size_t)i] == ignore) zeros = zeros && lp[(size_t)i] == 0 && (!ent || en[(size_t)i] == 0);
    }
    for (int64_t i = 0; dk && i < n * cols; i++) {
      double g = ld(dk, i);
      big = std::fmax(big, std::fabs((double)cpu_d[(size_t)i]));
      worst_grad = worse(worst_grad, std::isfinite(g) ? std::fabs(g - cpu_d[(size_t)i]) : NAN);
      if (i / cols == 4) zeros = zeros && g == 0;
    }
  }
  /* |err| <= 1e-5 |ref| + 1e-6 as one number: |err| / (|ref| + 0.1) <= 1e-5 */
  snprintf(line, sizeof line, "%s: every rank's logp%s, ignored rows 0", what, ent ? " and entropy" : "");
  kit.expect(worst_lp <= 1e-5 && zeros, line, worst_lp, 1e-5);
  expect_grad_aligned(kit, what, grad, worst_grad, big, tol);
}

template <typename T>
static void all(double tol) {
  const struct {
    int64_t V;
    int ranks;
  } cases[] = {{1000, 1}, {1000, 2}, {1000, 4}, {996, 3}, {1004, 4}, {36, 4}};
  for (const auto &c : cases)
    for (int offset : {0, 1, 3}) check_case<T>(tol, c.V, c.ranks, offset, 1, true);
  check_case<T>(tol, 1004, 4, 0, 2, true);
  check_case<T>(tol, 1000, 2, 2, 2, false);
  check_case<T>(tol, 996, 3, 1, 0, true);
  check_case<T>(tol, 1000, 4, 3, 0, false);
  check_case<T>(tol, 36, 4, 1, 1, false);
}

int main() {
  all<float>(1e-5);
  all<__nv_bfloat16>(4e-3);
  return kit.finish();
}
