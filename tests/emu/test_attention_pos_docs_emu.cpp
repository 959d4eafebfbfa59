// test_attention_pos_docs_emu: queries at given positions from a first key
// each (packed rows under context parallelism) in the fp32 CUDA-core
// kernels (kernels/attention.cuh, the POS_DOCS_ROWS instances: forward, dq
// per query row, dk/dv per key row) run on the CPU under
// tests/emu/cuda_emu.h, against float64 from the stored inputs (naive
// softmax over the keys q_lo[b, i] .. q_pos[i], and its gradient by the
// chain rule for dout) and against the CPU op
// (fsdp_attention_forward_pos_docs / _backward_pos_docs,
// src/ops/attention_pos_docs.c) on the same inputs wherever the layout
// keeps its contract. B = 2 (rows of different documents), GQA heads 4/2
// and MHA 2/2, head_dim 16 and 64, fp32 and bf16 storage; layouts:
//   * q_lo all 0 over the POS test's positions (cp ranks, any order, ring
//     steps with rows at -1): out, lse, dq, dk, dv bit for bit the _pos
//     calls' (the same kernels with q_lo NULL);
//   * ring attention's steps under cp = 2 (T = 140, chunks of 35) and cp =
//     4 (T = 136, chunks of 17): the queries of rank r at their positions
//     in the block of rank r' (tk = 2c keys of two chunks), each row's
//     documents cutting q_lo, every (r, r') pair: rows that see part of
//     the block, all of it and none (q_lo = q_pos + 1, and q_pos -1), with
//     empty rows inside the 16-row tiles and 32-row blocks of rows that
//     see keys (the test checks the layouts hold each case);
//   * key ranges of one block with a gap (the tiles between skipped),
//     single keys at the edges of key tiles and blocks, a block's last row
//     alone seeing its first and last keys (each tile or block seen by one
//     query alone, so that a skip one key or row too eager fails), and any
//     q_lo in [0, q_pos + 1] over positions in any order (q_lo rising and
//     falling within a block: more than the op's contract, the kernels
//     mask each row by itself);
//   * no queries (dk, dv zeros) and no keys (every row empty).
//   Tolerances, max |error| / max |want| (measured, against either: fp32
//   7.4e-7, bf16 out 3.3e-3, grads 4.0e-3, lse 9.5e-7), as the POS test's:
//   fp32 out, dq, dk, dv 5e-6; bf16 out 8e-3 (one rounding, 2^-8
//   relative, of an fp32 value), dq, dk, dv 8e-3 (also the kernel's Di
//   from its rounded out); lse 5e-6 absolute. Outputs start NaN: every
//   element must be written, dk and dv for all tk keys.
//   * Empty rows: out, dq exactly 0 and lse -inf, nothing to dk, dv; their
//     dout is NaN (not to be read), and so are their out and lse going
//     into the backward kernels (the ring hands them the merged ones).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_kit.h"
#include "attention_emu.h"
#include "../../src/fsdp_ops.h"

static EmuKit kit{"test_attention_pos_docs_emu"};


/* float64: query i of row b sees keys lo[b, i] .. pos[i] of sh.Tk (none: out, dq 0, lse -inf) */
template <typename T>
static Want reference(const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                      const std::vector<T> &dout, const std::vector<int32_t> &pos, const std::vector<int32_t> &lo,
                      const Shape &sh) {
  return reference_keys(q, k, v, dout, sh, [&](int64_t b, int64_t i, int64_t &j0, int64_t &j1) {
    j0 = lo[(size_t)(b * sh.T + i)];
    j1 = pos[(size_t)i];
  });
}

/* the CPU op (fsdp_attention_forward_pos_docs / _backward_pos_docs) on the
 * kernels' inputs (bf16 ones as floats), its empty rows' lse 0 where -inf
 * (the kernels' are checked, then zeroed); false where the layout is
 * outside the op's contract (fsdp_attention_pos_docs_check) */
