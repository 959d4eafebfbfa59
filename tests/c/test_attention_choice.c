/* test_attention_choice: which CUDA attention family a call runs
 * (kernels/attention_choice.cu), on any machine with the CUDA backend built,
 * GPU or not. cuDNN is opened at run time, not linked, so its loading is
 * checked here in every CI run: ctest runs this as is and with
 * FSDP_CUDNN_LIB naming a library that does not exist. The numbers of each
 * family against the CPU op are test_kernels' (GPU only). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

int main(void) {
  const char *lib = getenv("FSDP_CUDNN_LIB");
  int missing_lib = lib && strstr(lib, "does-not-exist") != NULL;
  int gpu = fsdp_device_available(FSDP_CUDA) == 1;
  char desc[512];

  /* fp32 goes to neither cuDNN nor the tensor cores, and says why */
  CHECK(fsdp_cuda_attention_choice(FSDP_FP32, 1, 64, 4, 2, 64, 0, desc, sizeof desc) == FSDP_ATTN_SIMPLE);
  CHECK(strstr(desc, "fp32 CUDA-core") && strstr(desc, "bf16 only"));
  CHECK(fsdp_cuda_attention_choice(FSDP_BF16, 1, 64, 4, 2, 60, 0, desc, sizeof desc) != FSDP_ATTN_CUDNN);
  CHECK(strstr(desc, "multiple of 8") != NULL);

  /* bf16, head_dim 64: cuDNN where it loads and has a GPU */
  int k = fsdp_cuda_attention_choice(FSDP_BF16, 1, 128, 4, 2, 64, 0, desc, sizeof desc);
  printf("bf16, head_dim 64: %s\n", desc);
  if (missing_lib) {
    CHECK(k != FSDP_ATTN_CUDNN);
    CHECK(strstr(desc, "cannot load") && strstr(desc, "does-not-exist") && strstr(desc, "FSDP_CUDNN_LIB"));
  } else if (!gpu) {
    CHECK(k == FSDP_ATTN_SIMPLE);
    /* without a GPU the library still loads where it is installed */
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    CHECK(strstr(desc, h ? "no current CUDA device (cuDNN 9." : "cannot load libcudnn.so.9") != NULL);
    if (h) dlclose(h);
  }

  /* the bytes a call takes from the allocator: none for our kernels; on a
   * GPU with cuDNN, its deterministic backward's partial sums of dq per
   * block of 128 keys at least (the planner's estimate, lua/fsdp/planner.lua) */
  int64_t ws = -1;
  CHECK(fsdp_cuda_attention_workspace(FSDP_FP32, 1, 64, 4, 2, 64, 1, &ws) == FSDP_ATTN_SIMPLE && ws == 0);
  k = fsdp_cuda_attention_workspace(FSDP_BF16, 1, 512, 4, 2, 64, 1, &ws);
  printf("bf16, 512 tokens, 4 heads of 64, backward: family %d, workspace %lld bytes\n", k, (long long)ws);
  if (k == FSDP_ATTN_CUDNN && !getenv("FSDP_CUDNN_DETERMINISTIC")) CHECK(ws >= 4 * 512 * 64 * 4 * (512 / 128));
  else CHECK(k == FSDP_ATTN_CUDNN || ws == 0);
  CHECK_FAILS(fsdp_cuda_attention_workspace(FSDP_BF16, 1, 64, 4, 2, 64, 1, NULL), FSDP_EINVAL, "NULL bytes");
  CHECK_FAILS(fsdp_cuda_attention_workspace(FSDP_BF16, 1, 64, 3, 2, 64, 1, &ws), FSDP_EINVAL, "kv heads");

  /* a family asked for where it cannot run fails with the reason */
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_CUDNN) == FSDP_ATTN_AUTO);
  CHECK_FAILS(fsdp_cuda_attention_choice(FSDP_FP32, 1, 64, 4, 2, 64, 1, desc, sizeof desc), FSDP_EUNSUPPORTED,
              "FSDP_ATTENTION=cudnn");
  if (missing_lib)
    CHECK_FAILS(fsdp_cuda_attention_choice(FSDP_BF16, 1, 64, 4, 2, 64, 1, desc, sizeof desc), FSDP_EUNSUPPORTED,
                "FSDP_CUDNN_LIB");
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES) == FSDP_ATTN_CUDNN);
  CHECK_FAILS(fsdp_cuda_attention_choice(FSDP_FP32, 1, 64, 4, 2, 64, 0, desc, sizeof desc), FSDP_EUNSUPPORTED,
              "tensor-core");
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_SIMPLE) == FSDP_ATTN_TENSOR_CORES);
  CHECK(fsdp_cuda_attention_choice(FSDP_BF16, 1, 64, 4, 2, 64, 0, desc, sizeof desc) == FSDP_ATTN_SIMPLE);
  CHECK_FAILS(fsdp_cuda_attention_impl_set(5), FSDP_EINVAL, "expected");
  CHECK_FAILS(fsdp_cuda_attention_choice(FSDP_BF16, 1, 64, 3, 2, 64, 0, desc, sizeof desc), FSDP_EINVAL, "kv heads");
  return fsdp_test_summary("test_attention_choice");
}
