/* attention_cudnn_none.c: the cuDNN attention entry points of a build made
 * without the cuDNN frontend headers (scripts/setup.sh fetches them): each
 * says so, and the attention dispatch (attention.cu) runs our own kernels. */
#include <stdio.h>

#include "../src/base/error.h"
#include "attention_cudnn.h"

static const char *const NOT_BUILT =
    "this build has no cuDNN attention (the cuDNN frontend headers were not found when it was configured: "
    "run scripts/setup.sh, then reconfigure)";

int fsdp_attention_cudnn_applies(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward, char *why,
                                 size_t why_len) {
  if (why && why_len) snprintf(why, why_len, "%s", NOT_BUILT);
  return 0;
}

int fsdp_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                                 int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream) {
  return fsdp_fail(FSDP_EUNSUPPORTED, "cuDNN attention forward: %s", NOT_BUILT);
}

int fsdp_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                  const void *v, const void *out, const float *lse, int64_t B, int64_t T, int64_t H,
                                  int64_t Hkv, int64_t D, void *stream) {
  return fsdp_fail(FSDP_EUNSUPPORTED, "cuDNN attention backward: %s", NOT_BUILT);
}

int64_t fsdp_attention_cudnn_workspace(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward) {
  return -1;
}

const char *fsdp_attention_cudnn_version(void) { return "no cuDNN (not built)"; }
