/* fsdp_ops.h: forward and backward of the model's operations (src/ops/ on
 * CPU, kernels/ on CUDA). Part of the public API: included by fsdp.h, read
 * by ffi.lua, FFI-clean like it (no macros in declarations). */
#ifndef FSDP_OPS_API_H
#define FSDP_OPS_API_H

#include <stdint.h>

/* ---- ops (CPU, fp32; src/ops/) --------------------------------------- */
/* y[n, out] = x[n, in] W[out, in]^T + b (b may be NULL) */
int fsdp_linear_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t in, int64_t out);
/* dx = dy W (dx may be NULL); dW += dy^T x; db += column sums of dy (may be NULL) */
int fsdp_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n,
                         int64_t in, int64_t out);
int fsdp_tanh_forward(float *y, const float *x, int64_t n);
int fsdp_tanh_backward(float *dx, const float *dy, const float *y, int64_t n);
/* loss = mean (x - t)^2; dx (may be NULL) = scale * 2 (x - t) / n */
int fsdp_mse_forward_backward(double *loss, float *dx, const float *x, const float *target, int64_t n, float scale);

#endif /* FSDP_OPS_API_H */
