// attention.cuh: the fp32 CUDA-core attention kernels (attention.cu says
// what they compute), the source nvcc (attention.cu) and
// tests/emu/test_attention_docs_emu.cpp share.
//
// DOCS (packed rows, doc_start [B, T] not NULL): query i sees keys
// doc_start[i] .. i alone. A query block's key loop starts at its first
// row's doc_start (the earliest of the block: doc_start never decreases
// along a row), a key block's query loop ends at the first query whose
// doc_start passes the block's last key, and the keys between are masked
// per row; so a row of short documents costs less than a causal one.
// POS_DOCS (queries at given positions, q_pos [T] as `rows`, each from a
// first key, sh.q_lo [B, T]; context parallelism, issue 46): the T queries
// sit at positions q_pos[i] of the sh.Tk keys, and query i of row b sees
// keys q_lo[b, i] .. q_pos[i] (q_lo NULL: 0 .. q_pos[i], the _pos calls; a
// q_lo: packed rows). At q_pos -1 or q_lo = q_pos + 1 (ring attention's
// rows that see none of a block) it sees none: out 0, lse -inf, dq 0, and
// nothing to dk, dv (its dout, out, lse unread). q_lo need not rise along
// the queries (a rank's two chunks), so a query block's key loop runs from
// its rows' smallest q_lo to their largest q_pos (those of rows that see a
// key), skipping the tiles of keys no row of it sees; a key block's query
// loop skips the tiles of queries none of which sees one of its keys; the
// keys between are masked per row; dk, dv are the whole block's, sh.Tk rows.
// (The _pos calls once had kernels of their own, without q_lo: the same
// bits, and as many again for nvcc to build.)
// The template's ROWS picks the variant: CAUSAL (or false), DOCS_ROWS (or
// true) or POS_DOCS_ROWS; CAUSAL compiles to the causal kernels, unchanged.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, __expf, __syncthreads, and FSDP_ATTN_SHARED(name), the
// block's dynamic shared memory as float *name.
#ifndef FSDP_KERNELS_ATTENTION_CUH
#define FSDP_KERNELS_ATTENTION_CUH