template <typename T>
static bool cpu_op(Attn<float> &a, const std::vector<T> &q, const std::vector<T> &k, const std::vector<T> &v,
                   const std::vector<T> &dout, const std::vector<int32_t> &pos, const std::vector<int32_t> &lo,
                   const Shape &sh) {
  if (fsdp_attention_pos_docs_check(pos.data(), lo.data(), sh.B, sh.T, sh.Tk)) return false;
  const std::vector<float> qf = widen(q), kf = widen(k), vf = widen(v), df = widen(dout);
  a = Attn<float>{std::vector<float>(q.size()), std::vector<float>(q.size()), std::vector<float>(k.size()),
                  std::vector<float>(k.size()), std::vector<float>((size_t)(sh.B * sh.H * sh.T))};
  int rc = fsdp_attention_forward_pos_docs(a.out.data(), a.lse.data(), qf.data(), kf.data(), vf.data(), pos.data(),
                                           lo.data(), sh.B, sh.T, sh.Tk, sh.H, sh.Hkv, sh.D);
  if (!rc)
    rc = fsdp_attention_backward_pos_docs(a.dq.data(), a.dk.data(), a.dv.data(), df.data(), qf.data(), kf.data(),
                                          vf.data(), a.out.data(), a.lse.data(), pos.data(), lo.data(), sh.B, sh.T,
                                          sh.Tk, sh.H, sh.Hkv, sh.D);
  char what[1100];
  snprintf(what, sizeof what, "the CPU op runs (%s)", rc ? fsdp_last_error() : "");
  kit.expect(rc == 0, what, rc, 0);
  for (float &l : a.lse) l = l == -INFINITY ? 0 : l;
  return true;
}

/* what the layouts cover, over every call (checked at the end) */
static struct {
  bool part, all, none, mixed_tile, mixed_block;
} seen;

/* the empty rows (b, i, h) of [B, Tq, H], noting what the layout covers */
static std::vector<size_t> empty_rows(const std::vector<int32_t> &pos, const std::vector<int32_t> &lo, const Shape &sh) {
  std::vector<size_t> rows;
  for (int64_t b = 0; b < sh.B; b++) {
    std::vector<int> tile((size_t)(sh.T + KTILE) / KTILE), block((size_t)(sh.T + QROWS) / QROWS); /* bit 1 sees, 2 none */
    for (int64_t i = 0; i < sh.T; i++) {
      const int64_t a = lo[(size_t)(b * sh.T + i)], z = pos[(size_t)i];
      const bool none = a > z;
      seen.none |= none, seen.all |= a == 0 && z == sh.Tk - 1, seen.part |= !none && z - a + 1 < sh.Tk;
      tile[(size_t)(i / KTILE)] |= none ? 2 : 1, block[(size_t)(i / QROWS)] |= none ? 2 : 1;
      if (none)
        for (int64_t h = 0; h < sh.H; h++) rows.push_back((size_t)((b * sh.T + i) * sh.H + h));
    }
    for (int t : tile) seen.mixed_tile |= t == 3;
    for (int t : block) seen.mixed_block |= t == 3;
  }
  return rows;
}

/* the empty rows: the kernels' out and dq exactly 0 and lse -inf, as
 * want's; then both lse 0 there, so that the tolerances compare finite values */
template <typename T>
static void expect_empty(const char *what, const std::vector<size_t> &rows, Attn<T> &got, Want &want, const Shape &sh) {
  bool ok = true;
  for (size_t r : rows) {
    const size_t b = r / (size_t)(sh.T * sh.H), i = r / (size_t)sh.H % (size_t)sh.T, h = r % (size_t)sh.H;
    for (size_t c = 0; c < (size_t)sh.D; c++)
      ok = ok && ld(got.out.data(), (int64_t)(r * sh.D + c)) == 0 && ld(got.dq.data(), (int64_t)(r * sh.D + c)) == 0;
    float &gl = got.lse[(b * sh.H + h) * sh.T + i];
    double &wl = want.lse[(b * sh.H + h) * sh.T + i];
    ok = ok && gl == -INFINITY && wl == -INFINITY;
    gl = 0, wl = 0;
  }
  kit.expect(ok, what, ok ? 0 : 1, 0);
}

