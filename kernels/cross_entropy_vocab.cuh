// cross_entropy_vocab.cuh: the vocab-parallel cross-entropy's kernels
// (the CUDA twins of src/ops/cross_entropy_vocab.c), shared by nvcc
// (cross_entropy_vocab.cu) and tests/emu/test_cross_entropy_vocab_emu.cpp,
// which runs them on the CPU under tests/emu/cuda_emu.h against the CPU op.
//
// A tensor-parallel head leaves rank r columns [first, first + cols) of
// every row of logits; the loss takes three passes around two collectives
// of the tp group (fsdp.tp cross_entropy):
//   stats    one block per row: the row's max over the local columns, and
//            its target's logit where this rank holds it (else 0);
//            -> all-gathered over the group, then
//   combine  one thread per row: the max over the ranks, the target logit
//            summed over them (its owner's; the others add 0), on the
//            device, so no host reads the gathered values;
//   sum      one block per row: sum of exp(x - max) over the local columns;
//            -> all-reduced (sum) over the group;
//   finish   one block per row: the loss (max + log sum - x_t) added to a
//            device double, the row counted, and dlogits = scale (softmax -
//            onehot) written over the local columns (in place, or
//            elsewhere), in the logits' storage.
// Rows read 16 bytes per load (8 bf16 or 4 fp32) between a scalar head and
// tail (vec16.cuh), as cross_entropy.cuh. Sums are fp32, the loss fp64, as
// on the CPU.
//
// The includer provides what cross_entropy.cuh's includer does: ld / st,
// the bit casts for vec16.cuh, FSDP_CE_SHARED(name) (the block's dynamic
// shared memory, 32 floats here), FSDP_VEC_ALIGNED(p), __expf, logf,
// __shfl_xor_sync, __syncthreads, and atomicAdd for double and unsigned
// long long.
#ifndef FSDP_KERNELS_CROSS_ENTROPY_VOCAB_CUH
#define FSDP_KERNELS_CROSS_ENTROPY_VOCAB_CUH

#include "vec16.cuh"

namespace fsdp_vce {

using fsdp_vec::split;
using fsdp_vec::Vec;

struct MaxOp {
  static constexpr float identity = -INFINITY;
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  static constexpr float identity = 0.0f;
  __device__ float operator()(float a, float b) const { return a + b; }
};

// v combined by op over the block (blockDim.x a multiple of 32, at most
// 1024); every thread gets the result
template <typename Op>
__device__ __forceinline__ float block_all(float v, Op op) {
  FSDP_CE_SHARED(smem);
  float *part = (float *)smem;
  for (int k = 16; k > 0; k >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, k));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads(); /* (part may still be read by a previous call's threads) */
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : Op::identity;
  for (int k = 16; k > 0; k >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, k));
  return v;
}

// f(x_j) combined by op over this thread's elements of a row of cols,
// 16-byte loads between a scalar head and tail
template <typename T, typename Op, typename F>
__device__ __forceinline__ float row_fold(const T *x, int64_t cols, Op op, F f) {
  const int n = Vec<T>::n;
  int64_t head, tail;
  split(x, cols, head, tail);
  float acc = Op::identity;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) acc = op(acc, f(ld(x, j)));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) acc = op(acc, f(v[i]));
  }
  for (int64_t j = tail + threadIdx.x; j < cols; j += blockDim.x) acc = op(acc, f(ld(x, j)));
  return acc;
}

struct Same {
  __device__ float operator()(float v) const { return v; }
};
struct ExpFrom {
  float m;
  __device__ float operator()(float v) const { return __expf(v - m); }
};

// the local column of row's target, or -1 (ignored, or another rank's)
__device__ __forceinline__ int64_t local_target(int32_t t, int32_t ignore_index, int64_t first, int64_t cols) {
  return t != ignore_index && t >= first && t < first + cols ? (int64_t)t - first : -1;
}

template <typename T>
__global__ void vocab_stats(float *row_max, float *target_logit, const T *logits, const int32_t *targets, int64_t first,
                            int64_t cols, int32_t ignore_index) {
  int64_t row = blockIdx.x;
  const T *x = logits + row * cols;
  float m = block_all(row_fold(x, cols, MaxOp(), Same()), MaxOp());
  if (threadIdx.x == 0) {
    int64_t tl = local_target(targets[row], ignore_index, first, cols);
    row_max[row] = m;
    target_logit[row] = tl >= 0 ? ld(x, tl) : 0.0f;
  }
}

// gathered: {ranks, 2n}, each rank's stats (n maxima, then n target
// logits); writes the group's into row_max and target_logit
// (a template, as every kernel here: each .cu that includes this header
// then shares one definition instead of defining it again)
template <int = 0>
__global__ void vocab_combine(float *row_max, float *target_logit, const float *gathered, int64_t n, int ranks) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float m = gathered[i], t = gathered[n + i];
    for (int r = 1; r < ranks; r++) {
      m = fmaxf(m, gathered[r * 2 * n + i]);
      t += gathered[r * 2 * n + n + i];
    }
    row_max[i] = m;
    target_logit[i] = t;
  }
}

template <typename T>
__global__ void vocab_sum(float *sum, const T *logits, const float *row_max, int64_t cols) {
  int64_t row = blockIdx.x;
  float s = block_all(row_fold(logits + row * cols, cols, SumOp(), ExpFrom{row_max[row]}), SumOp());
  if (threadIdx.x == 0) sum[row] = s;
}

template <typename T>
__global__ void vocab_finish(double *loss_sum, unsigned long long *count, T *dlogits, const T *logits,
                             const int32_t *targets, const float *row_max, const float *sum, const float *target_logit,
                             int64_t first, int64_t cols, int32_t ignore_index, float grad_scale) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits + row * cols;
  T *d = dlogits ? dlogits + row * cols : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index) {
    for (int64_t j = threadIdx.x; d && j < cols; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  float m = row_max[row], s = sum[row];
  if (threadIdx.x == 0) {
    atomicAdd(loss_sum, (double)(m + logf(s)) - target_logit[row]); /* as the CPU op adds it */
    atomicAdd(count, 1ull);
  }
  if (!d) return;
  /* scale e^(x - m) / sum, less scale at the target's column where it is here */
  const int64_t tl = local_target(t, ignore_index, first, cols);
  const float k = grad_scale / s;
  int64_t head, tail;
  split(x, cols, head, tail);
  if (((uintptr_t)d & 15) != ((uintptr_t)x & 15)) head = tail = 0; /* another alignment: element by element */
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st(d, j, __expf(ld(x, j) - m) * k - (j == tl ? grad_scale : 0.0f));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) v[i] = __expf(v[i] - m) * k - (j + i == tl ? grad_scale : 0.0f);
    Vec<T>::store(d + j, v);
  }
  for (int64_t j = tail + threadIdx.x; j < cols; j += blockDim.x)
    st(d, j, __expf(ld(x, j) - m) * k - (j == tl ? grad_scale : 0.0f));
}

}  // namespace fsdp_vce

#endif
