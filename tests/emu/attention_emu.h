// attention_emu.h: what the emulated tests of the fp32 CUDA-core attention
// kernels (kernels/attention.cuh) share: the three kernels launched as
// attention.cu launches them, under tests/emu/cuda_emu.h, and the checks.
// The includer includes emu_kit.h first.
#ifndef FSDP_TESTS_ATTENTION_EMU_H
#define FSDP_TESTS_ATTENTION_EMU_H

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define FSDP_ATTN_SHARED(name) float *name = reinterpret_cast<float *>(cuda_emu::self.smem)
#include "../../kernels/attention.cuh"

using fsdp_attn::KTILE;
using fsdp_attn::QROWS;
using fsdp_attn::Shape;

template <typename T>
struct Attn {
  std::vector<T> out, dq, dk, dv;
  std::vector<float> lse;
};

/* dq per query row, dk and dv per key row (sh.Tk of them) into a's, from
 * its out and lse; rows: doc_start (DOCS_ROWS), q_pos (POS_DOCS_ROWS) or NULL
 * (CAUSAL). dq, dk, dv start NaN: every element must be written. */
template <typename T, int MAXD, int ROWS>
static void run_backward_kernels(Attn<T> &a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                                 const std::vector<T> &dout, const int32_t *rows, const Shape &sh) {
  const float nan = NAN;
  a.dq.assign(q.size(), from<T>(nan)), a.dk.assign(k.size(), from<T>(nan)), a.dv.assign(k.size(), from<T>(nan));
  const unsigned nq = (unsigned)((sh.T + QROWS - 1) / QROWS), nk = (unsigned)((sh.Tk + QROWS - 1) / QROWS);
  const int64_t D = sh.D;
  if (nq)
    cuda_emu::launch({nq, (unsigned)sh.H, (unsigned)sh.B}, QROWS, sizeof(float) * (2 * QROWS * (D + 1) + 2 * KTILE * D),
                     [&] {
                       fsdp_attn::attn_bwd_dq<T, MAXD, ROWS>(a.dq.data(), dout.data(), q.data(), k.data(), v.data(),
                                                             a.out.data(), a.lse.data(), rows, sh);
                     });
  cuda_emu::launch({nk, (unsigned)sh.Hkv, (unsigned)sh.B}, QROWS,
                   sizeof(float) * (3 * QROWS * (D + 1) + 2 * KTILE * D + (ROWS ? 3 : 2) * KTILE), [&] {
                     fsdp_attn::attn_bwd_dkv<T, MAXD, ROWS>(a.dk.data(), a.dv.data(), dout.data(), q.data(), k.data(),
                                                            v.data(), a.out.data(), a.lse.data(), rows, sh);
                   });
}

/* forward, then the backward kernels (above). Outputs start NaN. */
template <typename T, int MAXD, int ROWS>
static Attn<T> run_kernels(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                           const std::vector<T> &dout, const int32_t *rows, const Shape &sh) {
  const float nan = NAN;
  Attn<T> a{std::vector<T>(q.size(), from<T>(nan)), {}, {}, {}, std::vector<float>((size_t)(sh.B * sh.H * sh.T), nan)};
  const unsigned nq = (unsigned)((sh.T + QROWS - 1) / QROWS);
  const int64_t D = sh.D;
  if (nq)
    cuda_emu::launch({nq, (unsigned)sh.H, (unsigned)sh.B}, QROWS, sizeof(float) * (QROWS * (D + 1) + 2 * KTILE * D), [&] {
      fsdp_attn::attn_fwd<T, MAXD, ROWS>(a.out.data(), a.lse.data(), q.data(), k.data(), v.data(), rows, sh);
    });
  run_backward_kernels<T, MAXD, ROWS>(a, q, k, v, dout, rows, sh);
  return a;
}

template <typename T, int ROWS>
static Attn<T> run_any(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                       const std::vector<T> &dout, const int32_t *rows, const Shape &sh) {
  return sh.D <= 32 ? run_kernels<T, 32, ROWS>(q, k, v, dout, rows, sh) : run_kernels<T, 64, ROWS>(q, k, v, dout, rows, sh);
}

/* the backward kernels alone, from a's out and lse */
template <typename T, int ROWS>
static void run_any_backward(Attn<T> &a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                             const std::vector<T> &dout, const int32_t *rows, const Shape &sh) {
  if (sh.D <= 32) run_backward_kernels<T, 32, ROWS>(a, q, k, v, dout, rows, sh);
  else run_backward_kernels<T, 64, ROWS>(a, q, k, v, dout, rows, sh);
}

