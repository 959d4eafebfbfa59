// test_attention_merge_emu: ring attention's combine in CUDA
// (kernels/attention_merge.cuh, a warp per row) run on the CPU under
// tests/emu/cuda_emu.h against the CPU op (fsdp_attention_merge,
// src/ops/attention_merge.c) on the same inputs (bf16 ones given to the
// CPU op as floats). head_dim 1, 16, 40 and 128 (fewer lanes than 32, and
// more), grids with fewer warps than rows (the grid-stride loop), fp32 and
// bf16 storage; lse in [-4, 4], some rows 40 apart, and rows where one
// side or both saw no key (lse -inf, that side's out row NaN).
//   * out, max |error| / max |CPU op|: fp32 1e-6 (the same formula,
//     src/base/attention_merge_math.h); bf16 4e-3 (one rounding, 2^-9,
//     of the fp32 result); lse (fp32 in both) 1e-6 absolute.
//   * Rows where the partial saw no key keep the accumulator bit for bit;
//     rows where only the partial saw keys take it bit for bit; neither:
//     unchanged, no NaN anywhere.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"

#include "../../kernels/attention_merge.cuh"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_attention_merge_emu"};

template <typename T>
static void check_case(int64_t B, int64_t Tn, int64_t H, int64_t D, unsigned blocks, double tol) {
  const int64_t rows = B * Tn * H, no = rows * D, nl = rows;
  uint32_t s = (uint32_t)(D * 131 + Tn * 7 + H);
  std::vector<T> out((size_t)no), ob((size_t)no);
  std::vector<float> lse((size_t)nl), lb((size_t)nl);
  for (int64_t i = 0; i < no; i++) out[(size_t)i] = from<T>(rnd(s)), ob[(size_t)i] = from<T>(rnd(s));
  for (int64_t i = 0; i < nl; i++) lse[(size_t)i] = 4 * rnd(s), lb[(size_t)i] = 4 * rnd(s);
  /* lse's entry li = (b H + h) T + t is out's row (b T + t) H + h */
  auto row = [&](int64_t li) {
    const int64_t t = li % Tn, bh = li / Tn;
    return ((bh / H) * Tn + t) * H + bh % H;
  };
  auto poison = [&](std::vector<T> &x, int64_t li) {
    for (int64_t d = 0; d < D; d++) x[(size_t)(row(li) * D + d)] = from<T>(NAN);
  };
  for (int64_t li = 0; li < nl; li++) {
    if (li % 9 == 4) lb[(size_t)li] = lse[(size_t)li] + 40;
    if (li % 7 == 1) lb[(size_t)li] = -INFINITY, poison(ob, li);  /* the partial saw nothing */
    if (li % 7 == 2) lse[(size_t)li] = -INFINITY, poison(out, li); /* the accumulator saw nothing */
    if (li % 7 == 3) lse[(size_t)li] = lb[(size_t)li] = -INFINITY, poison(ob, li);
  }
  /* the CPU op on the stored values */
  std::vector<float> cpu_o = widen(out), cpu_l = lse;
  const std::vector<float> ob_f = widen(ob);
  int rc = fsdp_attention_merge(cpu_o.data(), cpu_l.data(), ob_f.data(), lb.data(), B, Tn, H, D);
  kit.expect(rc == 0, "the CPU op runs", rc, 0);
  const std::vector<T> out0 = out;
  const std::vector<float> lse0 = lse;
  cuda_emu::launch({blocks, 1, 1}, 64, 0, [&] {
    fsdp_merge::merge_rows<T>(out.data(), lse.data(), ob.data(), lb.data(), rows, Tn, H, D);
  });
  char what[200], line[260];
  snprintf(what, sizeof what, "%s, B %lld T %lld H %lld head_dim %lld, %u blocks", sizeof(T) == 4 ? "fp32" : "bf16",
           (long long)B, (long long)Tn, (long long)H, (long long)D, blocks);
  double err = 0, big = 1e-30, lerr = 0;
  bool kept = true, taken = true, finite = true;
  for (int64_t li = 0; li < nl; li++) {
    const int64_t r = row(li);
    const bool seen_a = lse0[(size_t)li] != -INFINITY, seen_b = lb[(size_t)li] != -INFINITY;
    const T *o = out.data() + r * D;
    if (!seen_b)
      kept = kept && !memcmp(o, out0.data() + r * D, sizeof(T) * (size_t)D) &&
             !memcmp(&lse[(size_t)li], &lse0[(size_t)li], sizeof(float));
    else if (!seen_a)
      taken = taken && !memcmp(o, ob.data() + r * D, sizeof(T) * (size_t)D) &&
              !memcmp(&lse[(size_t)li], &lb[(size_t)li], sizeof(float));
    if (!seen_a && !seen_b) continue; /* the accumulator's row as it was: random values */
    for (int64_t d = 0; d < D; d++) {
      const double g = ld(o, d), w = cpu_o[(size_t)(r * D + d)];
      finite = finite && std::isfinite(g);
      err = std::fmax(err, std::fabs(g - w)), big = std::fmax(big, std::fabs(w));
    }
    lerr = std::fmax(lerr, std::fabs((double)lse[(size_t)li] - cpu_l[(size_t)li]));
  }
  snprintf(line, sizeof line, "%s: out", what);
  kit.expect(finite && err / big <= tol, line, err / big, tol);
  snprintf(line, sizeof line, "%s: lse (absolute)", what);
  kit.expect(lerr <= 1e-6, line, lerr, 1e-6);
  snprintf(line, sizeof line, "%s: the partial saw no key: the accumulator bit for bit", what);
  kit.expect(kept, line, kept ? 0 : 1, 0);
  snprintf(line, sizeof line, "%s: only the partial saw keys: taken bit for bit", what);
  kit.expect(taken, line, taken ? 0 : 1, 0);
}

template <typename T>
static void all(double tol) {
  check_case<T>(2, 9, 3, 16, 64, tol);  /* a block of 2 warps per 2 rows: every row its own warp */
  check_case<T>(2, 9, 3, 40, 3, tol);   /* 6 warps for 54 rows: the grid-stride loop */
  check_case<T>(1, 5, 2, 1, 1, tol);    /* head_dim 1: one lane of 32 works */
  check_case<T>(1, 3, 4, 128, 2, tol);  /* 4 elements a lane */
}

int main() {
  all<float>(1e-6);
  all<__nv_bfloat16>(4e-3);
  return kit.finish();
}
