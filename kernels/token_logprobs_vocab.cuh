// token_logprobs_vocab.cuh: the vocab-parallel per-token log-probabilities'
// kernels (the CUDA twins of src/ops/token_logprobs_vocab.c), shared by
// nvcc (token_logprobs_vocab.cu) and tests/emu/
// test_token_logprobs_vocab_emu.cpp, which runs them on the CPU under
// tests/emu/cuda_emu.h against the CPU op.
//
// Rank r holds columns [first, first + cols) of every row of logits. The
// first pass and the collective after it are the cross-entropy's
// (cross_entropy_vocab.cuh: stats, the all-gather, combine: the group's max
// m and target logit); then
//   sums    one block per row, one read: s = sum e^(x - m) and u = sum
//           e^(x - m) (x - m) over the local columns; -> both all-reduced
//           (sum) over the group;
//   finish  one block per row: logp = (x_t - m) - log s, entropy = log s -
//           u / s, and dlogits = coef (onehot(t) - e^(x - m) / s) over the
//           local columns (in place, or elsewhere), in the logits' storage.
// u is taken about the max, as token_logprobs.cuh: its terms have one sign,
// and a logit of -inf adds nothing (e^-inf = 0, no 0 x -inf). Rows read 16
// bytes per load (8 bf16 or 4 fp32) between a scalar head and tail
// (vec16.cuh); fp32 sums. A target outside [0, vocab) that is not the
// ignore index gets 0 in all three, as token_logprobs.cuh (a kernel cannot
// report it; the caller checks the targets on the host).
//
// The includer provides what cross_entropy_vocab.cuh's includer does.
#ifndef FSDP_KERNELS_TOKEN_LOGPROBS_VOCAB_CUH
#define FSDP_KERNELS_TOKEN_LOGPROBS_VOCAB_CUH

#include "cross_entropy_vocab.cuh"

namespace fsdp_tlv {

using fsdp_vce::block_all;
using fsdp_vce::SumOp;
using fsdp_vec::split;
using fsdp_vec::Vec;

/* one logit's terms of s and u */
__device__ __forceinline__ void add_terms(float v, float m, float &s, float &u) {
  float y = v - m, e = __expf(y);
  s += e;
  if (e > 0.0f) u += e * y; /* e^-inf = 0: no 0 x -inf */
}

/* xsum may be null (no entropy asked for): then only sum is written */
template <typename T>
__global__ void vocab_sums(float *sum, float *xsum, const T *logits, const float *row_max, int64_t cols) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits + row * cols;
  const float m = row_max[row];
  int64_t head, tail;
  split(x, cols, head, tail);
  float s = 0.0f, u = 0.0f;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) add_terms(ld(x, j), m, s, u);
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) add_terms(v[i], m, s, u);
  }
  for (int64_t j = tail + threadIdx.x; j < cols; j += blockDim.x) add_terms(ld(x, j), m, s, u);
  s = block_all(s, SumOp());
  if (xsum) u = block_all(u, SumOp()); /* xsum is the same for the whole grid: no barrier skipped by some */
  if (threadIdx.x == 0) {
    sum[row] = s;
    if (xsum) xsum[row] = u;
  }
}

/* logp, entropy, dlogits: each may be null; xsum is read where entropy is
 * written, coef where dlogits is (the entry point requires them) */
template <typename T>
__global__ void vocab_finish(float *logp, float *entropy, T *dlogits, const T *logits, const int32_t *targets,
                             const float *coef, const float *row_max, const float *sum, const float *xsum,
                             const float *target_logit, int64_t vocab, int64_t first, int64_t cols,
                             int32_t ignore_index) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits ? logits + row * cols : nullptr;
  T *d = dlogits ? dlogits + row * cols : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index || t < 0 || t >= vocab) { /* out of range: as ignored (the header says why) */
    if (threadIdx.x == 0) {
      if (logp) logp[row] = 0.0f;
      if (entropy) entropy[row] = 0.0f;
    }
    for (int64_t j = threadIdx.x; d && j < cols; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  const float m = row_max[row], s = sum[row], log_s = logf(s);
  if (threadIdx.x == 0) {
    if (logp) logp[row] = (target_logit[row] - m) - log_s;
    if (entropy) entropy[row] = log_s - xsum[row] / s;
  }
  if (!d) return;
  /* c e^(x - m), c = -coef / s, plus coef at the target's column where it is here */
  const int64_t tl = fsdp_vce::local_target(t, ignore_index, first, cols);
  const float cf = coef[row], c = -cf / s;
  int64_t head, tail;
  split(x, cols, head, tail);
  if (((uintptr_t)d & 15) != ((uintptr_t)x & 15)) head = tail = 0; /* another alignment: element by element */
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st(d, j, c * __expf(ld(x, j) - m) + (j == tl ? cf : 0.0f));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) v[i] = c * __expf(v[i] - m) + (j + i == tl ? cf : 0.0f);
    Vec<T>::store(d + j, v);
  }
  for (int64_t j = tail + threadIdx.x; j < cols; j += blockDim.x) st(d, j, c * __expf(ld(x, j) - m) + (j == tl ? cf : 0.0f));
}

}  // namespace fsdp_tlv

#endif