/* max |got - want| / max |want| (abs: max |got - want|); a non-finite value fails */
template <typename T, typename W>
static void expect_close(EmuKit &kit, const char *what, const T *got, const std::vector<W> &want, double tol,
                         bool abs = false) {
  double err = 0, big = abs ? 1.0 : 1e-30;
  for (size_t i = 0; i < want.size(); i++) {
    const double g = ld(got, (int64_t)i), w = (double)want[i];
    err = std::isfinite(g) ? std::fmax(err, std::fabs(g - w)) : INFINITY;
    if (!abs) big = std::fmax(big, std::fabs(w));
  }
  kit.expect(err / big <= tol, what, err / big, tol);
}

/* got's out, lse (absolute), dq, dk, dv against want's (W: any struct of
 * the five vectors), labelled "name: out" and so on */
template <typename T, typename W>
static void expect_attention(EmuKit &kit, const char *name, const Attn<T> &got, const W &want, double tol,
                             double lse_tol) {
  char what[256];
  auto label = [&](const char *x) {
    snprintf(what, sizeof what, "%s: %s", name, x);
    return what;
  };
  expect_close(kit, label("out"), got.out.data(), want.out, tol);
  expect_close(kit, label("lse (absolute)"), got.lse.data(), want.lse, lse_tol, true);
  expect_close(kit, label("dq"), got.dq.data(), want.dq, tol);
  expect_close(kit, label("dk"), got.dk.data(), want.dk, tol);
  expect_close(kit, label("dv"), got.dv.data(), want.dv, tol);
}

/* random q (in [-2, 2)), dout, k, v (in [-1, 1)) from seed s */
template <typename T>
static void random_inputs(std::vector<T> &q, std::vector<T> &dout, std::vector<T> &k, std::vector<T> &v, uint32_t s) {
  for (size_t i = 0; i < q.size(); i++) q[i] = from<T>(2 * rnd(s)), dout[i] = from<T>(rnd(s));
  for (size_t i = 0; i < k.size(); i++) k[i] = from<T>(rnd(s)), v[i] = from<T>(rnd(s));
}

template <typename T>
static bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(T));
}

/* out, lse, dq, dk, dv bit for bit */
template <typename T>
static bool same_bits(const Attn<T> &a, const Attn<T> &b) {
  return same_bits(a.out, b.out) && same_bits(a.lse, b.lse) && same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dv, b.dv);
}

struct Want {
  std::vector<double> out, lse, dq, dk, dv;
};

/* float64 attention and its backward for dout: query i of batch row b sees
 * keys keys(b, i) = {first, last} of sh.Tk (first > last: none, its out and
 * dq rows 0, its lse -inf) */
template <typename T, typename Keys>
static Want reference_keys(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                           const std::vector<T> &dout, const Shape &sh, Keys keys) {
  const int64_t B = sh.B, Tq = sh.T, Tk = sh.Tk, H = sh.H, Hkv = sh.Hkv, D = sh.D, G = H / Hkv;
  const double scale = 1.0 / std::sqrt((double)D);
  Want w{std::vector<double>(q.size()), std::vector<double>((size_t)(B * H * Tq), -INFINITY),
         std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(k.size())};
  std::vector<double> p((size_t)Tk), dp((size_t)Tk);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < Tq; i++) {
        int64_t j0, j1;
        keys(b, i, j0, j1);
        if (j0 > j1) continue;
        const int64_t qo = ((b * Tq + i) * H + h) * D;
        auto ko = [&](int64_t j) { return ((b * Tk + j) * Hkv + h / G) * D; };
        double m = -INFINITY, z = 0, Di = 0;
        for (int64_t j = j0; j <= j1; j++) {
          double s = 0;
          for (int64_t c = 0; c < D; c++) s += (double)ld(q.data(), qo + c) * ld(k.data(), ko(j) + c);
          p[(size_t)j] = s * scale;
          m = std::fmax(m, p[(size_t)j]);
        }
        for (int64_t j = j0; j <= j1; j++) z += (p[(size_t)j] = std::exp(p[(size_t)j] - m));
        w.lse[(size_t)((b * H + h) * Tq + i)] = m + std::log(z);
        for (int64_t j = j0; j <= j1; j++) {
          p[(size_t)j] /= z;
          dp[(size_t)j] = 0;
          for (int64_t c = 0; c < D; c++) {
            w.out[(size_t)(qo + c)] += p[(size_t)j] * ld(v.data(), ko(j) + c);
            dp[(size_t)j] += (double)ld(dout.data(), qo + c) * ld(v.data(), ko(j) + c);
          }
          Di += p[(size_t)j] * dp[(size_t)j];
        }
        for (int64_t j = j0; j <= j1; j++) {
          const double dsc = p[(size_t)j] * (dp[(size_t)j] - Di) * scale;
          for (int64_t c = 0; c < D; c++) {
            w.dq[(size_t)(qo + c)] += dsc * ld(k.data(), ko(j) + c);
            w.dk[(size_t)(ko(j) + c)] += dsc * ld(q.data(), qo + c);
            w.dv[(size_t)(ko(j) + c)] += p[(size_t)j] * ld(dout.data(), qo + c);
          }
        }
      }
  return w;
}

#endif
