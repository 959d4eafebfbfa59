// test_cross_entropy_vocab_emu: the vocab-parallel cross-entropy's CUDA
// kernels (kernels/cross_entropy_vocab.cuh: stats, combine, sum, finish)
// run on the CPU under tests/emu/cuda_emu.h against the CPU op's passes
// (fsdp_cross_entropy_vocab_stats / _sum / _finish, src/ops/
// cross_entropy_vocab.c) on the same inputs (bf16 ones given to the CPU op
// as floats), for tp = 1, 2, 3 and 4 slices of a row; the collectives
// between the passes done here as fsdp.tp does them (the all-gather of
// each rank's stats into {ranks, 2n}, then combine; the sums added in
// rank order). Vocabularies whose slices start at every alignment (1000
// over 1, 2, 4: 16-byte aligned fp32 rows; 996 over 3: 332; 1004 over 4:
// 251; 36 over 4: 9), 6 rows: an ignored one, one of large logits (exp
// would overflow without the max), one with -inf logits; the gradient in
// place, out of place at another alignment, and none (the loss only).
//   * combine: the group's max and target logit equal the CPU path's (the
//     max over the ranks' CPU maxima and their target logits' sum, as
//     fsdp.tp's Lua loop does it) bit for bit;
//   * sums: 1e-5 relative (fp32 exponentials summed in another order);
//   * the loss, each rank's (the same on every rank): 1e-5 relative, the
//     count exactly;
//   * dlogits, max |error| / max |CPU op|: fp32 1e-5, bf16 4e-3 (one
//     rounding, 2^-9); every 16-byte access aligned, as the GPU needs.
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_rows.h"

#include "../../kernels/cross_entropy_vocab.cuh"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_cross_entropy_vocab_emu"};

template <typename T>
static const char *dtype_name() { return sizeof(T) == 4 ? "fp32" : "bf16"; }

static double rel(double a, double b) { return std::fabs(a - b) / std::fmax(std::fabs(b), 1e-30); }

