// test_attention_pos_emu: queries at given positions (a context-parallel
// rank's rows, issue 46) in the fp32 CUDA-core kernels (kernels/attention.cuh,
// the POS_DOCS_ROWS instances with q_lo NULL, as the _pos calls run them:
// forward, dq per query row, dk/dv per key row) run
// on the CPU under tests/emu/cuda_emu.h, against the CPU op
// (fsdp_attention_forward_pos / _backward_pos, src/ops/attention_pos.c) on
// the same inputs. B = 2, GQA heads 4/2 and MHA 2/2, head_dim 16 and 64,
// fp32 and bf16 storage; positions: each rank of cp = 2 (T = 140: chunks
// of 35, across the kernels' 32-row blocks and 16-key tiles) and cp = 4
// (T = 136, chunks of 17), positions in any order (repeats, jumps back),
// and ring attention's steps over a block of 2c keys: every query at c - 1
// (c = 35: a run of equal positions across 32-row blocks), the first c at
// -1 (seeing no key) and the rest at 2c - 1, mixed runs of -1 and equal
// positions, and every query at -1.
//   * Tolerances, max |error| / max |CPU op| (lse: absolute; measured:
//     fp32 6e-7, bf16 out 2.6e-3, grads 4.1e-3, lse 1e-6): fp32 out, dq,
//     dk, dv 5e-6 (two fp32 computations, sums in other orders); bf16 out
//     8e-3 (one rounding, 2^-8 relative, of an fp32 value), dq, dk, dv 8e-3
//     (also the kernel's Di from its rounded out; the CPU op gets the bf16
//     inputs as floats); lse 5e-6 absolute. Outputs start NaN: every
//     element must be written, dk and dv for all Tk keys.
//   * Rows at -1: out, dq exactly 0 and lse -inf, as the CPU op's; their
//     dout is NaN (not to be read), and so are their out and lse going
//     into the backward kernels (the ring hands them the merged ones).
//   * q_pos[i] = i gives the causal kernels' bits, out, lse, dq, dk, dv.
//   * No queries (Tq = 0): dk, dv all zeros; no keys (Tk = 0, every query
//     at -1): dq zeros.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"
#include "attention_emu.h"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_attention_pos_emu"};

/* rank r's positions of a sequence of T in cp ranks: chunks r and 2 cp - 1 - r of 2 cp */
static std::vector<int32_t> cp_positions(int T, int cp, int r) {
  const int c = T / (2 * cp);
  std::vector<int32_t> pos((size_t)(2 * c));
  for (int i = 0; i < c; i++) pos[(size_t)i] = r * c + i, pos[(size_t)(c + i)] = (2 * cp - 1 - r) * c + i;
  return pos;
}

/* the CPU op on the kernels' inputs (bf16 ones as floats) */
template <typename T>
static Attn<float> cpu_op(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                          const std::vector<T> &dout, const std::vector<int32_t> &pos, const Shape &sh) {
  const std::vector<float> qf = widen(q), kf = widen(k), vf = widen(v), df = widen(dout);
  Attn<float> a{std::vector<float>(q.size()), std::vector<float>(q.size()), std::vector<float>(k.size()),
                std::vector<float>(k.size()), std::vector<float>((size_t)(sh.B * sh.H * sh.T))};
  int rc = fsdp_attention_forward_pos(a.out.data(), a.lse.data(), qf.data(), kf.data(), vf.data(), pos.data(), sh.B,
                                      sh.T, sh.Tk, sh.H, sh.Hkv, sh.D);
  if (!rc)
    rc = fsdp_attention_backward_pos(a.dq.data(), a.dk.data(), a.dv.data(), df.data(), qf.data(), kf.data(), vf.data(),
                                     a.out.data(), a.lse.data(), pos.data(), sh.B, sh.T, sh.Tk, sh.H, sh.Hkv, sh.D);
  kit.expect(rc == 0, "the CPU op runs", rc, 0);
  return a;
}

/* the rows at -1 (no key): their dout NaN before the kernels run; after
 * forward, out and lse NaN for the backward ones; after both, the kernels'
 * out and dq exactly 0 and lse -inf, as want's (the CPU op's), then both
 * lse 0 there, so that the tolerances compare finite values */