/* lo [B, Tq]; vs_op: against the CPU op too (the layout within its
 * contract, q_lo never falling along a run of rising positions, and keys
 * for it: it takes no NULL k, v) */
template <typename T>
static void check_pos_docs(const char *name, const std::vector<int32_t> &pos, const std::vector<int32_t> &lo, int64_t Tk,
                           int64_t H, int64_t Hkv, int64_t D, bool bf16, bool vs_op = true) {
  const int64_t B = 2, Tq = (int64_t)pos.size();
  Shape sh{B, Tq, H, Hkv, D, 1.0f / std::sqrt((float)D), Tk};
  sh.q_lo = lo.data();
  std::vector<T> q((size_t)(B * Tq * H * D)), dout(q.size()), k((size_t)(B * Tk * Hkv * D)), v(k.size());
  random_inputs(q, dout, k, v, (uint32_t)(D * 131 + Tq * 7 + Tk + H + (Tq ? lo[(size_t)Tq] : 0)));
  const std::vector<size_t> empty = empty_rows(pos, lo, sh);
  Attn<float> op;
  const bool by_op = vs_op && cpu_op(op, q, k, v, dout, pos, lo, sh);
  for (size_t r : empty)
    for (size_t c = 0; c < (size_t)D; c++) dout[r * D + c] = from<T>(NAN);
  Want want = reference(q, k, v, dout, pos, lo, sh);
  Attn<T> got = run_any<T, fsdp_attn::POS_DOCS_ROWS>(q, k, v, dout, pos.data(), sh);
  const Attn<T> plain = got;
  char what[192];
  snprintf(what, sizeof what, "%s, heads %lld/%lld, head_dim %lld, %s", bf16 ? "bf16" : "fp32", (long long)H,
           (long long)Hkv, (long long)D, name);
  if (!empty.empty()) {
    Attn<T> poisoned = got; /* the backward again, the empty rows of out and lse NaN */
    for (size_t r : empty) {
      const size_t b = r / (size_t)(Tq * H), i = r / (size_t)H % (size_t)Tq, h = r % (size_t)H;
      for (size_t c = 0; c < (size_t)D; c++) poisoned.out[r * D + c] = from<T>(NAN);
      poisoned.lse[(b * H + h) * Tq + i] = NAN;
    }
    run_any_backward<T, fsdp_attn::POS_DOCS_ROWS>(poisoned, q, k, v, dout, pos.data(), sh);
    got.dq = poisoned.dq, got.dk = poisoned.dk, got.dv = poisoned.dv;
    char u[240];
    snprintf(u, sizeof u, "%s: empty rows give out, dq 0 and lse -inf", what);
    expect_empty(u, empty, got, want, sh);
  }
  expect_attention(kit, what, got, want, bf16 ? 8e-3 : 5e-6, 5e-6);
  if (by_op) {
    char o[240];
    snprintf(o, sizeof o, "%s, vs the CPU op", what);
    expect_attention(kit, o, got, op, bf16 ? 8e-3 : 5e-6, 5e-6);
  }
  kit.expect(by_op == vs_op, "the layout within the CPU op's contract", by_op, 1);
  bool from0 = true;
  for (int32_t x : lo) from0 = from0 && x == 0;
  if (from0) { /* q_lo all 0: the bits of the _pos calls (q_lo NULL: from key 0) */
    Shape no_lo = sh;
    no_lo.q_lo = nullptr;
    const bool same = same_bits(plain, run_any<T, fsdp_attn::POS_DOCS_ROWS>(q, k, v, dout, pos.data(), no_lo));
    strncat(what, ": out, lse, dq, dk, dv bit for bit the _pos calls' (q_lo NULL)", sizeof what - strlen(what) - 1);
    kit.expect(same, what, same ? 0 : 1, 0);
  }
}