namespace fsdp_attn {

enum { QROWS = 32, KTILE = 16 };
enum { CAUSAL = 0, DOCS_ROWS = 1, POS_DOCS_ROWS = 3 };  // ROWS (a bool DOCS converts to the first two)

struct Shape {
  int64_t B, T, H, Hkv, D;
  float scale;
  int64_t Tk;                     // POS_DOCS: the keys (k, v, dk, dv rows); else T
  const int32_t *q_lo = nullptr;  // POS_DOCS: each query's first key [B, T] (device memory), or NULL: 0
};

// rows [r0, r0 + R) of head h of one or two [B, rows, heads, D] tensors
// into shared memory (row pitch `pitch`), zeros past the sequence's end;
// the block's QROWS threads share the copy
template <typename T>
__device__ void load_rows(float *d1, const T *s1, float *d2, const T *s2, int pitch, int64_t b, int64_t r0, int R,
                          int64_t heads, int64_t h, int64_t rows, const Shape &sh) {
  const int D = (int)sh.D;
  for (int e = threadIdx.x; e < R * D; e += QROWS) {
    int r = e / D, c = e % D;
    int64_t t = r0 + r;
    size_t off = ((b * rows + t) * heads + h) * D + c;
    d1[r * pitch + c] = t < rows ? ld(s1, off) : 0.0f;
    if (d2) d2[r * pitch + c] = t < rows ? ld(s2, off) : 0.0f;
  }
}

// POS_DOCS: query i's first key, q_lo (lo, the batch row's) or 0 where
// there is none (the _pos calls: every query from the sequence's first key)
__device__ inline int64_t first_of(const int32_t *lo, int64_t i) { return lo ? lo[i] : 0; }

// POS_DOCS: whether one of queries i0 .. i0 + n - 1 (those inside T) sees
// a key of [a, z]: max(lo[i], a) <= min(q_pos[i], z), lo the batch row's
// q_lo (every thread the same)
__device__ inline bool sees_any(const int32_t *q_pos, const int32_t *lo, int64_t i0, int64_t n, int64_t T, int64_t a,
                                int64_t z) {
  for (int64_t i = i0; i < i0 + n && i < T; i++) {
    const int64_t f = first_of(lo, i);
    if ((f > a ? f : a) <= (q_pos[i] < z ? q_pos[i] : z)) return true;
  }
  return false;
}

// the last key a block of QROWS queries from i0 sees (every thread the
// same); POS_DOCS also sets its first, the smallest q_lo (ds, the batch
// row's) of the rows that see a key, to the largest q_pos of those (first
// 0, last -1 where none does)
template <int ROWS>
__device__ inline int64_t last_key(const int32_t *rows, const int32_t *ds, int64_t i0, const Shape &sh, int64_t &first) {
  if (ROWS != POS_DOCS_ROWS) return i0 + QROWS - 1 < sh.T - 1 ? i0 + QROWS - 1 : sh.T - 1;
  int64_t f = INT64_MAX, l = -1;
  for (int64_t i = i0; i < i0 + QROWS && i < sh.T; i++)
    if (first_of(ds, i) <= rows[i]) {
      f = first_of(ds, i) < f ? first_of(ds, i) : f;
      l = rows[i] > l ? rows[i] : l;
    }
  first = l < 0 ? 0 : f;
  return l;
}

// rows: doc_start [B, T] (DOCS), q_pos [T] (POS_DOCS), unused (CAUSAL)
// smem: QROWS * (D + 1) + 2 * KTILE * D floats
template <typename T, int MAXD, int ROWS>
__global__ void attn_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *rows, Shape sh) {
  constexpr bool DOCS = ROWS == DOCS_ROWS, POS_DOCS = ROWS == POS_DOCS_ROWS;
  constexpr bool AT = POS_DOCS, FROM = DOCS || POS_DOCS;  // queries at positions; a first key per row
  FSDP_ATTN_SHARED(smem);
  const int D = (int)sh.D, P = D + 1;
  float *qs = smem;                     // [QROWS][P]
  float *ks = qs + QROWS * P;           // [KTILE][D]
  float *vs = ks + KTILE * D;           // [KTILE][D]
  int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * QROWS;
  int64_t hk = h / (sh.H / sh.Hkv);
  int tid = threadIdx.x;
  int64_t i = i0 + tid;
  const int32_t *ds = DOCS ? rows + b * sh.T : POS_DOCS && sh.q_lo ? sh.q_lo + b * sh.T : nullptr;  // the rows' first keys
  int64_t first = DOCS ? ds[i0] : 0;                                                   // the block's first key
  const int64_t lo = FROM && i < sh.T ? first_of(ds, i) : 0;                           // this row's
  const int64_t Tk = AT ? sh.Tk : sh.T, pi = AT && i < sh.T ? rows[i] : i;  // this row's position: its last key
  load_rows(qs, q, (float *)nullptr, (const T *)nullptr, P, b, i0, QROWS, sh.H, h, sh.T, sh);
  float acc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) acc[c] = 0;
  float m = -INFINITY, l = 0;
  const int64_t last = last_key<ROWS>(rows, ds, i0, sh, first);
  for (int64_t j0 = first; j0 <= last; j0 += KTILE) {
    if (POS_DOCS && !sees_any(rows, ds, i0, QROWS, sh.T, j0, j0 + KTILE - 1)) continue;  // (every thread alike)
    __syncthreads();
    load_rows(ks, k, vs, v, D, b, j0, KTILE, sh.Hkv, hk, Tk, sh);
    __syncthreads();
    if (i >= sh.T) continue;
    for (int r = 0; r < KTILE; r++) {
      int64_t j = j0 + r;
      if (j > pi) break;
      if (FROM && j < lo) continue;
      float sdot = 0;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) sdot += qs[tid * P + c] * ks[r * D + c];
      sdot *= sh.scale;
      float mn = fmaxf(m, sdot), corr = __expf(m - mn), p = __expf(sdot - mn);
      l = l * corr + p;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) acc[c] = acc[c] * corr + p * vs[r * D + c];
      m = mn;
    }
  }
  if (i < sh.T) {
    // q_lo past q_pos (q_pos -1 among them): no key, m -inf and l = 0
    // (acc 0): out 0 and lse -inf, not 0 / 0
    const bool none = POS_DOCS && lo > pi;
    float inv = none ? 0.0f : 1.0f / l;
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) st(out, ((b * sh.T + i) * sh.H + h) * D + c, acc[c] * inv);
    lse[(b * sh.H + h) * sh.T + i] = none ? -INFINITY : m + logf(l);
  }
}