static std::vector<size_t> unseen_rows(const std::vector<int32_t> &pos, const Shape &sh) {
  std::vector<size_t> rows; /* (b, i, h) of [B, Tq, H] */
  for (size_t e = 0; e < (size_t)(sh.B * sh.T * sh.H); e++)
    if (pos[e / (size_t)sh.H % (size_t)sh.T] < 0) rows.push_back(e);
  return rows;
}

template <typename T>
static void expect_unseen(const char *what, const std::vector<size_t> &rows, Attn<T> &got, Attn<float> &want,
                          const Shape &sh) {
  bool ok = true;
  for (size_t r : rows) {
    const size_t b = r / (size_t)(sh.T * sh.H), i = r / (size_t)sh.H % (size_t)sh.T, h = r % (size_t)sh.H;
    for (size_t c = 0; c < (size_t)sh.D; c++)
      ok = ok && ld(got.out.data(), (int64_t)(r * sh.D + c)) == 0 && ld(got.dq.data(), (int64_t)(r * sh.D + c)) == 0;
    float &gl = got.lse[(b * sh.H + h) * sh.T + i], &wl = want.lse[(b * sh.H + h) * sh.T + i];
    ok = ok && gl == -INFINITY && wl == -INFINITY;
    gl = wl = 0;
  }
  kit.expect(ok, what, ok ? 0 : 1, 0);
}

template <typename T>
static void check_pos(const char *name, const std::vector<int32_t> &pos, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                      bool bf16) {
  const int64_t B = 2, Tq = (int64_t)pos.size();
  const Shape sh{B, Tq, H, Hkv, D, 1.0f / std::sqrt((float)D), Tk};
  std::vector<T> q((size_t)(B * Tq * H * D)), dout(q.size()), k((size_t)(B * Tk * Hkv * D)), v(k.size());
  random_inputs(q, dout, k, v, (uint32_t)(D * 131 + Tq * 7 + Tk + H));
  const std::vector<size_t> unseen = unseen_rows(pos, sh);
  Attn<float> want = cpu_op(q, k, v, dout, pos, sh);
  for (size_t r : unseen)
    for (size_t c = 0; c < (size_t)D; c++) dout[r * D + c] = from<T>(NAN);
  Attn<T> got = run_any<T, fsdp_attn::POS_DOCS_ROWS>(q, k, v, dout, pos.data(), sh);
  char what[192];
  snprintf(what, sizeof what, "%s, heads %lld/%lld, head_dim %lld, %s", bf16 ? "bf16" : "fp32", (long long)H,
           (long long)Hkv, (long long)D, name);
  if (!unseen.empty()) {
    Attn<T> poisoned = got; /* the backward again, the rows at -1 of out and lse NaN */
    for (size_t r : unseen) {
      const size_t b = r / (size_t)(Tq * H), i = r / (size_t)H % (size_t)Tq, h = r % (size_t)H;
      for (size_t c = 0; c < (size_t)D; c++) poisoned.out[r * D + c] = from<T>(NAN);
      poisoned.lse[(b * H + h) * Tq + i] = NAN;
    }
    run_any_backward<T, fsdp_attn::POS_DOCS_ROWS>(poisoned, q, k, v, dout, pos.data(), sh);
    got.dq = poisoned.dq, got.dk = poisoned.dk, got.dv = poisoned.dv;
    char u[240];
    snprintf(u, sizeof u, "%s: rows at -1 give out, dq 0 and lse -inf", what);
    expect_unseen(u, unseen, got, want, sh);
  }
  expect_attention(kit, what, got, want, bf16 ? 8e-3 : 5e-6, 5e-6);
  bool identity = Tq == Tk;
  for (int64_t i = 0; identity && i < Tq; i++) identity = pos[(size_t)i] == i;
  if (identity) { /* q_pos[i] = i: the causal instances' bits */
    const bool same = same_bits(got, run_any<T, fsdp_attn::CAUSAL>(q, k, v, dout, nullptr, sh));
    strncat(what, ": out, lse, dq, dk, dv bit for bit the causal kernels'", sizeof what - strlen(what) - 1);
    kit.expect(same, what, same ? 0 : 1, 0);
  }
}

