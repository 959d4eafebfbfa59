// attention_tc.cuh: the tensor-core attention kernels themselves (their
// launchers are in attention_tc.cu). A header so that two builds share one
// source: nvcc's, and tests/emu/test_attention_tc_emu.cpp, which runs the
// same code on the CPU under an emulation of the warp, its barriers and
// WMMA fragments (tests/emu/cuda_emu.h), against a float64 reference, so
// that the kernels' tiling and indexing are checked in every CI run even
// without a GPU. The includer provides: bf16 (__nv_bfloat16) with its
// conversions, the wmma namespace, and FSDP_TC_SHARED(name), the block's
// dynamic shared memory as `unsigned char name[]`.
#ifndef FSDP_KERNELS_ATTENTION_TC_CUH
#define FSDP_KERNELS_ATTENTION_TC_CUH

namespace fsdp_tc {

typedef __nv_bfloat16 bf16;
constexpr int WARPS = 4, THREADS = 32 * WARPS;
constexpr int BR = 64;   // query rows per block (forward, dq)
constexpr int BC = 64;   // key rows per tile (forward, dq) and per block (dk, dv)
constexpr int BQ = 32;   // query rows per tile (dk, dv)
constexpr int LS = BC + 4, LP = BC + 8;   // pitches of a warp's scores (fp32) and probabilities (bf16)
constexpr int LQS = BQ + 4, LQP = BQ + 8; // the same for the dk, dv kernel's narrower tiles

struct Geo {
  int64_t B, T, H, Hkv;
  float scale;
};

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ARow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> BRow;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> BCol;

// rows [r0, r0 + R) of head h of a [B, T, heads, D] tensor into shared
// memory (pitch D + 8), 16 bytes at a time, zeros past the sequence's end
template <int D>
__device__ void load_tile(bf16 *dst, const bf16 *src, int64_t b, int64_t r0, int R, int64_t heads, int64_t h,
                          int64_t T) {
  constexpr int V = D / 8;
  for (int e = threadIdx.x; e < R * V; e += THREADS) {
    int r = e / V, c = (e % V) * 8;
    int64_t t = r0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (t < T) val = *reinterpret_cast<const uint4 *>(src + ((b * T + t) * heads + h) * D + c);
    *reinterpret_cast<uint4 *>(dst + r * (D + 8) + c) = val;
  }
}

// C[16 x 16*NB] = A[16 x K] B[K x 16*NB] for one warp: A row-major (pitch
// lda), B row-major (pitch ldb) or, with BT, B^T stored row-major (B's
// column n is row n of b, pitch ldb); C fp32 row-major (pitch ldc),
// accumulated into when acc is set
template <int K, int NB, bool BT>
__device__ void warp_gemm(float *c, int ldc, const bf16 *a, int lda, const bf16 *b, int ldb, bool acc) {
  for (int nb = 0; nb < NB; nb++) {
    Acc f;
    if (acc) wmma::load_matrix_sync(f, c + nb * 16, ldc, wmma::mem_row_major);
    else wmma::fill_fragment(f, 0.0f);
    for (int kk = 0; kk < K / 16; kk++) {
      ARow fa;
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      if (BT) {
        BCol fb;
        wmma::load_matrix_sync(fb, b + (nb * 16) * ldb + kk * 16, ldb);
        wmma::mma_sync(f, fa, fb, f);
      } else {
        BRow fb;
        wmma::load_matrix_sync(fb, b + (kk * 16) * ldb + nb * 16, ldb);
        wmma::mma_sync(f, fa, fb, f);
      }
    }
    wmma::store_matrix_sync(c + nb * 16, f, ldc, wmma::mem_row_major);
  }
}

__device__ __forceinline__ float pair_max(float v) { return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); }
__device__ __forceinline__ float pair_sum(float v) { return v + __shfl_xor_sync(0xffffffffu, v, 1); }

template <int D>
constexpr size_t fwd_smem() {
  return 3 * BR * (D + 8) * 2 + WARPS * 16 * (LS * 4 + (D + 4) * 4 + LP * 2);
}
template <int D>
constexpr size_t dq_smem() {
  return 4 * BR * (D + 8) * 2 + WARPS * 16 * (2 * LS * 4 + LP * 2 + (D + 4) * 4);
}
template <int D>
constexpr size_t dkv_smem() {
  return 2 * BC * (D + 8) * 2 + 2 * BQ * (D + 8) * 2 + 2 * BQ * 4 + WARPS * 16 * (2 * LQS * 4 + 2 * LQP * 2 + 2 * (D + 4) * 4);
}

