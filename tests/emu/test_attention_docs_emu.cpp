// test_attention_docs_emu: packed-row (document-causal) attention and rope
// at given positions in the fp32 CUDA-core kernels (kernels/attention.cuh:
// forward, dq per query row, dk/dv per key row; kernels/rope.cuh) run on the
// CPU under tests/emu/cuda_emu.h. B = 2, T = 70 (query blocks of 32 and key
// tiles of 16 end part way), GQA heads 4/2, head_dim 16 and 64, rows of 1,
// 3 and 7 documents (lengths 1 to 36, across block and tile edges), fp32
// and bf16 storage:
//   * against float64 from the stored inputs: naive softmax over the keys
//     doc_start[i] .. i, and its gradient by the chain rule for dout.
//     Tolerances, max |error| / max |want| (measured: fp32 6e-7, bf16 out
//     2.0e-3, grads 3.3e-3): fp32 out, dq, dk, dv 5e-6 (fp32 sums over up
//     to 70 keys and 64 dims); bf16 out 8e-3 (one rounding, 2^-8 relative,
//     of an fp32 value), dq, dk, dv 8e-3 (also the kernel's Di = dout . out
//     from its rounded out); lse 5e-6 absolute (fp32 either way). Outputs
//     start NaN: every element must be written.
//   * doc_start all 0 (one document a row) gives the causal kernels' bits,
//     out, lse, dq, dk, dv.
//   * rope at positions t - doc_start[t] against float64 (fp32 1e-6, bf16
//     8e-3 of the largest value); backward_at undoes forward_at (fp32 1e-6);
//     positions pos[t] = t give the plain kernel's bits.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"
#include "attention_emu.h"
#include "../../kernels/rope.cuh"

static EmuKit kit{"test_attention_docs_emu"};

/* doc_start of a row of documents of the given lengths (summing to T) */
static void doc_starts(int32_t *ds, const std::vector<int> &lens) {
  int t = 0;
  for (int n : lens) {
    for (int i = 0; i < n; i++) ds[t + i] = t;
    t += n;
  }
}


/* float64: query i of row b sees keys ds[b, i] .. i */
template <typename T>
static Want reference(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                      const std::vector<T> &dout, const std::vector<int32_t> &ds, const Shape &sh) {
  return reference_keys(q, k, v, dout, sh, [&](int64_t b, int64_t i, int64_t &j0, int64_t &j1) {
    j0 = ds[(size_t)(b * sh.T + i)];
    j1 = i;
  });
}

template <typename T>
static void check_attention(const char *name, const std::vector<int> &row0, const std::vector<int> &row1, int64_t D,
                            bool bf16) {
  const int64_t B = 2, Tn = 70, H = 4, Hkv = 2;
  const Shape sh{B, Tn, H, Hkv, D, 1.0f / std::sqrt((float)D), Tn};
  std::vector<int32_t> ds((size_t)(B * Tn));
  doc_starts(ds.data(), row0);
  doc_starts(ds.data() + Tn, row1);
  std::vector<T> q((size_t)(B * Tn * H * D)), dout(q.size()), k((size_t)(B * Tn * Hkv * D)), v(k.size());
  random_inputs(q, dout, k, v, (uint32_t)(D * 131 + row0.size() * 7 + row1.size()));
  const Attn<T> got = run_any<T, fsdp_attn::DOCS_ROWS>(q, k, v, dout, ds.data(), sh);
  char what[160];
  snprintf(what, sizeof what, "%s, head_dim %lld, %s", bf16 ? "bf16" : "fp32", (long long)D, name);
  expect_attention(kit, what, got, reference(q, k, v, dout, ds, sh), bf16 ? 8e-3 : 5e-6, 5e-6);
  bool causal = true;
  for (int32_t x : ds) causal = causal && x == 0;
  if (causal) { /* one document a row: the causal instances' bits */
    const bool same = same_bits(got, run_any<T, fsdp_attn::CAUSAL>(q, k, v, dout, nullptr, sh));
    strncat(what, ": out, lse, dq, dk, dv bit for bit the causal kernels'", sizeof what - strlen(what) - 1);
    kit.expect(same, what, same ? 0 : 1, 0);
  }
}

