/* ref.h: what the op tests share: deterministic random inputs, float64
 * copies, comparison with a stated tolerance, and central differences of a
 * float64 scalar loss for the backward checks. */
#ifndef FSDP_TEST_REF_H
#define FSDP_TEST_REF_H

#include <stdint.h>

/* uniform in [-a, a), from a small LCG (reproducible across platforms) */
double ref_rand(unsigned *seed, double a);
/* x (float) and xd (double) get the same random values */
void ref_fill(float *x, double *xd, int64_t n, unsigned *seed, double a);
/* counts elements with |got - want| > rel |want| + abs; prints the first few, under label */
int ref_mismatches(const char *label, const float *got, const double *want, int64_t n, double rel, double abs_);
/* the same for float64 values (a float64 reference against another) */
int ref_mismatches64(const char *label, const double *got, const double *want, int64_t n, double rel, double abs_);
/* dL/dv[i] by central differences with step h (L reads v through ctx) */
double ref_central(double (*loss)(void *ctx), void *ctx, double *v, double h);
/* a float buffer filled with NaN, so unwritten outputs are caught */
float *ref_poisoned(int64_t n);
/* float64 attention (ref_attention.c): q, r, out, gq [B, T, H, D]; k, v, gk,
 * gv [B, T, Hkv, D]; query i sees keys ds[i] .. i (ds NULL: causal); the
 * gradients of sum r * out when gq is not NULL */
void ref_attention(int B, int T, int H, int Hkv, int D, const int32_t *ds, const double *q, const double *k,
                   const double *v, const double *r, double *out, double *gq, double *gk, double *gv);
/* the same for Tq queries at positions q_pos [Tq] (each in [-1, Tk)) against
 * Tk keys: query i sees keys 0 .. q_pos[i] (-1: none, out 0); q, r, out,
 * gq [B, Tq, H, D]; k, v, gk, gv [B, Tk, Hkv, D] */
void ref_attention_pos(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const double *q,
                       const double *k, const double *v, const double *r, double *out, double *gq, double *gk,
                       double *gv);
/* and each row's log-sum-exp of its scores, lse [B, H, Tq] (-inf: no key) */
void ref_attention_pos_lse(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const double *q,
                           const double *k, const double *v, const double *r, double *out, double *lse, double *gq,
                           double *gk, double *gv);
/* the same with each query's first key too: query i of batch row b sees keys
 * q_lo[b, i] .. q_pos[i] (q_lo [B, Tq]; none where q_lo = q_pos + 1: out 0,
 * lse -inf); lse may be NULL */
void ref_attention_pos_docs(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const int32_t *q_lo,
                            const double *q, const double *k, const double *v, const double *r, double *out, double *lse,
                            double *gq, double *gk, double *gv);

#endif
