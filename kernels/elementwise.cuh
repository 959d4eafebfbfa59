// elementwise.cuh: the residual add, scale-add and SwiGLU's forward and backward, the
// source nvcc (elementwise.cu) and tests/emu/test_elementwise_emu.cpp share.
//
// Memory bound, so each thread moves 16 bytes per load and store (8 bf16 or
// 4 fp32, vec16.cuh) where the caller found every pointer 16-byte aligned
// (vec = 1: activations are whole allocations, 256-byte aligned), and the
// elements past the last whole vector one at a time; with vec = 0 (a view at
// an odd offset) all of them one at a time. The H200 run of 2026-11-27
// measured the one-at-a-time kernels at 29% (SwiGLU forward) to 58% of
// their memory floor. fp32 arithmetic either way, so both paths give the
// same bits.
//
// The includer provides ld(p, i) / st(p, i, v) for float and __nv_bfloat16,
// __expf, and what vec16.cuh needs.
#ifndef FSDP_KERNELS_ELEMENTWISE_CUH
#define FSDP_KERNELS_ELEMENTWISE_CUH

#include "vec16.cuh"

namespace fsdp_ew {

using fsdp_vec::Vec;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

/* this thread's share of n elements: whole vectors i = tid, tid + stride,
 * ... below nv (none unless vec), then single elements from nv * V + tid */
template <typename T>
struct Share {
  static constexpr int V = Vec<T>::n;
  int64_t nv, tid, stride;
  __device__ Share(int64_t n, int vec)
      : nv(vec ? n / V : 0), tid(blockIdx.x * (int64_t)blockDim.x + threadIdx.x), stride((int64_t)gridDim.x * blockDim.x) {}
};

/* y = f(a, b), element by element */
template <typename T, typename F>
__global__ void binary_kernel(T *y, const T *a, const T *b, int64_t n, int vec, F f) {
  const Share<T> sh(n, vec);
  const int V = sh.V;
  for (int64_t i = sh.tid; i < sh.nv; i += sh.stride) {
    float va[Vec<T>::n], vb[Vec<T>::n];
    Vec<T>::load(a + i * V, va);
    Vec<T>::load(b + i * V, vb);
    for (int j = 0; j < V; j++) va[j] = f(va[j], vb[j]);
    Vec<T>::store(y + i * V, va);
  }
  for (int64_t i = sh.nv * V + sh.tid; i < n; i += sh.stride) st(y, i, f(ld(a, i), ld(b, i)));
}

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
/* y + alpha x (in place: a is y) */
struct ScaleAddOp {
  float alpha;
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};
/* SwiGLU's forward: silu(gate) * up */
struct SwiGLUOp {
  __device__ float operator()(float g, float u) const { return g * sigmoid(g) * u; }
};

/* each element's gate and up are read before its gradients are written:
 * dgate, dup may be gate, up (in place) */
template <typename T>
__global__ void swiglu_bwd_kernel(T *dgate, T *dup, const T *dy, const T *gate, const T *up, int64_t n, int vec) {
  const Share<T> sh(n, vec);
  const int V = sh.V;
  for (int64_t i = sh.tid; i < sh.nv; i += sh.stride) {
    float g[Vec<T>::n], u[Vec<T>::n], d[Vec<T>::n];
    Vec<T>::load(gate + i * V, g);
    Vec<T>::load(up + i * V, u);
    Vec<T>::load(dy + i * V, d);
    for (int j = 0; j < V; j++) {
      const float sg = sigmoid(g[j]), dg = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
      u[j] = d[j] * g[j] * sg;
      g[j] = dg;
    }
    Vec<T>::store(dup + i * V, u);
    Vec<T>::store(dgate + i * V, g);
  }
  for (int64_t i = sh.nv * V + sh.tid; i < n; i += sh.stride) {
    float g = ld(gate, i), u = ld(up, i), d = ld(dy, i), sg = sigmoid(g);
    st(dup, i, d * g * sg);
    st(dgate, i, d * u * sg * (1.0f + g * (1.0f - sg)));
  }
}

}  // namespace fsdp_ew

#endif