// dq_i = scale sum_j p_ij (dp_ij - Di) k_j, dp_ij = dout_i . v_j, Di = dout_i . out_i
// smem: 2 * QROWS * (D + 1) + 2 * KTILE * D floats
template <typename T, int MAXD, int ROWS>
__global__ void attn_bwd_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const T *out, const float *lse,
                            const int32_t *rows, Shape sh) {
  constexpr bool DOCS = ROWS == DOCS_ROWS, POS_DOCS = ROWS == POS_DOCS_ROWS;
  constexpr bool AT = POS_DOCS, FROM = DOCS || POS_DOCS;  // queries at positions; a first key per row
  FSDP_ATTN_SHARED(smem);
  const int D = (int)sh.D, P = D + 1;
  float *qs = smem, *dos = qs + QROWS * P, *ks = dos + QROWS * P, *vs = ks + KTILE * D;
  int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * QROWS;
  int64_t hk = h / (sh.H / sh.Hkv);
  int tid = threadIdx.x;
  int64_t i = i0 + tid;
  const int32_t *ds = DOCS ? rows + b * sh.T : POS_DOCS && sh.q_lo ? sh.q_lo + b * sh.T : nullptr;  // as in attn_fwd
  int64_t first = DOCS ? ds[i0] : 0;
  const int64_t lo = FROM && i < sh.T ? first_of(ds, i) : 0;
  const int64_t Tk = AT ? sh.Tk : sh.T, pi = AT && i < sh.T ? rows[i] : i;
  load_rows(qs, q, dos, dout, P, b, i0, QROWS, sh.H, h, sh.T, sh);
  __syncthreads();
  float Di = 0, L = 0;
  if (i < sh.T) {
    for (int c = 0; c < D; c++) Di += dos[tid * P + c] * ld(out, ((b * sh.T + i) * sh.H + h) * D + c);
    L = lse[(b * sh.H + h) * sh.T + i];
  }
  float acc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) acc[c] = 0;
  const int64_t last = last_key<ROWS>(rows, ds, i0, sh, first);
  for (int64_t j0 = first; j0 <= last; j0 += KTILE) {
    if (POS_DOCS && !sees_any(rows, ds, i0, QROWS, sh.T, j0, j0 + KTILE - 1)) continue;  // (every thread alike)
    __syncthreads();
    load_rows(ks, k, vs, v, D, b, j0, KTILE, sh.Hkv, hk, Tk, sh);
    __syncthreads();
    if (i >= sh.T) continue;
    for (int r = 0; r < KTILE; r++) {
      int64_t j = j0 + r;
      if (j > pi) break;
      if (FROM && j < lo) continue;
      float sdot = 0, dp = 0;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) {
          sdot += qs[tid * P + c] * ks[r * D + c];
          dp += dos[tid * P + c] * vs[r * D + c];
        }
      float p = __expf(sdot * sh.scale - L), ds_ = p * (dp - Di) * sh.scale;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) acc[c] += ds_ * ks[r * D + c];
    }
  }
  if (i < sh.T) {
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) st(dq, ((b * sh.T + i) * sh.H + h) * D + c, acc[c]);
  }
}

