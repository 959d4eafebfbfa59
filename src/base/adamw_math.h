/* adamw_math.h: one AdamW element update, shared by the CPU loop
 * (src/shard/adamw.c) and the CUDA kernel (kernels/adamw.cu) so that both
 * compute exactly the same formula. In base, below both: numerics that two
 * layers share. c1, c2: the bias corrections 1 / (1 - beta^t);
 * decay: 1 - lr * weight_decay. Returns the new parameter. */
#ifndef FSDP_ADAMW_MATH_H
#define FSDP_ADAMW_MATH_H

#include <math.h>

#include "host_device.h"

static inline FSDP_HOST_DEVICE float fsdp_adamw_element(float *param, float *m, float *v, float grad, float b1, float b2,
                                                        float lr, float eps, float decay, float c1, float c2) {
  float mi = b1 * *m + (1.0f - b1) * grad;
  float vi = b2 * *v + (1.0f - b2) * grad * grad;
  *m = mi;
  *v = vi;
  *param = *param * decay - lr * (mi * c1) / (sqrtf(vi * c2) + eps);
  return *param;
}

#endif
