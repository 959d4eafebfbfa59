// attention_cached.cuh: generation's attention against a KV cache (the
// CUDA twin of src/ops/attention_cached.c), the source nvcc
// (attention_cached.cu) and tests/emu/test_attention_cached_emu.cpp share.
//
// One block per query row (batch, query, head). The keys go in chunks of
// CACHED_CHUNK: each thread scores some of a chunk's keys against the row's
// query (held in shared memory in fp32), the block takes the chunk's max,
// the running sums and the output (each thread owns head_dim / blockDim
// of its elements, at most CACHED_DIMS) are rescaled when the max rises,
// and each thread adds its elements' share of the chunk's values. fp32
// arithmetic over fp32 or bf16 storage. A decoded token is a few rows per
// layer reading the whole cache once: memory-bound, as the CPU op is.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, __expf, __shfl_xor_sync, __syncthreads, and
// FSDP_CACHED_SHARED(name), the block's dynamic shared memory:
// (head_dim + CACHED_CHUNK + 32) floats.
#ifndef FSDP_KERNELS_ATTENTION_CACHED_CUH
#define FSDP_KERNELS_ATTENTION_CACHED_CUH

namespace fsdp_cached {

enum { CACHED_CHUNK = 256, CACHED_DIMS = 4 };

/* every thread gets the block's max (sum: 0) or sum (1) of v; part: 32 floats */
__device__ __forceinline__ float block_reduce(float v, float *part, int sum) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = sum ? v + w : fmaxf(v, w);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads(); /* the previous reduction has read part */
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : (sum ? 0.0f : -INFINITY);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = sum ? v + w : fmaxf(v, w);
  }
  return v;
}

// q, out [B, tq, H, D]; caches [B, cap, Hkv, D]; grid: B * tq * H blocks;
// blockDim.x a multiple of 32 with D <= CACHED_DIMS * blockDim.x
template <typename T>
__global__ void attention_cached_kernel(T *out, const T *q, const T *kc, const T *vc, int64_t tq, int64_t pos, int64_t cap,
                                        int64_t H, int64_t Hkv, int64_t D, float scale) {
  FSDP_CACHED_SHARED(smem);
  float *qs = (float *)smem, *s = qs + D, *part = s + CACHED_CHUNK;
  const int64_t r = blockIdx.x, h = r % H, bi = r / H, i = bi % tq, b = bi / tq;
  const int64_t kh = h / (H / Hkv), seen = pos + i + 1, stride = Hkv * D;
  const T *kb = kc + (b * cap * Hkv + kh) * D, *vb = vc + (b * cap * Hkv + kh) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qs[d] = ld(q + r * D, d);
  float acc[CACHED_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
  float mx = -INFINITY, sum = 0.0f;
  __syncthreads();
  for (int64_t t0 = 0; t0 < seen; t0 += CACHED_CHUNK) {
    const int64_t n = seen - t0 < (int64_t)CACHED_CHUNK ? seen - t0 : (int64_t)CACHED_CHUNK;
    float cmx = -INFINITY;
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
      const T *k = kb + (t0 + t) * stride;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; d++) dot += qs[d] * ld(k, d);
      s[t] = dot * scale;
      cmx = fmaxf(cmx, s[t]);
    }
    cmx = block_reduce(cmx, part, 0); /* (its barriers also publish s) */
    if (cmx > mx) { /* the sums so far were taken from a smaller max */
      const float c = __expf(mx - cmx);
      sum *= c;
      for (int k = 0; k < CACHED_DIMS; k++) acc[k] *= c;
      mx = cmx;
    }
    float ps = 0.0f;
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x) ps += (s[t] = __expf(s[t] - mx));
    sum += block_reduce(ps, part, 1); /* (its barriers also publish the weights) */
    for (int k = 0; k < CACHED_DIMS; k++) {
      const int64_t d = threadIdx.x + (int64_t)k * blockDim.x;
      if (d >= D) break;
      float a = 0.0f;
      for (int64_t t = 0; t < n; t++) a += s[t] * ld(vb + (t0 + t) * stride, d);
      acc[k] += a;
    }
    __syncthreads(); /* every thread has read s before the next chunk's scores */
  }
  for (int k = 0; k < CACHED_DIMS; k++) {
    const int64_t d = threadIdx.x + (int64_t)k * blockDim.x;
    if (d < D) st(out + r * D, d, acc[k] / sum);
  }
}

}  // namespace fsdp_cached

#endif