/* Tk = 0, every query at -1: out, dq zeros, lse -inf (no dk, dv kernel) */
static void check_no_keys() {
  const int64_t B = 2, Tq = 5, H = 4, Hkv = 2, D = 16;
  const Shape sh{B, Tq, H, Hkv, D, 0.25f, 0};
  const std::vector<int32_t> pos((size_t)Tq, -1);
  std::vector<float> q((size_t)(B * Tq * H * D), 1.0f), dout(q.size(), 1.0f), k, v;
  Attn<float> got = run_any<float, fsdp_attn::POS_DOCS_ROWS>(q, k, v, dout, pos.data(), sh);
  bool inf = true;
  for (float l : got.lse) inf = inf && l == -INFINITY;
  kit.expect(inf, "no keys: lse -inf", inf ? 0 : 1, 0);
  expect_close(kit, "no keys: out zeros", got.out.data(), std::vector<double>(q.size()), 0, true);
  expect_close(kit, "no keys: dq zeros", got.dq.data(), std::vector<double>(q.size()), 0, true);
}

/* Tq = 0: the dk, dv kernel alone, writing zeros over all Tk rows */
static void check_no_queries() {
  const int64_t B = 2, Tk = 40, H = 4, Hkv = 2, D = 16;
  const Shape sh{B, 0, H, Hkv, D, 0.25f, Tk};
  std::vector<float> q, dout, k((size_t)(B * Tk * Hkv * D), 1.0f), v(k.size(), 1.0f);
  const Attn<float> got = run_any<float, fsdp_attn::POS_DOCS_ROWS>(q, k, v, dout, nullptr, sh);
  expect_close(kit, "no queries: dk zeros", got.dk.data(), std::vector<double>(k.size()), 0, true);
  expect_close(kit, "no queries: dv zeros", got.dv.data(), std::vector<double>(k.size()), 0, true);
}

template <typename T>
static void check_all(bool bf16) {
  const std::vector<int32_t> any{39, 0, 5, 5, 6, 7, 3, 2, 39, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                                 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 1, 12};
  std::vector<int32_t> ident(70), lower(70, 34), higher(70, -1);
  for (int i = 0; i < 70; i++) ident[(size_t)i] = i;
  for (int i = 35; i < 70; i++) higher[(size_t)i] = 69;
  /* runs of -1 and of equal positions, some across the 32-row blocks and 16-key tiles */
  std::vector<int32_t> mixed{-1, -1, 3, 3, 4, 5, 5, 5, -1, 0, 0, 9};
  for (int i = 0; i < 30; i++) mixed.push_back(i < 20 ? 17 : -1);
  mixed.push_back(39);
  for (int64_t D : {16, 64}) {
    check_pos<T>("cp 2 rank 0 of T 140", cp_positions(140, 2, 0), 140, 4, 2, D, bf16);
    check_pos<T>("cp 2 rank 1 of T 140", cp_positions(140, 2, 1), 140, 4, 2, D, bf16);
    check_pos<T>("positions in any order", any, 40, 4, 2, D, bf16);
    check_pos<T>("cp 1 (q_pos[i] = i)", ident, 70, 4, 2, D, bf16);
    check_pos<T>("ring: every query at c - 1 of 2c keys", lower, 70, 4, 2, D, bf16);
    check_pos<T>("ring: the first c queries at -1, the rest at 2c - 1", higher, 70, 4, 2, D, bf16);
    check_pos<T>("mixed runs of -1 and equal positions", mixed, 40, 4, 2, D, bf16);
  }
  check_pos<T>("every query at -1", std::vector<int32_t>(40, -1), 40, 4, 2, 16, bf16);
  for (int r = 0; r < 4; r++) {
    char name[48];
    snprintf(name, sizeof name, "cp 4 rank %d of T 136", r);
    check_pos<T>(name, cp_positions(136, 4, r), 136, 2, 2, 16, bf16);
  }
}

int main() {
  check_all<float>(false);
  check_all<__nv_bfloat16>(true);
  check_no_queries();
  check_no_keys();
  return kit.finish();
}
