// test_attention_tc_emu: the tensor-core attention kernels
// (kernels/attention_tc.cuh) run on the CPU under tests/emu/cuda_emu.h,
// against causal grouped-query attention in float64 from the same bf16
// inputs: forward output and log-sum-exp, then dq, dk, dv from the kernels'
// own forward. Tolerance: 1e-2 of the largest reference value (bf16
// storage, bf16 P and dS in the products; NaN never passes); the lse within
// 1e-4 absolute. Shapes: several 64-row tiles with a partial last one,
// head_dim 64 and 128, grouped and plain heads, batch 2. This checks the
// kernels' tiling, masking and indexing in every CI run; the GPU run
// (tests/c/test_kernels.c) checks the rest.
#include <cstdio>

#include "cuda_emu.h"

using namespace nvcuda;

#include "../../kernels/attention_tc.cuh"

using namespace fsdp_tc;

static float rnd(uint32_t &s) {
  s = s * 1664525u + 1013904223u;
  return (float)(int32_t)s / 2147483648.0f;
}

static float f32(__nv_bfloat16 v) { return __bfloat162float(v); }

/* max |got - ref| / max |ref|; huge when something is not finite */
static double rel_error(const std::vector<__nv_bfloat16> &got, const std::vector<double> &ref) {
  double scale = 0, worst = 0;
  for (double r : ref) scale = std::fmax(scale, std::fabs(r));
  for (size_t i = 0; i < ref.size(); i++) {
    double g = f32(got[i]);
    if (!std::isfinite(g)) return 1e30;
    worst = std::fmax(worst, std::fabs(g - ref[i]));
  }
  return worst / scale;
}

static int passed, failed;
static void expect(bool ok, const char *what, double value) {
  if (ok) {
    passed++;
  } else {
    failed++;
    fprintf(stderr, "test_attention_tc_emu: FAILED: %s (%.3g)\n", what, value);
  }
}

