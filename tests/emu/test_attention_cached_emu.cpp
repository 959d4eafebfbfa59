// test_attention_cached_emu: generation's attention kernel
// (kernels/attention_cached.cuh) run on the CPU under tests/emu/cuda_emu.h
// against a float64 causal attention of the whole sequence: queries at
// position 0 (a prompt of 5), one at a time, and chunks of 3 part way in;
// caches longer than the kernel's chunk of 256 keys (the running max
// rescales); head_dim above the block's thread count (two output elements
// a thread); GQA groups; rows of the cache past the last position NaN, never
// read. Tolerance relative to the largest output: fp32 1e-5, bf16 inputs
// (fp32 arithmetic, one bf16 rounding of the output) 8e-3.
#include <cmath>
#include <cstdio>
#include <vector>

#include "emu_kit.h"

#define FSDP_CACHED_SHARED(name) FSDP_TC_SHARED(name)
#include "../../kernels/attention_cached.cuh"

static EmuKit kit{"test_attention_cached_emu"};

template <typename T>
static void check_case(const char *name, int64_t T_, int64_t H, int64_t Hkv, int64_t D, unsigned threads, double tol,
                       int64_t first = 0) {
  const int64_t B = 1, cap = T_ + 5;
  std::vector<T> q(B * T_ * H * D), kc(B * cap * Hkv * D, from<T>(NAN)), vc(B * cap * Hkv * D, from<T>(NAN));
  uint32_t s = (uint32_t)(T_ * 31 + H * 7 + D);
  for (auto &x : q) x = from<T>(rnd(s));
  for (int64_t i = 0; i < B * T_ * Hkv * D; i++) kc[i] = from<T>(rnd(s)), vc[i] = from<T>(rnd(s));
  const int64_t G = H / Hkv;
  // float64 reference from the stored (rounded) inputs
  std::vector<double> want(B * T_ * H * D);
  for (int64_t i = 0; i < T_; i++)
    for (int64_t h = 0; h < H; h++) {
      std::vector<double> sc(i + 1);
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j <= i; j++) {
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += (double)ld(q.data(), (i * H + h) * D + d) * ld(kc.data(), (j * Hkv + h / G) * D + d);
        sc[j] = dot / std::sqrt((double)D);
        m = std::fmax(m, sc[j]);
      }
      for (int64_t j = 0; j <= i; j++) z += (sc[j] = std::exp(sc[j] - m));
      for (int64_t d = 0; d < D; d++) {
        double o = 0;
        for (int64_t j = 0; j <= i; j++) o += sc[j] / z * ld(vc.data(), (j * Hkv + h / G) * D + d);
        want[(i * H + h) * D + d] = o;
      }
    }
  // the keys and values are in the cache as they were written: a later
  // position's are visible only to later queries (causality is the kernel's)
  std::vector<T> out(B * T_ * H * D, from<T>(NAN));
  const size_t smem = (size_t)(D + fsdp_cached::CACHED_CHUNK + 32) * sizeof(float);
  const float scale = 1.0f / std::sqrt((float)D);
  int64_t pos = first; /* the queries from `first` on (the cache is given whole) */
  while (pos < T_) {
    const int64_t n = pos == first ? std::min<int64_t>(5, T_ - first) : (pos + 3 < T_ && pos % 2 ? 3 : 1);
    const int64_t m = std::min(n, T_ - pos);
    T *o = out.data() + pos * H * D;
    const T *qq = q.data() + pos * H * D;
    cuda_emu::launch({(unsigned)(m * H), 1, 1}, (int)threads, smem, [&] {
      fsdp_cached::attention_cached_kernel<T>(o, qq, kc.data(), vc.data(), m, pos, cap, H, Hkv, D, scale);
    });
    pos += m;
  }
  double err = 0, big = 1e-30;
  for (size_t i = (size_t)(first * H * D); i < want.size(); i++) {
    const double g = ld(out.data(), (int64_t)i);
    err = std::isfinite(g) ? std::fmax(err, std::fabs(g - want[i])) : INFINITY;
    big = std::fmax(big, std::fabs(want[i]));
  }
  char what[160];
  snprintf(what, sizeof what, "%s: T %lld, heads %lld/%lld, head_dim %lld, %u threads: max error / max output", name,
           (long long)T_, (long long)H, (long long)Hkv, (long long)D, threads);
  kit.expect(err / big <= tol, what, err / big, tol);
}

int main() {
  check_case<float>("fp32", 9, 4, 2, 8, 32, 1e-5);
  check_case<float>("fp32", 300, 2, 1, 16, 64, 1e-5, 250); // two chunks of keys
  check_case<float>("fp32", 12, 2, 2, 80, 32, 1e-5);    // head_dim 80 over 32 threads: three elements a thread
  check_case<__nv_bfloat16>("bf16", 9, 4, 2, 8, 32, 8e-3);
  check_case<__nv_bfloat16>("bf16", 270, 3, 1, 8, 64, 8e-3, 255);
  return kit.finish();
}
