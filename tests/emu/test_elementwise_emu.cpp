// test_elementwise_emu: the residual add, scale-add and SwiGLU's forward and backward
// (kernels/elementwise.cuh: 16 bytes per load where every pointer is
// 16-byte aligned, the rest one element at a time) run on the CPU under
// tests/emu/cuda_emu.h:
//   * the vector path gives the one-at-a-time path's bits exactly (the same
//     fp32 arithmetic), for lengths around whole vectors (0, 1, V-1, V, V+1,
//     1000, 1027) and grids smaller and larger than the work;
//   * every output element is written (outputs start as a guard value that
//     fails the float64 check), none past either end, and no 16-byte access
//     is misaligned;
//   * the values against float64 from the stored inputs: fp32 within 2e-6,
//     bf16 within 8e-3 (one rounding, 2^-8 relative, of an fp32 value), of
//     the largest output; SwiGLU's backward also in place (gradients over
//     gate and up), as the MLP calls it.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"

static std::atomic<long> misaligned;
#define FSDP_VEC_ALIGNED(p) (void)((uintptr_t)(p) % 16 ? misaligned++ : 0)

#include "../../kernels/elementwise.cuh"

static EmuKit kit{"test_elementwise_emu"};

/* a buffer of n elements at a 16-byte boundary (or `off` elements past
 * one), GUARD before, inside and after: an element never written keeps it
 * (and fails against float64), one written past the end loses it */
static const float GUARD = 768.0f; /* exact in bf16 */
template <typename T>
struct Buf {
  std::vector<T> mem;
  T *p;
  Buf(int64_t n, int off) : mem(n + 48) {
    for (auto &x : mem) x = from<T>(GUARD);
    uintptr_t a = (uintptr_t)mem.data();
    p = (T *)((a + 15) / 16 * 16) + off;
  }
  bool guards_intact(int64_t n) const {
    for (T *q = (T *)mem.data(); q < p; q++)
      if (ld(q, 0) != GUARD) return false;
    for (T *q = p + n; q < mem.data() + mem.size(); q++)
      if (ld(q, 0) != GUARD) return false;
    return true;
  }
};

template <typename T>
static void fill(Buf<T> &b, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = 0; i < n; i++) b.p[i] = from<T>(scale * rnd(seed));
}

template <typename T>
static bool same_bits(const T *a, const T *b, int64_t n) {
  return std::memcmp(a, b, sizeof(T) * (size_t)n) == 0;
}

static double sig(double g) { return 1.0 / (1.0 + std::exp(-g)); }