/* doc_start of a row of documents of the given lengths */
static std::vector<int32_t> doc_starts(const std::vector<int> &lens) {
  std::vector<int32_t> ds;
  for (int n : lens)
    for (int i = 0; i < n; i++) ds.push_back((int32_t)(ds.size() - (size_t)i));
  return ds;
}

/* rank r's global positions of a sequence of T in cp ranks: chunks r and 2 cp - 1 - r of 2 cp */
static std::vector<int32_t> cp_positions(int T, int cp, int r) {
  const int c = T / (2 * cp);
  std::vector<int32_t> g((size_t)(2 * c));
  for (int i = 0; i < c; i++) g[(size_t)i] = r * c + i, g[(size_t)(c + i)] = (2 * cp - 1 - r) * c + i;
  return g;
}

/* ring attention's step: rank r's queries against rank rk's block of keys
 * (kg, ascending), each row b's documents ds[b]: query at global g sees the
 * keys kg[j] in [ds[b][g], g], a run of the block: q_pos the last (-1:
 * none), q_lo the first (past q_pos: none) */
template <typename T>
static void check_ring(int T_, int cp, int r, int rk, const std::vector<std::vector<int32_t>> &ds, int64_t H, int64_t Hkv,
                       int64_t D, bool bf16) {
  const std::vector<int32_t> qg = cp_positions(T_, cp, r), kg = cp_positions(T_, cp, rk);
  const size_t Tq = qg.size();
  std::vector<int32_t> pos(Tq), lo(2 * Tq);
  auto below = [&](int32_t x) { /* the keys before global x */
    int32_t n = 0;
    for (int32_t g : kg) n += g < x;
    return n;
  };
  for (size_t i = 0; i < Tq; i++) {
    pos[i] = below(qg[i] + 1) - 1;
    for (size_t b = 0; b < 2; b++) lo[b * Tq + i] = below(ds[b][(size_t)qg[i]]);
  }
  char name[96];
  snprintf(name, sizeof name, "cp %d of T %d, rank %d's queries, rank %d's keys", cp, T_, r, rk);
  check_pos_docs<T>(name, pos, lo, (int64_t)kg.size(), H, Hkv, D, bf16);
}