template <int D>
__global__ void __launch_bounds__(THREADS) fa_fwd(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, Geo g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LD = D + 8, LO = D + 4;
  FSDP_TC_SHARED(smem);
  bf16 *Qs = reinterpret_cast<bf16 *>(smem), *Ks = Qs + BR * LD, *Vs = Ks + BC * LD;
  float *Sall = reinterpret_cast<float *>(Vs + BC * LD), *Oall = Sall + WARPS * 16 * LS;
  bf16 *Pall = reinterpret_cast<bf16 *>(Oall + WARPS * 16 * LO);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  float *Sw = Sall + warp * 16 * LS, *Ow = Oall + warp * 16 * LO;
  bf16 *Pw = Pall + warp * 16 * LP;
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * BR, hk = h / (g.H / g.Hkv);
  const int64_t i = i0 + warp * 16 + r; // this lane pair's query row
  load_tile<D>(Qs, q, b, i0, BR, g.H, h, g.T);
  for (int e = lane; e < 16 * LO; e += 32) Ow[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t last = (i0 + BR < g.T ? i0 + BR : g.T) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += BC) {
    __syncthreads(); // every warp is done with the previous tiles
    load_tile<D>(Ks, k, b, j0, BC, g.Hkv, hk, g.T);
    load_tile<D>(Vs, v, b, j0, BC, g.Hkv, hk, g.T);
    __syncthreads();
    warp_gemm<D, BC / 16, true>(Sw, LS, Qs + warp * 16 * LD, LD, Ks, LD, false); // S = Q K^T
    __syncwarp();
    float s[32], mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; c++) {
      int col = half * 32 + c;
      int64_t j = j0 + col;
      s[c] = j <= i && j < g.T ? Sw[r * LS + col] * g.scale : -INFINITY;
      mx = fmaxf(mx, s[c]);
    }
    float mnew = fmaxf(m, pair_max(mx));
    float ref = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing yet: exp(-inf) = 0, no NaN
    float alpha = __expf(m - ref), sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 32; c++) {
      float p = __expf(s[c] - ref);
      sum += p;
      Pw[r * LP + half * 32 + c] = __float2bfloat16_rn(p);
    }
    l = l * alpha + pair_sum(sum);
    m = mnew;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) Ow[r * LO + c] *= alpha;
    __syncwarp();
    warp_gemm<BC, D / 16, false>(Ow, LO, Pw, LP, Vs, LD, true); // O += P V
    __syncwarp();
  }
  if (i < g.T) {
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++)
      out[((b * g.T + i) * g.H + h) * D + c] = __float2bfloat16_rn(Ow[r * LO + c] * inv);
    if (half == 0) lse[(b * g.H + h) * g.T + i] = m + logf(l);
  }
#endif
}

// delta[b, h, t] = dout . out over the head's D values: a warp per row
__global__ void fa_delta(float *delta, const bf16 *out, const bf16 *dout, Geo g, int D) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; // (b T + t) H + h
  int lane = threadIdx.x % 32;
  if (row >= g.B * g.T * g.H) return;
  float s = 0.0f;
  for (int c = lane; c < D; c += 32) s += __bfloat162float(out[row * D + c]) * __bfloat162float(dout[row * D + c]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) {
    int64_t h = row % g.H, t = (row / g.H) % g.T, b = row / (g.H * g.T);
    delta[(b * g.H + h) * g.T + t] = s;
  }
}

// dq_i = scale sum_j p_ij (dp_ij - Delta_i) k_j
template <int D>
__global__ void __launch_bounds__(THREADS) fa_dq(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                                 const float *lse, const float *delta, Geo g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LD = D + 8, LO = D + 4;
  FSDP_TC_SHARED(smem);
  bf16 *Qs = reinterpret_cast<bf16 *>(smem), *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD;
  float *Sall = reinterpret_cast<float *>(Vs + BC * LD), *DPall = Sall + WARPS * 16 * LS;
  bf16 *dSall = reinterpret_cast<bf16 *>(DPall + WARPS * 16 * LS);
  float *dQall = reinterpret_cast<float *>(dSall + WARPS * 16 * LP);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  float *Sw = Sall + warp * 16 * LS, *DPw = DPall + warp * 16 * LS, *dQw = dQall + warp * 16 * LO;
  bf16 *dSw = dSall + warp * 16 * LP;
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * BR, hk = h / (g.H / g.Hkv);
  const int64_t i = i0 + warp * 16 + r;
  load_tile<D>(Qs, q, b, i0, BR, g.H, h, g.T);
  load_tile<D>(dOs, dout, b, i0, BR, g.H, h, g.T);
  for (int e = lane; e < 16 * LO; e += 32) dQw[e] = 0.0f;
  const float L = i < g.T ? lse[(b * g.H + h) * g.T + i] : 0.0f, Di = i < g.T ? delta[(b * g.H + h) * g.T + i] : 0.0f;
  const int64_t last = (i0 + BR < g.T ? i0 + BR : g.T) - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += BC) {
    __syncthreads();
    load_tile<D>(Ks, k, b, j0, BC, g.Hkv, hk, g.T);
    load_tile<D>(Vs, v, b, j0, BC, g.Hkv, hk, g.T);
    __syncthreads();
    warp_gemm<D, BC / 16, true>(Sw, LS, Qs + warp * 16 * LD, LD, Ks, LD, false);   // S = Q K^T
    warp_gemm<D, BC / 16, true>(DPw, LS, dOs + warp * 16 * LD, LD, Vs, LD, false); // dP = dO V^T
    __syncwarp();
    for (int c = 0; c < 32; c++) {
      int col = half * 32 + c;
      int64_t j = j0 + col;
      float p = j <= i && j < g.T && i < g.T ? __expf(Sw[r * LS + col] * g.scale - L) : 0.0f;
      dSw[r * LP + col] = __float2bfloat16_rn(p * (DPw[r * LS + col] - Di) * g.scale);
    }
    __syncwarp();
    warp_gemm<BC, D / 16, false>(dQw, LO, dSw, LP, Ks, LD, true); // dQ += dS K
    __syncwarp();
  }
  if (i < g.T)
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++)
      dq[((b * g.T + i) * g.H + h) * D + c] = __float2bfloat16_rn(dQw[r * LO + c]);
