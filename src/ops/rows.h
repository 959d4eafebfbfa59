/* rows.h: the softmax's loops over one row of fp32 values, vectorised
 * (rows.c). Sums are fp32, in a fixed order: the same bits on any machine. */
#ifndef FSDP_OPS_ROWS_H
#define FSDP_OPS_ROWS_H

#include <stdint.h>

/* the largest of x[0 .. n-1], n >= 1 (a NaN does not count here, but it
 * makes row_sum_exp NaN) */
float fsdp_row_max(const float *x, int64_t n);
/* sum_j e^(x_j - m) */
float fsdp_row_sum_exp(const float *x, int64_t n, float m);
/* x_j <- e^(x_j - m), in place, and their sum (m the row's max): one
 * exponential per entry where sum_exp and exp_scaled take two */
float fsdp_row_exp_sum(float *x, int64_t n, float m);
/* x_j <- scale x_j */
void fsdp_row_scale(float *x, int64_t n, float scale);
/* x_j <- scale e^(x_j - shift), in place; shift >= every x_j (a max, a
 * log-sum-exp): e^y is computed for y <= 0, and is 0 below -87 */
void fsdp_row_exp_scaled(float *x, int64_t n, float shift, float scale);
/* the softmax's backward: dp_j <- p_j (dp_j - di), di = sum_j p_j dp_j */
void fsdp_row_softmax_grad(float *dp, const float *p, int64_t n, float di);

/* s[j] = sigmoid(x[j]) = 1 / (1 + e^-x[j]), with the exponential above */
void fsdp_row_sigmoid(float *s, const float *x, int64_t n);

#endif