template <typename T>
static void check_n(const char *name, int64_t n, unsigned blocks, int threads, double tol) {
  char what[200];
  const int V = fsdp_vec::Vec<T>::n;
  /* inputs, 16-byte aligned */
  Buf<T> a(n, 0), b(n, 0), d(n, 0);
  fill(a, n, 11u + (uint32_t)n, 4.0f);
  fill(b, n, 29u + (uint32_t)n, 4.0f);
  fill(d, n, 43u + (uint32_t)n, 1.0f);
  auto run = [&](auto kern) { cuda_emu::launch({blocks, 1, 1}, threads, 0, kern); };

  misaligned = 0;
  /* add and SwiGLU forward, both paths */
  Buf<T> add0(n, 0), add1(n, 0), fw0(n, 0), fw1(n, 0);
  run([&] { fsdp_ew::binary_kernel<T>(add0.p, a.p, b.p, n, 0, fsdp_ew::AddOp()); });
  run([&] { fsdp_ew::binary_kernel<T>(add1.p, a.p, b.p, n, 1, fsdp_ew::AddOp()); });
  run([&] { fsdp_ew::binary_kernel<T>(fw0.p, a.p, b.p, n, 0, fsdp_ew::SwiGLUOp()); });
  run([&] { fsdp_ew::binary_kernel<T>(fw1.p, a.p, b.p, n, 1, fsdp_ew::SwiGLUOp()); });
  /* scale-add in place (y += alpha x), both paths, against the same formula in fp32 */
  Buf<T> sa0(n, 0), sa1(n, 0);
  for (int64_t i = 0; i < n; i++) sa0.p[i] = sa1.p[i] = b.p[i];
  run([&] { fsdp_ew::binary_kernel<T>(sa0.p, sa0.p, a.p, n, 0, fsdp_ew::ScaleAddOp{-0.375f}); });
  run([&] { fsdp_ew::binary_kernel<T>(sa1.p, sa1.p, a.p, n, 1, fsdp_ew::ScaleAddOp{-0.375f}); });
  bool sa_ok = same_bits(sa0.p, sa1.p, n) && sa1.guards_intact(n);
  for (int64_t i = 0; i < n; i++)
    sa_ok = sa_ok && std::fabs(ld(sa1.p, i) - (ld(b.p, i) - 0.375 * ld(a.p, i))) <= tol * 8;
  snprintf(what, sizeof what, "%s, n %lld: scale-add in place, both paths, against float64", name, (long long)n);
  kit.expect(sa_ok, what, 0, tol * 8);
  /* backward out of place, both paths, and in place over copies of gate and up */
  Buf<T> dg0(n, 0), du0(n, 0), dg1(n, 0), du1(n, 0), g2(n, 0), u2(n, 0);
  run([&] { fsdp_ew::swiglu_bwd_kernel<T>(dg0.p, du0.p, d.p, a.p, b.p, n, 0); });
  run([&] { fsdp_ew::swiglu_bwd_kernel<T>(dg1.p, du1.p, d.p, a.p, b.p, n, 1); });
  for (int64_t i = 0; i < n; i++) g2.p[i] = a.p[i], u2.p[i] = b.p[i];
  run([&] { fsdp_ew::swiglu_bwd_kernel<T>(g2.p, u2.p, d.p, g2.p, u2.p, n, 1); });

  snprintf(what, sizeof what, "%s, n %lld (vectors of %d), %u x %d threads: the vector path's bits equal the scalar path's",
           name, (long long)n, V, blocks, threads);
  kit.expect(same_bits(add0.p, add1.p, n) && same_bits(fw0.p, fw1.p, n) && same_bits(dg0.p, dg1.p, n) &&
                 same_bits(du0.p, du1.p, n) && same_bits(dg1.p, g2.p, n) && same_bits(du1.p, u2.p, n),
             what, 0, 0);
  snprintf(what, sizeof what, "%s, n %lld: nothing written past either end", name, (long long)n);
  kit.expect(add1.guards_intact(n) && fw1.guards_intact(n) && dg1.guards_intact(n) && du1.guards_intact(n) &&
                 g2.guards_intact(n) && u2.guards_intact(n),
             what, 0, 0);
  snprintf(what, sizeof what, "%s, n %lld: misaligned 16-byte accesses", name, (long long)n);
  kit.expect(misaligned == 0, what, (double)misaligned, 0);

  /* float64 from the stored inputs; an element never written fails */
  double err[4] = {0, 0, 0, 0}, big[4] = {1e-30, 1e-30, 1e-30, 1e-30};
  for (int64_t i = 0; i < n; i++) {
    double g = ld(a.p, i), u = ld(b.p, i), dy = ld(d.p, i), s = sig(g);
    double ref[4] = {g + u, g * s * u, dy * u * s * (1 + g * (1 - s)), dy * g * s};
    double got[4] = {ld(add1.p, i), ld(fw1.p, i), ld(dg1.p, i), ld(du1.p, i)};
    for (int k = 0; k < 4; k++) {
      double e = std::fabs(got[k] - ref[k]);
      err[k] = std::isnan(got[k]) || e > err[k] ? (std::isnan(got[k]) ? INFINITY : e) : err[k];
      big[k] = std::fmax(big[k], std::fabs(ref[k]));
    }
  }
  const char *op[4] = {"add", "swiglu forward", "swiglu backward dgate", "swiglu backward dup"};
  for (int k = 0; k < 4; k++) {
    snprintf(what, sizeof what, "%s, n %lld: %s against float64", name, (long long)n, op[k]);
    kit.expect(err[k] / big[k] <= tol, what, err[k] / big[k], tol);
  }
}

/* a view at an odd offset: the caller passes vec = 0; the results still right */
template <typename T>
static void check_unaligned(const char *name, int off) {
  const int64_t n = 203;
  Buf<T> a(n, off), b(n, off), y(n, 0), z(n, off);
  fill(a, n, 5u, 2.0f);
  fill(b, n, 7u, 2.0f);
  misaligned = 0;
  cuda_emu::launch({2, 1, 1}, 32, 0, [&] { fsdp_ew::binary_kernel<T>(z.p, a.p, b.p, n, 0, fsdp_ew::AddOp()); });
  bool ok = misaligned == 0 && z.guards_intact(n);
  for (int64_t i = 0; i < n; i++) ok = ok && ld(z.p, i) == ld(z.p, i) && std::fabs(ld(z.p, i) - (ld(a.p, i) + ld(b.p, i))) <=
                                                                           0.01 * (std::fabs(ld(a.p, i) + ld(b.p, i)) + 1e-3);
  char what[120];
  snprintf(what, sizeof what, "%s: inputs %d elements past a 16-byte boundary, one at a time", name, off);
  kit.expect(ok, what, (double)misaligned, 0);
}

int main() {
  const int64_t lengths[] = {0, 1, 3, 4, 5, 7, 8, 9, 1000, 1027};
  for (int64_t n : lengths) {
    check_n<float>("fp32", n, 2, 32, 2e-6);
    check_n<__nv_bfloat16>("bf16", n, 2, 32, 8e-3);
  }
  /* more threads than vectors, and a single thread striding over all */
  check_n<__nv_bfloat16>("bf16, many threads", 24, 3, 64, 8e-3);
  check_n<float>("fp32, one thread", 1027, 1, 1, 2e-6);
  check_unaligned<float>("fp32", 1);
  check_unaligned<__nv_bfloat16>("bf16", 3);
  return kit.finish();
}