#endif
}

// dv_j = sum_{h in group, i >= j} p_ij dout_i;  dk_j = scale sum p_ij (dp_ij - Delta_i) q_i
template <int D>
__global__ void __launch_bounds__(THREADS) fa_dkv(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                                                  const bf16 *v, const float *lse, const float *delta, Geo g) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int LD = D + 8, LO = D + 4;
  FSDP_TC_SHARED(smem);
  bf16 *Ks = reinterpret_cast<bf16 *>(smem), *Vs = Ks + BC * LD, *Qs = Vs + BC * LD, *dOs = Qs + BQ * LD;
  float *Ls = reinterpret_cast<float *>(dOs + BQ * LD), *Ds = Ls + BQ;
  float *Sall = Ds + BQ, *DPall = Sall + WARPS * 16 * LQS;
  bf16 *Pall = reinterpret_cast<bf16 *>(DPall + WARPS * 16 * LQS), *dSall = Pall + WARPS * 16 * LQP;
  float *dKall = reinterpret_cast<float *>(dSall + WARPS * 16 * LQP), *dVall = dKall + WARPS * 16 * LO;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane >> 1, half = lane & 1;
  float *Sw = Sall + warp * 16 * LQS, *DPw = DPall + warp * 16 * LQS;
  float *dKw = dKall + warp * 16 * LO, *dVw = dVall + warp * 16 * LO;
  bf16 *Pw = Pall + warp * 16 * LQP, *dSw = dSall + warp * 16 * LQP;
  const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = (int64_t)blockIdx.x * BC, group = g.H / g.Hkv;
  const int64_t jw = j0 + warp * 16, j = jw + r; // this warp's first key row, this lane pair's
  load_tile<D>(Ks, k, b, j0, BC, g.Hkv, hk, g.T);
  load_tile<D>(Vs, v, b, j0, BC, g.Hkv, hk, g.T);
  for (int e = lane; e < 16 * LO; e += 32) dKw[e] = dVw[e] = 0.0f;
  for (int64_t gi = 0; gi < group; gi++) {
    const int64_t h = hk * group + gi;
    for (int64_t i0 = j0; i0 < g.T; i0 += BQ) { // causal: only queries i >= j (j0 is a multiple of BQ)
      __syncthreads();
      load_tile<D>(Qs, q, b, i0, BQ, g.H, h, g.T);
      load_tile<D>(dOs, dout, b, i0, BQ, g.H, h, g.T);
      if (threadIdx.x < BQ) {
        int64_t ii = i0 + threadIdx.x;
        Ls[threadIdx.x] = ii < g.T ? lse[(b * g.H + h) * g.T + ii] : 0.0f;
        Ds[threadIdx.x] = ii < g.T ? delta[(b * g.H + h) * g.T + ii] : 0.0f;
      }
      __syncthreads();
      if (i0 + BQ - 1 < jw) continue; // every query of the tile is before this warp's keys
      warp_gemm<D, BQ / 16, true>(Sw, LQS, Ks + warp * 16 * LD, LD, Qs, LD, false);   // S^T = K Q^T
      warp_gemm<D, BQ / 16, true>(DPw, LQS, Vs + warp * 16 * LD, LD, dOs, LD, false); // dP^T = V dO^T
      __syncwarp();
      for (int c = 0; c < BQ / 2; c++) {
        int col = half * (BQ / 2) + c;
        int64_t ii = i0 + col;
        float p = ii >= j && ii < g.T && j < g.T ? __expf(Sw[r * LQS + col] * g.scale - Ls[col]) : 0.0f;
        Pw[r * LQP + col] = __float2bfloat16_rn(p);
        dSw[r * LQP + col] = __float2bfloat16_rn(p * (DPw[r * LQS + col] - Ds[col]) * g.scale);
      }
      __syncwarp();
      warp_gemm<BQ, D / 16, false>(dVw, LO, Pw, LQP, dOs, LD, true); // dV += P^T dO
      warp_gemm<BQ, D / 16, false>(dKw, LO, dSw, LQP, Qs, LD, true); // dK += dS^T Q
      __syncwarp();
    }
  }
  if (j < g.T)
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) {
      size_t off = ((b * g.T + j) * g.Hkv + hk) * D + c;
      dk[off] = __float2bfloat16_rn(dKw[r * LO + c]);
      dv[off] = __float2bfloat16_rn(dVw[r * LO + c]);
    }
#endif
}

}  // namespace fsdp_tc

#endif