/* grad: 0 none, 1 in place, 2 out of place one element further on */
template <typename T>
static void check_case(double tol, int64_t V, int ranks, int offset, int grad) {
  const int64_t n = 6, cols = V / ranks;
  const int32_t ignore = -100;
  const float scale = 0.25f;
  const int threads = 64;
  uint32_t s = (uint32_t)(V * 31 + ranks * 7 + offset);
  /* whole rows of logits, then each rank's columns of them in a buffer of its own at `offset` */
  std::vector<float> whole((size_t)(n * V));
  for (int64_t r = 0; r < n; r++)
    for (int64_t j = 0; j < V; j++) whole[(size_t)(r * V + j)] = 3 * rnd(s) + (r == 2 ? 90.0f : 0.0f);
  whole[(size_t)(3 * V + 5 % V)] = -INFINITY;
  whole[(size_t)(3 * V + V - 1)] = -INFINITY;
  const std::vector<int32_t> targets = {0, (int32_t)(V - 1), (int32_t)(7 % V), (int32_t)(cols % V), ignore, (int32_t)(V / 2)};
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
  char what[200];
  const char *gname = grad == 0 ? "loss only" : grad == 1 ? "gradient in place" : "gradient out of place";
  snprintf(what, sizeof what, "%s, vocab %lld over %d (columns at +%d), %s", dtype_name<T>(), (long long)V, ranks, offset,
           gname);
  /* pass 1 on every rank, the all-gather, combine */
  std::vector<float> gathered((size_t)(ranks * 2 * n)), cpu_st((size_t)(ranks * 2 * n));
  for (int k = 0; k < ranks; k++) {
    float *g = gathered.data() + k * 2 * n;
    const T *xk = x[(size_t)k].data() + offset;
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float), [&] {
      fsdp_vce::vocab_stats<T>(g, g + n, xk, targets.data(), k * cols, cols, ignore);
    });
    float *c = cpu_st.data() + k * 2 * n;
    int rc = fsdp_cross_entropy_vocab_stats(c, c + n, xf[(size_t)k].data(), targets.data(), n, V, k * cols, cols, ignore);
    kit.expect(rc == 0, "the CPU stats run", rc, 0);
  }
  std::vector<float> st((size_t)(2 * n), NAN), cpu((size_t)(2 * n));
  cuda_emu::launch({1, 1, 1}, 32, 0, [&] { fsdp_vce::vocab_combine<>(st.data(), st.data() + n, gathered.data(), n, ranks); });
  for (int64_t i = 0; i < n; i++) { /* fsdp.tp's Lua loop, in doubles */
    double m = cpu_st[(size_t)i], t = cpu_st[(size_t)(n + i)];
    for (int k = 1; k < ranks; k++) {
      m = std::fmax(m, (double)cpu_st[(size_t)(k * 2 * n + i)]);
      t = t + cpu_st[(size_t)(k * 2 * n + n + i)];
    }
    cpu[(size_t)i] = (float)m, cpu[(size_t)(n + i)] = (float)t;
  }
  bool same = std::memcmp(st.data(), cpu.data(), st.size() * sizeof(float)) == 0;
  char line[400];
  snprintf(line, sizeof line, "%s: the group's max and target logit equal the CPU path's bit for bit", what);
  kit.expect(same, line, same ? 0 : 1, 0);
  /* pass 2, the all-reduce */
  std::vector<float> sums((size_t)n, 0.0f), cpu_sums((size_t)n, 0.0f), part((size_t)n);
  for (int k = 0; k < ranks; k++) {
    const T *xk = x[(size_t)k].data() + offset;
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float),
                     [&] { fsdp_vce::vocab_sum<T>(part.data(), xk, st.data(), cols); });
    for (int64_t i = 0; i < n; i++) sums[(size_t)i] += part[(size_t)i];
    int rc = fsdp_cross_entropy_vocab_sum(part.data(), xf[(size_t)k].data(), cpu.data(), n, cols);
    kit.expect(rc == 0, "the CPU sum runs", rc, 0);
    for (int64_t i = 0; i < n; i++) cpu_sums[(size_t)i] += part[(size_t)i];
  }
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = std::fmax(worst, rel(sums[(size_t)i], cpu_sums[(size_t)i]));
  snprintf(line, sizeof line, "%s: the sums of exponentials", what);
  kit.expect(worst <= 1e-5, line, worst, 1e-5);
  /* pass 3 on every rank */
  double worst_loss = 0, worst_grad = 0, big = 0;
  bool counted = true;
  for (int k = 0; k < ranks; k++) {
    T *xk = x[(size_t)k].data() + offset;
    T *dk = grad == 0 ? nullptr : grad == 1 ? xk : d[(size_t)k].data() + offset + 1;
    double loss = 0;
    unsigned long long count = 0;
    cuda_emu::launch({(unsigned)n, 1, 1}, threads, 32 * sizeof(float), [&] {
      fsdp_vce::vocab_finish<T>(&loss, &count, dk, xk, targets.data(), st.data(), sums.data(), st.data() + n, k * cols,
                                cols, ignore, scale);
    });
    double cpu_loss = 0;
    int64_t cpu_count = 0;
    std::vector<float> cpu_d((size_t)(n * cols));
    int rc = fsdp_cross_entropy_vocab_finish(&cpu_loss, &cpu_count, grad ? cpu_d.data() : nullptr, xf[(size_t)k].data(),
                                             targets.data(), cpu.data(), cpu_sums.data(), cpu.data() + n, n, V, k * cols,
                                             cols, ignore, scale);
    kit.expect(rc == 0, "the CPU finish runs", rc, 0);
    worst_loss = std::fmax(worst_loss, rel(loss, cpu_loss));
    counted = counted && (int64_t)count == cpu_count && cpu_count == n - 1;
    for (int64_t i = 0; dk && i < n * cols; i++) {
      double g = ld(dk, i);
      big = std::fmax(big, std::fabs((double)cpu_d[(size_t)i]));
      worst_grad = std::isfinite(g) ? std::fmax(worst_grad, std::fabs(g - cpu_d[(size_t)i])) : 1e30;
    }
  }
  snprintf(line, sizeof line, "%s: every rank's loss and count", what);
  kit.expect(worst_loss <= 1e-5 && counted, line, worst_loss, 1e-5);
  expect_grad_aligned(kit, what, grad, worst_grad, big, tol);
}

template <typename T>
static void all(double tol) {
  const struct {
    int64_t V;
    int ranks;
  } cases[] = {{1000, 1}, {1000, 2}, {1000, 4}, {996, 3}, {1004, 4}, {36, 4}};
  for (const auto &c : cases)
    for (int offset : {0, 1, 3}) check_case<T>(tol, c.V, c.ranks, offset, 1);
  check_case<T>(tol, 1004, 4, 0, 2);
  check_case<T>(tol, 1000, 2, 2, 2);
  check_case<T>(tol, 996, 3, 1, 0);
}

int main() {
  all<float>(1e-5);
  all<__nv_bfloat16>(4e-3);
  return kit.finish();
}
