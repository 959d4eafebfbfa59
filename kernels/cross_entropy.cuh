// cross_entropy.cuh: the fused cross-entropy kernel's source, shared by
// nvcc (cross_entropy.cu) and tests/emu/test_cross_entropy_emu.cpp, which
// runs it on the CPU under tests/emu/cuda_emu.h against float64.
//
// One block per row, two passes over the row instead of three: the max and
// the sum of exponentials together (an online softmax: each thread keeps
// its running max m and sum s of exp(x - m), merged across the block), then
// the gradient written over the logits in the same storage. Both passes
// read 16 bytes per load (8 bf16 or 4 fp32) between a scalar head and tail,
// so rows at any alignment work. The H100 run of 2026-11-24 measured the
// three-pass, 2-byte-load version at 21% of its memory floor.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, f32_of_bits(unsigned), bits_of_f32(float),
// bf16_bits(float) (round to nearest even), FSDP_CE_SHARED(name) (the
// block's dynamic shared memory, 64 floats), FSDP_CE_ALIGNED(p) (nothing
// on the GPU, where a misaligned 16-byte access faults; the emulation
// counts them), __expf, __shfl_xor_sync, __syncthreads, and atomicAdd for
// double and unsigned long long.
#ifndef FSDP_KERNELS_CROSS_ENTROPY_CUH
#define FSDP_KERNELS_CROSS_ENTROPY_CUH

namespace fsdp_ce {

struct Online {
  float m, s; /* running max, sum of exp(x - m) */
};

__device__ __forceinline__ Online merge(Online a, Online b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a; /* both empty (or all -inf) */
  return Online{m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

/* the 16-byte vector of T at p as floats: 8 bf16 or 4 fp32 */
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int n = 4;
  __device__ static void load(const float *p, float *v) {
    FSDP_CE_ALIGNED(p);
    uint4 u = *(const uint4 *)p;
    v[0] = f32_of_bits(u.x), v[1] = f32_of_bits(u.y), v[2] = f32_of_bits(u.z), v[3] = f32_of_bits(u.w);
  }
  __device__ static void store(float *p, const float *v) {
    FSDP_CE_ALIGNED(p);
    *(uint4 *)p = make_uint4(bits_of_f32(v[0]), bits_of_f32(v[1]), bits_of_f32(v[2]), bits_of_f32(v[3]));
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ static void load(const __nv_bfloat16 *p, float *v) {
    FSDP_CE_ALIGNED(p);
    uint4 u = *(const uint4 *)p;
    unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; i++) v[2 * i] = f32_of_bits(w[i] << 16), v[2 * i + 1] = f32_of_bits(w[i] & 0xffff0000u);
  }
  __device__ static void store(__nv_bfloat16 *p, const float *v) {
    unsigned w[4];
    for (int i = 0; i < 4; i++) w[i] = bf16_bits(v[2 * i]) | (bf16_bits(v[2 * i + 1]) << 16);
    FSDP_CE_ALIGNED(p);
    *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

/* a row's elements in three parts: [0, head) scalar, [head, tail) whole
 * 16-byte vectors, [tail, vocab) scalar */
template <typename T>
__device__ __forceinline__ void split(const T *x, int64_t vocab, int64_t &head, int64_t &tail) {
  const int64_t n = Vec<T>::n;
  head = (int64_t)(((16 - ((uintptr_t)x & 15)) & 15) / sizeof(T));
  if (head > vocab) head = vocab;
  tail = head + (vocab - head) / n * n;
}

template <typename T>
__global__ void cross_entropy_kernel(double *loss_sum, unsigned long long *count, T *dlogits, const T *logits,
                                     const int32_t *targets, int64_t vocab, int32_t ignore_index, float grad_scale) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits + row * vocab;
  T *d = dlogits ? dlogits + row * vocab : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index || t < 0 || t >= vocab) { /* bad targets are refused on the host */
    for (int64_t j = threadIdx.x; d && j < vocab; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  int64_t head, tail;
  split(x, vocab, head, tail);
  /* pass 1: this thread's running max and sum */
  Online o{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) o = merge(o, Online{ld(x, j), 1.0f});
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    float m = v[0];
    for (int i = 1; i < n; i++) m = fmaxf(m, v[i]);
    if (m == -INFINITY) continue;
    float s = 0;
    for (int i = 0; i < n; i++) s += __expf(v[i] - m);
    o = merge(o, Online{m, s});
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x) o = merge(o, Online{ld(x, j), 1.0f});
  /* merged over the warp, then over the block's warps */
  for (int k = 16; k > 0; k >>= 1) o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k)});
  FSDP_CE_SHARED(smem);
  float *part = (float *)smem;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) part[warp] = o.m, part[32 + warp] = o.s;
  __syncthreads();
  o = lane < nw ? Online{part[lane], part[32 + lane]} : Online{-INFINITY, 0.0f};
  for (int k = 16; k > 0; k >>= 1) o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k)});
  float lse = o.m + logf(o.s);
  float xt = ld(x, t);
  __syncthreads(); /* every thread has read x[t] before the gradient overwrites it (in place) */
  if (threadIdx.x == 0) {
    atomicAdd(loss_sum, (double)(lse - xt));
    atomicAdd(count, 1ull);
  }
  if (!d) return;
  /* pass 2: the gradient, scale x (softmax - one-hot), over the logits (in
   * place, or elsewhere at the same alignment; else element by element) */
  if (((uintptr_t)d & 15) != ((uintptr_t)x & 15)) head = tail = 0;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st(d, j, grad_scale * (__expf(ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) v[i] = grad_scale * (__expf(v[i] - lse) - (j + i == t ? 1.0f : 0.0f));
    Vec<T>::store(d + j, v);
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x)
    st(d, j, grad_scale * (__expf(ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)));
}

}  // namespace fsdp_ce

#endif
