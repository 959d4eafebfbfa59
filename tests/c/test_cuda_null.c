/* test_cuda_null: the CUDA entry points refuse a NULL pointer among the
 * buffers an op needs (a freed tensor) with an error naming the argument,
 * before any kernel is launched: so this runs on any machine with the CUDA
 * backend built, GPU or not. Optional buffers (a bias, dx of the first
 * layer) may still be NULL. */
#include <string.h>

#include "check.h"
#include "fsdp.h"

#define refused(expr, want) CHECK_FAILS(expr, FSDP_EINVAL, want)

int main(void) {
  float a[64] = {0}, b[64] = {0}, y[64] = {0}, r[64] = {0};
  refused(fsdp_cuda_add(y, a, NULL, 4, FSDP_FP32, NULL), "cuda add: b is NULL");
  refused(fsdp_cuda_add(NULL, a, b, 4, FSDP_FP32, NULL), "cuda add: y is NULL");
  refused(fsdp_cuda_scale_add(y, 2.0f, NULL, 4, FSDP_FP32, NULL), "cuda scale_add: x is NULL");
  refused(fsdp_cuda_swiglu_backward(y, y, a, b, NULL, 4, FSDP_FP32, NULL), "cuda swiglu backward: up is NULL");
  refused(fsdp_cuda_linear_forward(y, NULL, a, NULL, 2, 4, 4, FSDP_FP32, NULL), "cuda linear forward: x is NULL");
  refused(fsdp_cuda_linear_backward(y, NULL, NULL, a, b, NULL, 2, 4, 4, FSDP_FP32, NULL),
          "cuda linear backward (dx): w is NULL");
  refused(fsdp_cuda_embedding_forward(y, NULL, a, 4, 8, 4, FSDP_FP32, NULL), "cuda embedding: ids is NULL");
  refused(fsdp_cuda_embedding_forward_slice(y, NULL, a, 4, 8, 4, 4, 4, FSDP_FP32, NULL), "cuda embedding: ids is NULL");
  refused(fsdp_cuda_embedding_backward_slice(y, a, NULL, 4, 8, 4, 4, 4, FSDP_FP32, NULL),
          "cuda embedding backward: ids is NULL");
  refused(fsdp_cuda_embedding_forward_slice(y, (const int32_t *)b, a, 4, 8, 6, 4, 4, FSDP_FP32, NULL),
          "cuda embedding (slice): rows [6, 10) of a vocabulary of 8");
  refused(fsdp_cuda_rmsnorm_forward(y, r, a, NULL, 2, 4, 1e-5f, FSDP_FP32, NULL), "cuda rmsnorm: w is NULL");
  refused(fsdp_cuda_rope_forward(NULL, a, b, 1, 2, 1, 4, FSDP_FP32, NULL), "cuda rope forward: x is NULL");
  refused(fsdp_cuda_attention_forward(y, r, a, NULL, b, 1, 4, 2, 2, 8, FSDP_FP32, NULL), "cuda attention: k is NULL");
  refused(fsdp_cuda_attention_forward_docs(y, r, a, a, b, NULL, 1, 4, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention docs: doc_start is NULL");
  refused(fsdp_cuda_attention_backward_docs(y, y, y, a, a, a, a, a, r, NULL, 1, 4, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention docs backward: doc_start is NULL");
  refused(fsdp_cuda_attention_forward_pos(y, r, a, a, b, NULL, 1, 4, 8, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention pos: q_pos is NULL");
  refused(fsdp_cuda_attention_backward_pos(y, y, y, a, a, a, a, a, r, NULL, 1, 4, 8, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention pos backward: q_pos is NULL");
  refused(fsdp_cuda_attention_backward_pos(y, NULL, y, a, a, a, a, a, r, (const int32_t *)b, 1, 4, 8, 2, 2, 8,
                                           FSDP_FP32, NULL),
          "cuda attention pos backward: dk is NULL");
  refused(fsdp_cuda_attention_forward_pos_docs(y, r, a, a, b, (const int32_t *)b, NULL, 1, 4, 8, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention pos_docs: q_lo is NULL");
  refused(fsdp_cuda_attention_backward_pos_docs(y, y, y, a, a, a, a, a, r, NULL, (const int32_t *)b, 1, 4, 8, 2, 2, 8,
                                                FSDP_FP32, NULL),
          "cuda attention pos_docs backward: q_pos is NULL");
  refused(fsdp_cuda_attention_backward_pos_docs(y, y, NULL, a, a, a, a, a, r, (const int32_t *)b, (const int32_t *)b, 1,
                                                4, 8, 2, 2, 8, FSDP_FP32, NULL),
          "cuda attention pos_docs backward: dv is NULL");
  refused(fsdp_cuda_rope_forward_at(y, a, b, NULL, 1, 2, 1, 4, FSDP_FP32, NULL), "cuda rope forward_at: pos is NULL");
  refused(fsdp_cuda_rope_backward_at(y, a, b, NULL, 1, 2, 1, 4, FSDP_FP32, NULL), "cuda rope backward_at: pos is NULL");
  refused(fsdp_cuda_cross_entropy((double *)r, (int64_t *)(r + 8), y, a, NULL, 2, 4, -1, 1.0f, FSDP_FP32, NULL),
          "cuda cross_entropy: targets is NULL");
  refused(fsdp_cuda_cross_entropy_vocab_stats(r, r + 8, a, NULL, 2, 8, 4, 4, -1, FSDP_FP32, NULL),
          "cuda cross_entropy_vocab_stats: targets is NULL");
  refused(fsdp_cuda_cross_entropy_vocab_combine(r, r + 8, NULL, 2, 2, NULL), "cuda cross_entropy_vocab_combine: gathered is NULL");
  refused(fsdp_cuda_cross_entropy_vocab_sum(r, a, NULL, 2, 4, FSDP_FP32, NULL), "cuda cross_entropy_vocab_sum: row_max is NULL");
  refused(fsdp_cuda_cross_entropy_vocab_finish((double *)y, (int64_t *)(y + 8), NULL, a, (const int32_t *)b, r, NULL,
                                               r, 2, 8, 4, 4, -1, 1.0f, FSDP_FP32, NULL),
          "cuda cross_entropy_vocab_finish: sum is NULL");
  refused(fsdp_cuda_token_logprobs(y, r, NULL, NULL, (const int32_t *)b, NULL, 2, 4, -1, FSDP_FP32, NULL),
          "cuda token_logprobs: logits is NULL");
  refused(fsdp_cuda_token_logprobs(y, NULL, NULL, a, NULL, NULL, 2, 4, -1, FSDP_FP32, NULL),
          "cuda token_logprobs: targets is NULL");
  refused(fsdp_cuda_token_logprobs(NULL, NULL, y, a, (const int32_t *)b, NULL, 2, 4, -1, FSDP_FP32, NULL),
          "cuda token_logprobs: dlogits without coef");
  refused(fsdp_cuda_token_logprobs_vocab_sums(r, r + 8, a, NULL, 2, 4, FSDP_FP32, NULL),
          "cuda token_logprobs_vocab_sums: row_max is NULL");
  refused(fsdp_cuda_token_logprobs_vocab_finish(y, NULL, NULL, a, NULL, NULL, r, r, NULL, r, 2, 8, 4, 4, -1, FSDP_FP32,
                                                NULL),
          "cuda token_logprobs_vocab_finish: targets is NULL");
  refused(fsdp_cuda_token_logprobs_vocab_finish(y, y + 8, NULL, a, (const int32_t *)b, NULL, r, r, NULL, r, 2, 8, 4, 4,
                                                -1, FSDP_FP32, NULL),
          "cuda token_logprobs_vocab_finish: entropy without xsum");
  refused(fsdp_cuda_token_logprobs_vocab_finish(NULL, NULL, y, a, (const int32_t *)b, NULL, r, r, NULL, r, 2, 8, 4, 4, -1,
                                                FSDP_FP32, NULL),
          "cuda token_logprobs_vocab_finish: dlogits without coef");
  refused(fsdp_cuda_sum_squares(NULL, FSDP_FP32, 4, (double *)r, (int64_t *)(r + 8), NULL), "cuda sum_squares: x is NULL");
  /* nothing to do: no pointer is needed */
  CHECK(fsdp_cuda_add(NULL, NULL, NULL, 0, FSDP_FP32, NULL) == FSDP_OK);
  return fsdp_test_summary("test_cuda_null");
}