template <typename T>
static void check_all(bool bf16) {
  /* the POS test's positions, q_lo all 0 */
  const std::vector<int32_t> any{39, 0, 5, 5, 6, 7, 3, 2, 39, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                                 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 1, 12};
  std::vector<int32_t> higher(70, -1), mixed{-1, -1, 3, 3, 4, 5, 5, 5, -1, 0, 0, 9};
  for (int i = 35; i < 70; i++) higher[(size_t)i] = 69;
  for (int i = 0; i < 30; i++) mixed.push_back(i < 20 ? 17 : -1);
  mixed.push_back(39);
  auto zeros = [](const std::vector<int32_t> &p) { return std::vector<int32_t>(2 * p.size(), 0); };
  /* documents of the two rows, cutting chunks of 35 and 17 at various places */
  const std::vector<std::vector<int32_t>> ds140{doc_starts({20, 50, 3, 40, 27}), doc_starts({1, 69, 35, 5, 30})},
      ds136{doc_starts({9, 30, 1, 40, 56}), doc_starts({17, 17, 60, 42})};
  /* one block: rows 0 .. 19 see keys 2 .. 12, rows 20 .. 39 keys 60 .. 69 (the tiles between seen by none) */
  std::vector<int32_t> gap(40), gap_lo(80);
  for (int i = 0; i < 40; i++) {
    gap[(size_t)i] = i < 20 ? 12 : 69;
    gap_lo[(size_t)i] = gap_lo[(size_t)(40 + i)] = i < 20 ? 2 : 60;
    if (i % 7 == 3) gap_lo[(size_t)(40 + i)] = gap[(size_t)i] + 1; /* and some rows of the second seeing none */
  }
  /* single keys at the edges of the key tiles and blocks in row 0 (q_lo =
   * q_pos): the first or last key of a tile or block that one query alone
   * sees, that query the first or last of its tile or block; in row 1 the
   * keys from half the position, or none */
  std::vector<int32_t> edge{0, 31, 63, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 64,
                            -1, 5, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 40,
                            69, 64, 63, 47, 48, 16, 15, -1};
  std::vector<int32_t> edge_lo(80, 0);
  for (size_t i = 0; i < 40; i++)
    if (edge[i] >= 0) edge_lo[i] = edge[i], edge_lo[40 + i] = i % 3 ? edge[i] / 2 : edge[i] + 1;
  /* the last row of a block alone sees its block's last keys (row 0) and
   * first keys (row 1) */
  std::vector<int32_t> alone(40, -1), alone_lo(80, 0);
  for (size_t i = 0; i < 32; i++) alone[i] = i < 31 ? 25 : 60, alone_lo[i] = alone_lo[40 + i] = i < 31 ? 20 : 50;
  alone_lo[40 + 31] = 0;
  /* any q_lo in [0, q_pos + 1], the positions in any order */
  std::vector<int32_t> any_lo(2 * any.size());
  uint32_t s = 7;
  for (size_t e = 0; e < any_lo.size(); e++) {
    const int32_t z = any[e % any.size()];
    any_lo[e] = (int32_t)((uint32_t)(rnd(s) * 1e6f + 1e6f) % (uint32_t)(z + 2));
  }
  for (int64_t D : {16, 64}) {
    check_pos_docs<T>("q_lo 0, cp 2 rank 1 of T 140", cp_positions(140, 2, 1), zeros(cp_positions(140, 2, 1)), 140, 4, 2,
                      D, bf16);
    check_pos_docs<T>("q_lo 0, positions in any order", any, zeros(any), 40, 4, 2, D, bf16);
    check_pos_docs<T>("q_lo 0, ring: the first c at -1, the rest at 2c - 1", higher, zeros(higher), 70, 4, 2, D, bf16);
    check_pos_docs<T>("q_lo 0, mixed runs of -1 and equal positions", mixed, zeros(mixed), 40, 4, 2, D, bf16);
    for (int r = 0; r < 2; r++)
      for (int rk = 0; rk < 2; rk++) check_ring<T>(140, 2, r, rk, ds140, 4, 2, D, bf16);
    check_pos_docs<T>("key ranges with a gap", gap, gap_lo, 70, 4, 2, D, bf16);
    check_pos_docs<T>("single keys at tile edges", edge, edge_lo, 70, 4, 2, D, bf16);
    check_pos_docs<T>("a block's last row alone seeing its first and last keys", alone, alone_lo, 70, 4, 2, D, bf16);
    check_pos_docs<T>("any q_lo, positions in any order", any, any_lo, 40, 2, 2, D, bf16, false);
  }
  for (int r = 0; r < 4; r++)
    for (int rk = 0; rk < 4; rk++) check_ring<T>(136, 4, r, rk, ds136, 2, 2, 16, bf16);
  check_pos_docs<T>("no keys (every row empty)", std::vector<int32_t>(5, -1), std::vector<int32_t>(10, 0), 0, 4, 2, 16,
                    bf16, false);
  check_pos_docs<T>("no queries", {}, {}, 40, 4, 2, 16, bf16);
}

int main() {
  check_all<float>(false);
  check_all<__nv_bfloat16>(true);
  kit.expect(seen.part && seen.all && seen.none, "the layouts have rows that see part of the block, all and none",
             seen.part + seen.all + seen.none, 3);
  kit.expect(seen.mixed_tile && seen.mixed_block, "the layouts have empty rows in tiles and blocks of rows that see keys",
             seen.mixed_tile + seen.mixed_block, 2);
  return kit.finish();
}
