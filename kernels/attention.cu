// attention.cu: the CUDA twin of attention.c: causal attention with grouped
// query heads, flash-style: the T x T scores never exist in memory. Forward
// keeps one query row per thread with an online softmax and saves the
// log-sum-exp; backward recomputes the probabilities from it, one kernel for
// dq (a thread per query row) and one for dk, dv (a thread per key row,
// looping over its group's query heads), so nothing needs atomics.
// fp32 arithmetic on CUDA cores, any head_dim up to 256, fp32 or bf16: the
// fallback for what cuDNN (attention_cudnn.cpp) and our tensor-core kernels
// (attention_tc.cu) do not take; attention_choice.cu picks per call. Packed
// rows (doc_start not NULL: query i sees keys doc_start[i] .. i) run here
// alone, in the kernels' DOCS instances (attention.cuh, which
// tests/emu/test_attention_docs_emu.cpp runs on the CPU); doc_start NULL
// runs the causal instances, the code as it was. Queries at given
// positions (context parallelism: q_pos [T] of Tk keys, each in [-1, Tk):
// -1 sees no key, out 0, lse -inf) are attention_pos.cu's, over packed
// rows too (each query from its document's first key, q_lo [B, T]). Each kind's kernels compile in their own file
// (attention_launch.cuh).
// Layouts: q, out, dq, dout [B, T, H, D]; k, v, dk, dv [B, T, Hkv, D]; lse
// [B, H, T]; doc_start [B, T] int32 (POS: k, v, dk, dv [B, Tk, Hkv, D];
// q_pos [T] int32).
#include <stdlib.h>
#include <string.h>

#include "attention_launch.cuh"

FSDP_ATTN_INSTANCES(extern, CAUSAL)
FSDP_ATTN_INSTANCES(extern, DOCS_ROWS)

extern "C" int fsdp_attention_check_args(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype,
                                         const char *what) {
  if (B < 0 || T < 0 || H < 1 || Hkv < 1 || H % Hkv || D < 1 || D > 256 || B > 65535 || H > 65535)
    return fsdp_fail(FSDP_EINVAL, "%s: batch %lld, seq %lld, heads %lld, kv heads %lld (dividing heads), head_dim %lld (1..256)",
                     what, (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
  return check_dtype(dtype, what);
}

extern "C" int fsdp_attention_simple_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                             const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention"));
  if (batch * seq == 0) return FSDP_OK;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (doc_start) launch_forward<DOCS_ROWS>(out, lse, q, k, v, doc_start, sh, dtype, st_);
  else launch_forward<CAUSAL>(out, lse, q, k, v, nullptr, sh, dtype, st_);
  return launched("cuda attention forward");
}

extern "C" int fsdp_attention_simple_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                              const void *k, const void *v, const void *out, const float *lse,
                                              const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention backward"));
  if (batch * seq == 0) return FSDP_OK;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (doc_start) launch_backward<DOCS_ROWS>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, sh, dtype, st_);
  else launch_backward<CAUSAL>(dq, dk, dv, dout, q, k, v, out, lse, nullptr, sh, dtype, st_);
  return launched("cuda attention backward");
}