template <int D>
static void check(int64_t B, int64_t T, int64_t H, int64_t Hkv) {
  size_t nq = (size_t)(B * T * H * D), nk = (size_t)(B * T * Hkv * D), nl = (size_t)(B * H * T);
  uint32_t s = 42 + (uint32_t)(T * 7 + D);
  const __nv_bfloat16 poison = __float2bfloat16_rn(NAN);
  std::vector<__nv_bfloat16> q(nq), k(nk), v(nk), dout(nq), out(nq, poison), dq(nq, poison), dk(nk, poison),
      dv(nk, poison);
  for (auto &x : q) x = __float2bfloat16_rn(rnd(s));
  for (auto &x : k) x = __float2bfloat16_rn(rnd(s));
  for (auto &x : v) x = __float2bfloat16_rn(rnd(s));
  for (auto &x : dout) x = __float2bfloat16_rn(rnd(s));
  std::vector<float> lse(nl, NAN), delta(nl, NAN);
  Geo g = {B, T, H, Hkv, 1.0f / std::sqrt((float)D)};
  cuda_emu::launch({(unsigned)((T + BR - 1) / BR), (unsigned)H, (unsigned)B}, THREADS, fwd_smem<D>(),
                   [&] { fa_fwd<D>(out.data(), lse.data(), q.data(), k.data(), v.data(), g); });
  cuda_emu::launch({(unsigned)((B * T * H + 7) / 8), 1, 1}, 256, 0,
                   [&] { fa_delta(delta.data(), out.data(), dout.data(), g, D); });
  cuda_emu::launch({(unsigned)((T + BR - 1) / BR), (unsigned)H, (unsigned)B}, THREADS, dq_smem<D>(),
                   [&] { fa_dq<D>(dq.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), g); });
  cuda_emu::launch({(unsigned)((T + BC - 1) / BC), (unsigned)Hkv, (unsigned)B}, THREADS, dkv_smem<D>(), [&] {
    fa_dkv<D>(dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), lse.data(), delta.data(), g);
  });

  // float64 reference from the same bf16 values
  std::vector<double> ro(nq), rl(nl), rdq(nq), rdk(nk), rdv(nk);
  const double sc = 1.0 / std::sqrt((double)D);
  const int64_t grp = H / Hkv;
  auto at = [&](const std::vector<__nv_bfloat16> &x, int64_t heads, int64_t b, int64_t t, int64_t h, int c) {
    return (double)f32(x[(size_t)(((b * T + t) * heads + h) * D + c)]);
  };
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++) {
        int64_t hk = h / grp;
        std::vector<double> sco((size_t)i + 1);
        double m = -1e300, l = 0;
        for (int64_t j = 0; j <= i; j++) {
          double d = 0;
          for (int c = 0; c < D; c++) d += at(q, H, b, i, h, c) * at(k, Hkv, b, j, hk, c);
          sco[(size_t)j] = d * sc;
          m = std::fmax(m, sco[(size_t)j]);
        }
        for (double x : sco) l += std::exp(x - m);
        rl[(size_t)((b * H + h) * T + i)] = m + std::log(l);
        for (int c = 0; c < D; c++) {
          double o = 0;
          for (int64_t j = 0; j <= i; j++) o += std::exp(sco[(size_t)j] - m) / l * at(v, Hkv, b, j, hk, c);
          ro[(size_t)(((b * T + i) * H + h) * D + c)] = o;
        }
        // backward from the kernel's own output and lse, as the GPU test does
        double L = lse[(size_t)((b * H + h) * T + i)], Di = 0;
        for (int c = 0; c < D; c++) Di += at(dout, H, b, i, h, c) * at(out, H, b, i, h, c);
        for (int64_t j = 0; j <= i; j++) {
          double d = 0, dp = 0;
          for (int c = 0; c < D; c++) {
            d += at(q, H, b, i, h, c) * at(k, Hkv, b, j, hk, c);
            dp += at(dout, H, b, i, h, c) * at(v, Hkv, b, j, hk, c);
          }
          double p = std::exp(d * sc - L), ds = p * (dp - Di) * sc;
          for (int c = 0; c < D; c++) {
            rdq[(size_t)(((b * T + i) * H + h) * D + c)] += ds * at(k, Hkv, b, j, hk, c);
            rdk[(size_t)(((b * T + j) * Hkv + hk) * D + c)] += ds * at(q, H, b, i, h, c);
            rdv[(size_t)(((b * T + j) * Hkv + hk) * D + c)] += p * at(dout, H, b, i, h, c);
          }
        }
      }
  double lse_err = 0;
  for (size_t i = 0; i < nl; i++) lse_err = std::isfinite(lse[i]) ? std::fmax(lse_err, std::fabs(lse[i] - rl[i])) : 1e30;
  char what[160];
  double e[4] = {rel_error(out, ro), rel_error(dq, rdq), rel_error(dk, rdk), rel_error(dv, rdv)};
  const char *names[4] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    snprintf(what, sizeof what, "D%d B%lld T%lld H%lld/%lld: %s within 1e-2 of float64", D, (long long)B, (long long)T,
             (long long)H, (long long)Hkv, names[i]);
    expect(e[i] <= 1e-2, what, e[i]);
  }
  snprintf(what, sizeof what, "D%d T%lld: lse within 1e-4", D, (long long)T);
  expect(lse_err <= 1e-4, what, lse_err);
  printf("test_attention_tc_emu: D%d B%lld T%lld H%lld/%lld: out %.2e dq %.2e dk %.2e dv %.2e lse %.1e\n", D,
         (long long)B, (long long)T, (long long)H, (long long)Hkv, e[0], e[1], e[2], e[3], lse_err);
}

int main() {
  check<64>(1, 130, 2, 1);   // three query tiles, the last partial; two heads share one kv head
  check<128>(2, 70, 4, 2);   // two tiles, batch 2, groups of 2
  check<64>(1, 17, 1, 1);    // shorter than a tile
  printf("test_attention_tc_emu: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