// dv_j = sum_{h in group, i >= j} p_ij dout_i;  dk_j = scale sum p_ij (dp_ij - Di) q_i
// (POS_DOCS: over the queries i whose position is at or past j and whose
// q_lo is at or before j); a block of QROWS keys (POS_DOCS: of sh.Tk)
// smem: 3 * QROWS * (D + 1) + 2 * KTILE * D + 2 * KTILE floats (DOCS,
// POS_DOCS: + KTILE; POS_DOCS reads q_lo where it tests it, from global
// memory: the same address across the block, a single warp)
template <typename T, int MAXD, int ROWS>
__global__ void attn_bwd_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *out,
                             const float *lse, const int32_t *rows, Shape sh) {
  constexpr bool DOCS = ROWS == DOCS_ROWS, POS_DOCS = ROWS == POS_DOCS_ROWS;
  constexpr bool AT = POS_DOCS;  // queries at positions
  FSDP_ATTN_SHARED(smem);
  const int D = (int)sh.D, P = D + 1;
  float *ks = smem, *vs = ks + QROWS * P, *dks = vs + QROWS * P;  // this block's key rows [QROWS][P]
  float *qt = dks + QROWS * P, *dot = qt + KTILE * D;             // a tile of query rows [KTILE][D]
  float *Lt = dot + KTILE * D, *Dt = Lt + KTILE;                   // their lse and Di
  int32_t *St = (int32_t *)(Dt + KTILE);                           // DOCS: their doc_start; POS_DOCS: positions
  int64_t b = blockIdx.z, hk = blockIdx.y, j0 = (int64_t)blockIdx.x * QROWS;
  int64_t group = sh.H / sh.Hkv;
  int tid = threadIdx.x;
  int64_t j = j0 + tid;
  const int32_t *ds = DOCS ? rows + b * sh.T : POS_DOCS && sh.q_lo ? sh.q_lo + b * sh.T : nullptr;
  const int64_t Tk = AT ? sh.Tk : sh.T;
  // causal: queries j0 .. T - 1; POS_DOCS: all T, a tile skipped
  // where none of its rows sees a key of this block (a row that sees none
  // is masked below too: q_pos < j or q_lo > j for every j); DOCS: up to
  // the first whose document starts past this block's last key (queries
  // i <= that key start at or before it, doc_start[i] <= i, so the search
  // starts after it)
  int64_t iend = sh.T;
  const int64_t jl = j0 + QROWS - 1 < Tk - 1 ? j0 + QROWS - 1 : Tk - 1;  // the block's last key
  if (DOCS) {
    int64_t a = jl + 1, e = sh.T;
    while (a < e) {
      const int64_t mid = a + (e - a) / 2;
      if (ds[mid] > jl) e = mid;
      else a = mid + 1;
    }
    iend = a;
  }
  load_rows(ks, k, vs, v, P, b, j0, QROWS, sh.Hkv, hk, Tk, sh);
  for (int e = tid; e < QROWS * P; e += QROWS) dks[e] = 0;
  float dvacc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) dvacc[c] = 0;
  for (int64_t g = 0; g < group; g++) {
    int64_t h = hk * group + g;
    for (int64_t i0 = AT ? 0 : j0; i0 < iend; i0 += KTILE) {
      if (POS_DOCS && !sees_any(rows, ds, i0, KTILE, sh.T, j0, jl)) continue;
      __syncthreads();
      load_rows(qt, q, dot, dout, D, b, i0, KTILE, sh.H, h, sh.T, sh);
      if (tid < KTILE) {
        int64_t ii = i0 + tid;
        float Di = 0;
        if (ii < sh.T)
          for (int c = 0; c < D; c++) Di += ld(dout, ((b * sh.T + ii) * sh.H + h) * D + c) * ld(out, ((b * sh.T + ii) * sh.H + h) * D + c);
        Dt[tid] = Di;
        Lt[tid] = ii < sh.T ? lse[(b * sh.H + h) * sh.T + ii] : 0.0f;
        if (DOCS) St[tid] = ii < sh.T ? ds[ii] : 0;
        if (AT) St[tid] = ii < sh.T ? rows[ii] : -1;
      }
      __syncthreads();
      if (j >= Tk) continue;
      for (int r = 0; r < KTILE; r++) {
        int64_t ii = i0 + r;
        if (ii >= sh.T) break;
        if ((AT ? St[r] : ii) < j) continue;
        if (DOCS && St[r] > j) continue;
        if (POS_DOCS && first_of(ds, ii) > j) continue;
        float sdot = 0, dp = 0;
#pragma unroll
        for (int c = 0; c < MAXD; c++)
          if (c < D) {
            sdot += qt[r * D + c] * ks[tid * P + c];
            dp += dot[r * D + c] * vs[tid * P + c];
          }
        float p = __expf(sdot * sh.scale - Lt[r]), ds_ = p * (dp - Dt[r]) * sh.scale;
#pragma unroll
        for (int c = 0; c < MAXD; c++)
          if (c < D) {
            dvacc[c] += p * dot[r * D + c];
            dks[tid * P + c] += ds_ * qt[r * D + c];
          }
      }
    }
  }
  if (j < Tk) {
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) {
        size_t off = ((b * Tk + j) * sh.Hkv + hk) * D + c;
        st(dv, off, dvacc[c]);
        st(dk, off, dks[tid * P + c]);
      }
  }
}

}  // namespace fsdp_attn

#endif