/* HF's cat(freqs, freqs) table, fp32, as fsdp_rope_table makes it (theta 10000, no scaling) */
static void rope_table(std::vector<float> &c, std::vector<float> &sn, int64_t T, int64_t D) {
  c.resize((size_t)(T * D)), sn.resize((size_t)(T * D));
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < D; j++) {
      const double f = (double)t / std::pow(10000.0, (double)(2 * (j % (D / 2))) / (double)D);
      c[t * D + j] = (float)std::cos(f), sn[t * D + j] = (float)std::sin(f);
    }
}

template <typename T, bool AT>
static void run_rope(std::vector<T> &x, const std::vector<float> &c, const std::vector<float> &sn, const int32_t *pos,
                     int64_t B, int64_t T_, int64_t H, int64_t D, float sign) {
  const int64_t rows = B * T_ * H;
  /* fewer threads than elements: the grid-stride loop runs twice or more */
  cuda_emu::launch({3, 1, 1}, 64, 0, [&] {
    fsdp_rope::rope_kernel<T, AT>(x.data(), c.data(), sn.data(), pos, rows, T_, H, D, sign);
  });
}

template <typename T>
static void check_rope(int64_t D, bool bf16) {
  const int64_t B = 2, Tn = 70, H = 4;
  std::vector<int32_t> ds((size_t)(B * Tn)), pos(ds.size()), ident(ds.size());
  doc_starts(ds.data(), {5, 1, 20, 9, 16, 12, 7});
  doc_starts(ds.data() + Tn, {33, 1, 36});
  for (int64_t i = 0; i < B * Tn; i++) pos[i] = (int32_t)(i % Tn - ds[i]), ident[i] = (int32_t)(i % Tn);
  std::vector<float> c, sn;
  rope_table(c, sn, Tn, D);
  std::vector<T> x((size_t)(B * Tn * H * D));
  uint32_t s = (uint32_t)(D * 17 + 3);
  for (auto &e : x) e = from<T>(rnd(s));
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < B * Tn * H; r++) {
    const int64_t p = pos[r / H], half = D / 2;
    for (int64_t j = 0; j < half; j++) {
      const double x1 = ld(x.data(), r * D + j), x2 = ld(x.data(), r * D + j + half);
      const double cc = c[p * D + j], ss = sn[p * D + j];
      want[r * D + j] = x1 * cc - x2 * ss;
      want[r * D + j + half] = x2 * cc + x1 * ss;
    }
  }
  std::vector<T> y = x;
  run_rope<T, true>(y, c, sn, pos.data(), B, Tn, H, D, 1.0f);
  char what[128];
  snprintf(what, sizeof what, "%s, head_dim %lld: rope forward_at", bf16 ? "bf16" : "fp32", (long long)D);
  expect_close(kit, what, y.data(), want, bf16 ? 8e-3 : 1e-6);
  if (!bf16) { /* backward_at is the transposed rotation: it undoes forward_at */
    run_rope<T, true>(y, c, sn, pos.data(), B, Tn, H, D, -1.0f);
    std::vector<double> x0(x.size());
    for (size_t i = 0; i < x.size(); i++) x0[i] = ld(x.data(), (int64_t)i);
    snprintf(what, sizeof what, "fp32, head_dim %lld: rope backward_at undoes forward_at", (long long)D);
    expect_close(kit, what, y.data(), x0, 1e-6);
  }
  std::vector<T> a = x, b = x;
  run_rope<T, true>(a, c, sn, ident.data(), B, Tn, H, D, 1.0f);
  run_rope<T, false>(b, c, sn, nullptr, B, Tn, H, D, 1.0f);
  snprintf(what, sizeof what, "%s, head_dim %lld: rope at positions t, the plain kernel's bits", bf16 ? "bf16" : "fp32",
           (long long)D);
  kit.expect(same_bits(a, b), what, same_bits(a, b) ? 0 : 1, 0);
}

template <typename T>
static void check_all(bool bf16) {
  const std::vector<int> one{70}, three{33, 1, 36}, seven{5, 1, 20, 9, 16, 12, 7};
  for (int64_t D : {16, 64}) {
    check_attention<T>("rows of 7 and 3 documents", seven, three, D, bf16);
    check_attention<T>("rows of 1 and 7 documents", one, seven, D, bf16);
    check_attention<T>("one document a row (doc_start all 0)", one, one, D, bf16);
    check_rope<T>(D, bf16);
  }
}

int main() {
  check_all<float>(false);
  check_all<__nv_bfloat16>(true);
  return kit.finish();
}
