/* test_kernels: every CUDA op (kernels/) against its CPU twin (src/ops/) on
 * random inputs, in fp32 and bf16; exits 77 (skipped) without a GPU.
 * bf16 runs take their inputs rounded to bf16, and the CPU reference gets
 * the same rounded values, so only the kernel's own arithmetic and output
 * rounding differ. Outputs are poisoned (NaN) before every run; NaN never
 * passes. Tolerance: max |gpu - cpu| / max |cpu| <= 2e-5 (fp32; 1e-4 for the
 * reductions over long rows) and 1.6e-2 (bf16: a few units of its 2^-8
 * precision). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "base/bf16_split.h"
#include "check.h"
#include "fsdp.h"

static uint64_t rng_state = 88172645463325252ull;
static float urand(void) { /* xorshift64 -> [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) / 8388608.0 - 1.0);
}

static float *rand_host(int64_t n, float scale, int dtype) {
  float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    h[i] = urand() * scale;
    if (dtype == FSDP_BF16) h[i] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(h[i]));
  }
  return h;
}

/* device copy of host floats in dtype */
static void *up(const float *h, int64_t n, int dtype) {
  size_t es = fsdp_dtype_size(dtype);
  void *tmp = malloc(es * (size_t)(n ? n : 1)), *d = NULL;
  fsdp_convert(tmp, dtype, h, FSDP_FP32, (size_t)n);
  CHECK_OK(fsdp_alloc(FSDP_CUDA, es * (size_t)(n ? n : 1), &d));
  CHECK_OK(fsdp_memcpy(d, tmp, es * (size_t)n, NULL));
  free(tmp);
  return d;
}

/* a device buffer of n elements, poisoned with NaN */
static void *poisoned(int64_t n, int dtype) {
  void *d = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, fsdp_dtype_size(dtype) * (size_t)(n ? n : 1), &d));
  CHECK_OK(fsdp_memset(d, 0xFF, fsdp_dtype_size(dtype) * (size_t)n, NULL));
  return d;
}

static float *down(const void *d, int64_t n, int dtype) {
  size_t es = fsdp_dtype_size(dtype);
  void *tmp = malloc(es * (size_t)(n ? n : 1));
  float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
  CHECK_OK(fsdp_memcpy(tmp, d, es * (size_t)n, NULL));
  fsdp_convert(h, FSDP_FP32, tmp, dtype, (size_t)n);
  free(tmp);
  return h;
}

static double tol_of(int dtype, double fp32_tol) { return dtype == FSDP_BF16 ? 1.6e-2 : fp32_tol; }

/* compares the device result with the CPU one within tol of the largest
 * |ref|; frees the device buffer */
static void same_tol(const char *what, int dtype, void *dev, const float *ref, int64_t n, double tol) {
  float *got = down(dev, n, dtype);
  double worst = 0, scale = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) nan++;
    else worst = fmax(worst, fabs(got[i] - ref[i]));
  }
  double rel = scale > 0 ? worst / scale : worst;
  if (nan || !(rel <= tol)) {
    fprintf(stderr, "%s (%s): max error %.3g of max |ref| %.3g (tolerance %.1g), %lld non-finite\n", what,
            fsdp_dtype_name(dtype), rel, scale, tol, (long long)nan);
    fsdp_test_failed++;
  } else {
    fsdp_test_passed++;
  }
  free(got);
  fsdp_free(FSDP_CUDA, dev);
}

static void same(const char *what, int dtype, void *dev, const float *ref, int64_t n, double fp32_tol) {
  same_tol(what, dtype, dev, ref, n, tol_of(dtype, fp32_tol));
}

#define DT_LOOP for (int di = 0, dt = FSDP_FP32; di < 2; di++, dt = di ? FSDP_BF16 : FSDP_FP32)

/* A weight inside a unit's flat buffer is only 16 elements aligned; cuBLASLt
 * assumes 256 bytes unless told. Llama-like shapes (tensor-core GEMMs),
 * the weight 16 elements into its buffer, each product twice (the second
 * from kernels/linear.cu's algorithm cache), then from an aligned copy. */
static void test_linear_views(void) {
  const int64_t n = 256, in = 512, out = 384, off = 16;
  DT_LOOP {
    size_t es = fsdp_dtype_size(dt);
    float *x = rand_host(n * in, 1, dt), *w = rand_host(out * in, 0.5f, dt), *dy = rand_host(n * out, 1, dt);
    float *y = malloc(sizeof(float) * n * out), *dx = malloc(sizeof(float) * n * in), *dw = calloc((size_t)(out * in), 4);
    CHECK_OK(fsdp_linear_forward(y, x, w, NULL, n, in, out));
    CHECK_OK(fsdp_linear_backward(dx, dw, NULL, dy, x, w, n, in, out));
    float *w_pad = calloc((size_t)(out * in + off), 4), *zeros = calloc((size_t)(out * in + off), 4);
    memcpy(w_pad + off, w, sizeof(float) * (size_t)(out * in));
    void *WB = up(w_pad, out * in + off, dt), *X = up(x, n * in, dt), *DY = up(dy, n * out, dt), *WA = up(w, out * in, dt);
    for (int pass = 0; pass < 3; pass++) {
      const void *W = pass < 2 ? (const char *)WB + off * es : WA;
      void *GB = up(zeros, out * in + off, dt), *Y = poisoned(n * out, dt), *DX = poisoned(n * in, dt);
      CHECK_OK(fsdp_cuda_linear_forward(Y, X, W, NULL, n, in, out, dt, NULL));
      CHECK_OK(fsdp_cuda_linear_backward(DX, (char *)GB + off * es, NULL, DY, X, W, n, in, out, dt, NULL));
      float *gw = down((char *)GB + off * es, out * in, dt);
      void *G = up(gw, out * in, dt);
      same(pass < 2 ? "linear y (weight view at 16 elements)" : "linear y (aligned weight)", dt, Y, y, n * out, 2e-5);
      same("linear dx (weight view)", dt, DX, dx, n * in, 2e-5);
      same("linear dW (into a view)", dt, G, dw, out * in, 2e-5);
      free(gw);
      fsdp_free(FSDP_CUDA, GB);
    }
    void *bufs[] = {WB, X, DY, WA};
    for (int i = 0; i < 4; i++) fsdp_free(FSDP_CUDA, bufs[i]);
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(w_pad), free(zeros);
  }
}

static void test_linear(void) {
  const int64_t n = 33, in = 48, out = 40;
  DT_LOOP {
    float *x = rand_host(n * in, 1, dt), *w = rand_host(out * in, 0.5f, dt), *b = rand_host(out, 0.5f, dt);
    float *dy = rand_host(n * out, 1, dt), *dw0 = rand_host(out * in, 1, dt), *db0 = rand_host(out, 1, dt);
    float *y = malloc(sizeof(float) * n * out), *dx = malloc(sizeof(float) * n * in);
    float *dw = malloc(sizeof(float) * out * in), *db = malloc(sizeof(float) * out);
    memcpy(dw, dw0, sizeof(float) * out * in);
    memcpy(db, db0, sizeof(float) * out);
    CHECK_OK(fsdp_linear_forward(y, x, w, b, n, in, out));
    CHECK_OK(fsdp_linear_backward(dx, dw, db, dy, x, w, n, in, out));
    void *X = up(x, n * in, dt), *Wd = up(w, out * in, dt), *B = up(b, out, dt), *DY = up(dy, n * out, dt);
    void *Y = poisoned(n * out, dt), *DX = poisoned(n * in, dt), *DW = up(dw0, out * in, dt), *DB = up(db0, out, dt);
    CHECK_OK(fsdp_cuda_linear_forward(Y, X, Wd, B, n, in, out, dt, NULL));
    CHECK_OK(fsdp_cuda_linear_backward(DX, DW, DB, DY, X, Wd, n, in, out, dt, NULL));
    same("linear y", dt, Y, y, n * out, 2e-5);
    same("linear dx", dt, DX, dx, n * in, 2e-5);
    same("linear dW (accumulated)", dt, DW, dw, out * in, 2e-5);
    same("linear db (accumulated)", dt, DB, db, out, 2e-5);
    void *bufs[] = {X, Wd, B, DY};
    for (int i = 0; i < 4; i++) fsdp_free(FSDP_CUDA, bufs[i]);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw), free(db);
  }
  CHECK_FAILS(fsdp_cuda_linear_forward(NULL, NULL, NULL, NULL, 4, 0, 3, FSDP_FP32, NULL), FSDP_EINVAL, "in = 0");
  CHECK_FAILS(fsdp_cuda_linear_forward(NULL, NULL, NULL, NULL, 4, 2, 3, FSDP_FP16, NULL), FSDP_EINVAL, "fp32 or bf16");
}

static void test_embedding(void) {
  const int64_t n = 37, vocab = 50, dim = 64;
  int32_t ids[37];
  for (int i = 0; i < n; i++) ids[i] = (i * 17 + 3) % vocab;
  ids[5] = ids[9] = 7; /* repeated ids accumulate */
  int32_t *IDS = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof ids, (void **)&IDS));
  CHECK_OK(fsdp_memcpy(IDS, ids, sizeof ids, NULL));
  DT_LOOP {
    float *t = rand_host(vocab * dim, 1, dt), *dy = rand_host(n * dim, 1, dt), *dt0 = rand_host(vocab * dim, 1, dt);
    float *y = malloc(sizeof(float) * n * dim), *dtab = malloc(sizeof(float) * vocab * dim);
    memcpy(dtab, dt0, sizeof(float) * vocab * dim);
    CHECK_OK(fsdp_embedding_forward(y, ids, t, n, vocab, dim));
    CHECK_OK(fsdp_embedding_backward(dtab, dy, ids, n, vocab, dim));
    void *T = up(t, vocab * dim, dt), *DY = up(dy, n * dim, dt), *Y = poisoned(n * dim, dt), *DT = up(dt0, vocab * dim, dt);
    CHECK_OK(fsdp_cuda_embedding_forward(Y, IDS, T, n, vocab, dim, dt, NULL));
    CHECK_OK(fsdp_cuda_embedding_backward(DT, DY, IDS, n, vocab, dim, dt, NULL));
    same("embedding y", dt, Y, y, n * dim, 0);
    same("embedding dtable (accumulated)", dt, DT, dtab, vocab * dim, 2e-6);
    fsdp_free(FSDP_CUDA, T), fsdp_free(FSDP_CUDA, DY);
    free(t), free(dy), free(dt0), free(y), free(dtab);
  }
  fsdp_free(FSDP_CUDA, IDS);
}

static void test_rmsnorm(void) {
  const int64_t n = 300, dim = 200; /* 300 rows: the dw kernel's row chunks */
  DT_LOOP {
    float *x = rand_host(n * dim, 2, dt), *w = rand_host(dim, 1, dt), *dy = rand_host(n * dim, 1, dt);
    float *dw0 = rand_host(dim, 1, dt);
    float *y = malloc(sizeof(float) * n * dim), *rstd = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n * dim);
    float *dw = malloc(sizeof(float) * dim);
    memcpy(dw, dw0, sizeof(float) * dim);
    CHECK_OK(fsdp_rmsnorm_forward(y, rstd, x, w, n, dim, 1e-5f));
    CHECK_OK(fsdp_rmsnorm_backward(dx, dw, dy, x, w, rstd, n, dim));
    void *X = up(x, n * dim, dt), *Wd = up(w, dim, dt), *DY = up(dy, n * dim, dt), *Y = poisoned(n * dim, dt);
    void *R = poisoned(n, FSDP_FP32), *DX = poisoned(n * dim, dt), *DW = up(dw0, dim, dt);
    CHECK_OK(fsdp_cuda_rmsnorm_forward(Y, R, X, Wd, n, dim, 1e-5f, dt, NULL));
    CHECK_OK(fsdp_cuda_rmsnorm_backward(DX, DW, DY, X, Wd, R, n, dim, dt, NULL));
    same("rmsnorm y", dt, Y, y, n * dim, 2e-5);
    float *rg = down(R, n, FSDP_FP32);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(rg[i] - rstd[i]) / rstd[i]);
    CHECK(worst <= 1e-5);
    free(rg);
    fsdp_free(FSDP_CUDA, R);
    same("rmsnorm dx", dt, DX, dx, n * dim, 2e-5);
    same("rmsnorm dw (accumulated)", dt, DW, dw, dim, 1e-4);
    fsdp_free(FSDP_CUDA, X), fsdp_free(FSDP_CUDA, Wd), fsdp_free(FSDP_CUDA, DY);
    free(x), free(w), free(dy), free(dw0), free(y), free(rstd), free(dx), free(dw);
  }
}

/* Gradients summed over many rows into a bf16 grad: the embedding table of
 * a frequent token (4096 rows over 8 ids, one id in a third of them) and
 * RMSNorm's weight (4096 rows). Summed in fp32 and rounded once, they are
 * within a bf16 rounding of the CPU's fp32 sum (5e-3 of the largest value);
 * a bf16 add per row or per chunk of rows is not. */
static void test_grad_sums(void) {
  const int64_t n = 4096, vocab = 8, dim = 256;
  int32_t *ids = malloc(sizeof(int32_t) * n), *IDS = NULL;
  for (int64_t i = 0; i < n; i++) ids[i] = i % 3 == 0 ? 5 : (int32_t)((i * 7) % vocab);
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof(int32_t) * n, (void **)&IDS));
  CHECK_OK(fsdp_memcpy(IDS, ids, sizeof(int32_t) * n, NULL));
  DT_LOOP {
    double tol = dt == FSDP_BF16 ? 5e-3 : 1e-5;
    float *dy = rand_host(n * dim, 1, dt), *t0 = rand_host(vocab * dim, 1, dt), *tab = malloc(sizeof(float) * vocab * dim);
    memcpy(tab, t0, sizeof(float) * vocab * dim);
    CHECK_OK(fsdp_embedding_backward(tab, dy, ids, n, vocab, dim));
    void *DY = up(dy, n * dim, dt), *DT = up(t0, vocab * dim, dt);
    CHECK_OK(fsdp_cuda_embedding_backward(DT, DY, IDS, n, vocab, dim, dt, NULL));
    same_tol("embedding dtable, 4096 rows over 8 ids", dt, DT, tab, vocab * dim, tol);
    float *x = rand_host(n * dim, 2, dt), *w = rand_host(dim, 1, dt), *dw0 = rand_host(dim, 1, dt);
    float *y = malloc(sizeof(float) * n * dim), *rstd = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n * dim);
    float *dw = malloc(sizeof(float) * dim);
    memcpy(dw, dw0, sizeof(float) * dim);
    CHECK_OK(fsdp_rmsnorm_forward(y, rstd, x, w, n, dim, 1e-5f));
    CHECK_OK(fsdp_rmsnorm_backward(dx, dw, dy, x, w, rstd, n, dim));
    void *X = up(x, n * dim, dt), *Wd = up(w, dim, dt), *R = poisoned(n, FSDP_FP32), *Y = poisoned(n * dim, dt);
    void *DX = poisoned(n * dim, dt), *DW = up(dw0, dim, dt);
    CHECK_OK(fsdp_cuda_rmsnorm_forward(Y, R, X, Wd, n, dim, 1e-5f, dt, NULL));
    CHECK_OK(fsdp_cuda_rmsnorm_backward(DX, DW, DY, X, Wd, R, n, dim, dt, NULL));
    same_tol("rmsnorm dw, 4096 rows", dt, DW, dw, dim, tol);
    void *bufs[] = {DY, X, Wd, R, Y, DX};
    for (int i = 0; i < 6; i++) fsdp_free(FSDP_CUDA, bufs[i]);
    free(dy), free(t0), free(tab), free(x), free(w), free(dw0), free(y), free(rstd), free(dx), free(dw);
  }
  free(ids);
  fsdp_free(FSDP_CUDA, IDS);
}

static void test_rope(void) {
  const int64_t B = 2, T = 9, H = 3, D = 16, n = B * T * H * D;
  float *c = malloc(sizeof(float) * T * D), *s = malloc(sizeof(float) * T * D);
  fsdp_rope_scaling sc = {
      .factor = 8.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_position_embeddings = 8};
  CHECK_OK(fsdp_rope_table(c, s, T, D, 10000.0, &sc));
  void *Cd = up(c, T * D, FSDP_FP32), *Sd = up(s, T * D, FSDP_FP32);
  DT_LOOP {
    float *x = rand_host(n, 1, dt), *ref = malloc(sizeof(float) * n), *bref = malloc(sizeof(float) * n);
    memcpy(ref, x, sizeof(float) * n);
    memcpy(bref, x, sizeof(float) * n);
    CHECK_OK(fsdp_rope_forward(ref, c, s, B, T, H, D));
    CHECK_OK(fsdp_rope_backward(bref, c, s, B, T, H, D));
    void *X = up(x, n, dt), *X2 = up(x, n, dt);
    CHECK_OK(fsdp_cuda_rope_forward(X, Cd, Sd, B, T, H, D, dt, NULL));
    CHECK_OK(fsdp_cuda_rope_backward(X2, Cd, Sd, B, T, H, D, dt, NULL));
    same("rope forward", dt, X, ref, n, 2e-6);
    same("rope backward", dt, X2, bref, n, 2e-6);
    free(x), free(ref), free(bref);
  }
  CHECK_FAILS(fsdp_cuda_rope_forward(NULL, NULL, NULL, 1, 1, 1, 3, FSDP_FP32, NULL), FSDP_EINVAL, "even");
  fsdp_free(FSDP_CUDA, Cd), fsdp_free(FSDP_CUDA, Sd);
  free(c), free(s);
}

/* one attention op on the device against its CPU twin: random inputs on
 * both sides (q times qscale; bf16: rounded, the CPU op's the same), the
 * CPU op's out .. dv for the caller to fill, the device's O, L (then DQ,
 * DK, DV) poisoned */
typedef struct {
  int dt;
  int64_t nq, nk, nl;
  float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv, *og, *lg;
  void *Q, *K, *V, *DO, *O, *L, *DQ, *DK, *DV;
} attn_check;

static void attn_check_start(attn_check *a, int dt, int64_t nq, int64_t nk, int64_t nl, float qscale) {
  a->dt = dt, a->nq = nq, a->nk = nk, a->nl = nl;
  a->q = rand_host(nq, qscale, dt), a->k = rand_host(nk, 1, dt), a->v = rand_host(nk, 1, dt);
  a->dout = rand_host(nq, 1, dt);
  a->out = malloc(sizeof(float) * nq), a->lse = malloc(sizeof(float) * nl);
  a->dq = malloc(sizeof(float) * nq), a->dk = malloc(sizeof(float) * nk), a->dv = malloc(sizeof(float) * nk);
  a->Q = up(a->q, nq, dt), a->K = up(a->k, nk, dt), a->V = up(a->v, nk, dt), a->DO = up(a->dout, nq, dt);
  a->O = poisoned(nq, dt), a->L = poisoned(nl, FSDP_FP32);
}

/* after the device's forward: its out and lse on the host in og, lg (the
 * CPU backward runs from them: bf16, its rounded output) */
static void attn_check_forward_done(attn_check *a) {
  a->og = down(a->O, a->nq, a->dt), a->lg = down(a->L, a->nl, FSDP_FP32);
  a->DQ = poisoned(a->nq, a->dt), a->DK = poisoned(a->nk, a->dt), a->DV = poisoned(a->nk, a->dt);
}

/* the device's out, lse, dq, dk, dv against the CPU op's (what: the case;
 * kind: "attention", "attention docs", ...); frees everything */
static void attn_check_finish(attn_check *a, const char *what, const char *kind) {
  char label[96];
  const int dt = a->dt;
  same(what, dt, a->O, a->out, a->nq, 2e-5);
  snprintf(label, sizeof label, "%s lse", kind);
  same(label, FSDP_FP32, a->L, a->lse, a->nl, dt == FSDP_BF16 ? 1e-3 : 2e-6);
  snprintf(label, sizeof label, "%s dq", kind);
  same(label, dt, a->DQ, a->dq, a->nq, 5e-5);
  snprintf(label, sizeof label, "%s dk", kind);
  same(label, dt, a->DK, a->dk, a->nk, 5e-5);
  snprintf(label, sizeof label, "%s dv", kind);
  same(label, dt, a->DV, a->dv, a->nk, 5e-5);
  void *bufs[] = {a->Q, a->K, a->V, a->DO};
  for (int i = 0; i < 4; i++) fsdp_free(FSDP_CUDA, bufs[i]);
  float *host[] = {a->q, a->k, a->v, a->dout, a->out, a->lse, a->dq, a->dk, a->dv, a->og, a->lg};
  for (int i = 0; i < 11; i++) free(host[i]);
}

static const char *impl_name(int impl) {
  return impl == FSDP_ATTN_SIMPLE ? "fp32 cores" : impl == FSDP_ATTN_CUDNN ? "cudnn" : impl == FSDP_ATTN_OWN ? "own" : "auto";
}

/* fwd, bwd: the kernel family asked for the forward and for the backward
 * (FSDP_ATTN_SIMPLE: the fp32 CUDA-core kernels; _OWN: tensor cores where
 * they apply; _CUDNN: cuDNN, bf16 only; _AUTO). Different families in one
 * call check that they share one lse: the backward gets the forward's. */
static void test_attention_impls(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int fwd, int bwd) {
  int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
  DT_LOOP {
    if (dt != FSDP_BF16 && (fwd == FSDP_ATTN_CUDNN || bwd == FSDP_ATTN_CUDNN)) continue;
    attn_check a;
    attn_check_start(&a, dt, nq, nk, nl, 1);
    CHECK_OK(fsdp_attention_forward(a.out, a.lse, a.q, a.k, a.v, B, T, H, Hkv, D));
    CHECK(fsdp_cuda_attention_impl_set(fwd) >= 0);
    CHECK_OK(fsdp_cuda_attention_forward(a.O, a.L, a.Q, a.K, a.V, B, T, H, Hkv, D, dt, NULL));
    attn_check_forward_done(&a); /* backward from the device's own forward (bf16: its rounded output) */
    CHECK_OK(fsdp_attention_backward(a.dq, a.dk, a.dv, a.dout, a.q, a.k, a.v, a.og, a.lg, B, T, H, Hkv, D));
    CHECK(fsdp_cuda_attention_impl_set(bwd) >= 0);
    CHECK_OK(fsdp_cuda_attention_backward(a.DQ, a.DK, a.DV, a.DO, a.Q, a.K, a.V, a.O, a.L, B, T, H, Hkv, D, dt, NULL));
    char what[128];
    snprintf(what, sizeof what, "attention (%s, backward %s) B%lld T%lld H%lld/%lld D%lld", impl_name(fwd),
             impl_name(bwd), (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
    attn_check_finish(&a, what, "attention");
  }
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_AUTO) >= 0);
}

/* 1 when cuDNN takes this bf16 shape here (else says why, once per shape) */
static int cudnn_takes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  char why[512];
  int k = fsdp_cuda_attention_choice(FSDP_BF16, B, T, H, Hkv, D, 1, why, sizeof why);
  CHECK(k >= 0);
  if (k == FSDP_ATTN_CUDNN) return 1;
  printf("cuDNN attention not checked at B%lld T%lld H%lld/%lld D%lld: %s\n", (long long)B, (long long)T, (long long)H,
         (long long)Hkv, (long long)D, why);
  return 0;
}

static void test_attention(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  test_attention_impls(B, T, H, Hkv, D, FSDP_ATTN_SIMPLE, FSDP_ATTN_SIMPLE);
  test_attention_impls(B, T, H, Hkv, D, FSDP_ATTN_OWN, FSDP_ATTN_OWN);
  if (D % 8 == 0 && cudnn_takes(B, T, H, Hkv, D)) {
    test_attention_impls(B, T, H, Hkv, D, FSDP_ATTN_CUDNN, FSDP_ATTN_CUDNN);
    /* one lse for every family: cuDNN's forward into ours and back */
    test_attention_impls(B, T, H, Hkv, D, FSDP_ATTN_CUDNN, FSDP_ATTN_OWN);
    test_attention_impls(B, T, H, Hkv, D, FSDP_ATTN_OWN, FSDP_ATTN_CUDNN);
  }
}

/* generation's attention against a KV cache: queries at pos against a cache
 * of cap rows, the rows past pos + tq NaN (never read), vs the CPU op */
static void test_attention_cached(int64_t B, int64_t tq, int64_t pos, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t cap = pos + tq + 3, nq = B * tq * H * D, nc = B * cap * Hkv * D;
  DT_LOOP {
    float *q = rand_host(nq, 1, dt), *k = rand_host(nc, 1, dt), *v = rand_host(nc, 1, dt), *ref = malloc(sizeof(float) * nq);
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = (pos + tq) * Hkv * D; i < cap * Hkv * D; i++) k[b * cap * Hkv * D + i] = v[b * cap * Hkv * D + i] = NAN;
    CHECK_OK(fsdp_attention_cached(ref, q, k, v, B, tq, pos, cap, H, Hkv, D));
    void *Q = up(q, nq, dt), *K = up(k, nc, dt), *V = up(v, nc, dt), *O = poisoned(nq, dt);
    CHECK_OK(fsdp_cuda_attention_cached(O, Q, K, V, B, tq, pos, cap, H, Hkv, D, dt, NULL));
    char what[96];
    snprintf(what, sizeof what, "attention_cached B%lld tq%lld pos%lld H%lld/%lld D%lld", (long long)B, (long long)tq,
             (long long)pos, (long long)H, (long long)Hkv, (long long)D);
    same(what, dt, O, ref, nq, 2e-6);
    fsdp_free(FSDP_CUDA, Q), fsdp_free(FSDP_CUDA, K), fsdp_free(FSDP_CUDA, V);
    free(q), free(k), free(v), free(ref);
  }
}

/* packed rows: doc_start for row b of T, documents cut by a list of
 * lengths (1 to 90, across the kernels' 32-row blocks); row `whole` is one
 * document (all 0) */
static void docs_layout(int32_t *ds, int64_t B, int64_t T, int64_t whole) {
  static const int lens[] = {5, 1, 40, 17, 90, 3, 33, 64, 2, 21};
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0, start = 0, d = b * 8; t < T; t++) {
      if (b != whole && t - start == lens[d % 10]) start = t, d++;
      ds[b * T + t] = (int32_t)start;
    }
}

/* fsdp_cuda_attention_*_docs and rope_*_at against their CPU twins; the
 * docs calls run our fp32 CUDA-core kernels whatever the impl setting (set
 * to tensor cores here, which fp32 would refuse); doc_start all 0 gives the
 * causal fp32-core kernels' bits */
static void test_attention_docs(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t whole) {
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
  int32_t *ds = malloc(sizeof(int32_t) * B * T), *pos = malloc(sizeof(int32_t) * B * T), *DS = NULL, *POS = NULL;
  docs_layout(ds, B, T, whole);
  for (int64_t i = 0; i < B * T; i++) pos[i] = (int32_t)(i % T - ds[i]);
  CHECK_OK(fsdp_doc_start_check(ds, B, T));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof(int32_t) * B * T, (void **)&DS));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof(int32_t) * B * T, (void **)&POS));
  CHECK_OK(fsdp_memcpy(DS, ds, sizeof(int32_t) * B * T, NULL));
  CHECK_OK(fsdp_memcpy(POS, pos, sizeof(int32_t) * B * T, NULL));
  char what[160];
  DT_LOOP {
    attn_check a;
    attn_check_start(&a, dt, nq, nk, nl, 2);
    CHECK_OK(fsdp_attention_forward_docs(a.out, a.lse, a.q, a.k, a.v, ds, B, T, H, Hkv, D));
    CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES) >= 0);
    CHECK_OK(fsdp_cuda_attention_forward_docs(a.O, a.L, a.Q, a.K, a.V, DS, B, T, H, Hkv, D, dt, NULL));
    attn_check_forward_done(&a); /* backward from the device's own forward */
    CHECK_OK(fsdp_attention_backward_docs(a.dq, a.dk, a.dv, a.dout, a.q, a.k, a.v, a.og, a.lg, ds, B, T, H, Hkv, D));
    CHECK_OK(fsdp_cuda_attention_backward_docs(a.DQ, a.DK, a.DV, a.DO, a.Q, a.K, a.V, a.O, a.L, DS, B, T, H, Hkv, D, dt,
                                               NULL));
    { /* doc_start all 0: the causal fp32-core kernels' bits (out, lse) */
      int32_t *zero = calloc((size_t)(B * T), sizeof(int32_t));
      void *Z = NULL, *O2 = poisoned(nq, dt), *L2 = poisoned(nl, FSDP_FP32);
      void *O3 = poisoned(nq, dt), *L3 = poisoned(nl, FSDP_FP32);
      CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof(int32_t) * B * T, &Z));
      CHECK_OK(fsdp_memcpy(Z, zero, sizeof(int32_t) * B * T, NULL));
      CHECK_OK(fsdp_cuda_attention_forward_docs(O2, L2, a.Q, a.K, a.V, Z, B, T, H, Hkv, D, dt, NULL));
      CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_SIMPLE) >= 0);
      CHECK_OK(fsdp_cuda_attention_forward(O3, L3, a.Q, a.K, a.V, B, T, H, Hkv, D, dt, NULL));
      size_t es = fsdp_dtype_size(dt);
      void *h2 = malloc(es * nq), *h3 = malloc(es * nq), *l2 = malloc(4 * nl), *l3 = malloc(4 * nl);
      CHECK_OK(fsdp_memcpy(h2, O2, es * nq, NULL));
      CHECK_OK(fsdp_memcpy(h3, O3, es * nq, NULL));
      CHECK_OK(fsdp_memcpy(l2, L2, 4 * nl, NULL));
      CHECK_OK(fsdp_memcpy(l3, L3, 4 * nl, NULL));
      CHECK(!memcmp(h2, h3, es * nq) && !memcmp(l2, l3, 4 * nl));
      CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES) >= 0);
      void *bufs[] = {Z, O2, L2, O3, L3};
      for (int i = 0; i < 5; i++) fsdp_free(FSDP_CUDA, bufs[i]);
      free(zero), free(h2), free(h3), free(l2), free(l3);
    }
    snprintf(what, sizeof what, "attention docs B%lld T%lld H%lld/%lld D%lld", (long long)B, (long long)T, (long long)H,
             (long long)Hkv, (long long)D);
    attn_check_finish(&a, what, "attention docs");
    /* rope at positions t - doc_start[t] (q's layout) */
    float *c = malloc(sizeof(float) * T * D), *sn = malloc(sizeof(float) * T * D);
    CHECK_OK(fsdp_rope_table(c, sn, T, D, 500000.0, NULL));
    float *x = rand_host(nq, 1, dt), *ref = malloc(sizeof(float) * nq), *bref = malloc(sizeof(float) * nq);
    memcpy(ref, x, sizeof(float) * nq), memcpy(bref, x, sizeof(float) * nq);
    CHECK_OK(fsdp_rope_forward_at(ref, c, sn, pos, B, T, H, D));
    CHECK_OK(fsdp_rope_backward_at(bref, c, sn, pos, B, T, H, D));
    void *Cd = up(c, T * D, FSDP_FP32), *Sd = up(sn, T * D, FSDP_FP32), *X = up(x, nq, dt), *X2 = up(x, nq, dt);
    CHECK_OK(fsdp_cuda_rope_forward_at(X, Cd, Sd, POS, B, T, H, D, dt, NULL));
    CHECK_OK(fsdp_cuda_rope_backward_at(X2, Cd, Sd, POS, B, T, H, D, dt, NULL));
    same("rope forward_at", dt, X, ref, nq, 2e-6);
    same("rope backward_at", dt, X2, bref, nq, 2e-6);
    fsdp_free(FSDP_CUDA, Cd), fsdp_free(FSDP_CUDA, Sd);
    free(c), free(sn), free(x), free(ref), free(bref);
  }
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_AUTO) >= 0);
  fsdp_free(FSDP_CUDA, DS), fsdp_free(FSDP_CUDA, POS);
  free(ds), free(pos);
}

/* the packed-row cases alone (`test_kernels docs`: scripts/gpu_check.sh's docs stage) */
static void test_docs_all(void) {
  test_attention_docs(2, 70, 4, 2, 16, 0);   /* row 0 one document, row 1 several */
  test_attention_docs(2, 70, 4, 2, 64, -1);  /* documents in both rows */
  test_attention_docs(2, 150, 8, 2, 128, 1);
  test_attention_docs(1, 512, 32, 8, 64, -1); /* the Llama 3.2 1B head shape */
  test_attention_docs(1, 100, 2, 1, 64, 0);  /* doc_start all 0 */
}

/* fsdp_cuda_attention_*_pos (a context-parallel rank's queries: chunks r
 * and 2 cp - 1 - r of 2 cp, at their positions of the whole sequence's T
 * keys) against the CPU op; our fp32 CUDA-core kernels whatever the impl
 * setting (tensor cores here, which fp32 would refuse); dk, dv the whole
 * sequence's */
static void test_attention_pos(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int cp, int rank) {
  const int64_t c = T / (2 * cp), tq = 2 * c, nq = B * tq * H * D, nk = B * T * Hkv * D, nl = B * H * tq;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)tq), *POS = NULL;
  for (int64_t i = 0; i < c; i++) pos[i] = (int32_t)(rank * c + i), pos[c + i] = (int32_t)((2 * cp - 1 - rank) * c + i);
  CHECK_OK(fsdp_attention_pos_check(pos, tq, T));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof(int32_t) * (size_t)tq, (void **)&POS));
  CHECK_OK(fsdp_memcpy(POS, pos, sizeof(int32_t) * (size_t)tq, NULL));
  char what[160];
  DT_LOOP {
    attn_check a;
    attn_check_start(&a, dt, nq, nk, nl, 2);
    CHECK_OK(fsdp_attention_forward_pos(a.out, a.lse, a.q, a.k, a.v, pos, B, tq, T, H, Hkv, D));
    CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES) >= 0);
    CHECK_OK(fsdp_cuda_attention_forward_pos(a.O, a.L, a.Q, a.K, a.V, POS, B, tq, T, H, Hkv, D, dt, NULL));
    attn_check_forward_done(&a); /* backward from the device's own forward */
    CHECK_OK(fsdp_attention_backward_pos(a.dq, a.dk, a.dv, a.dout, a.q, a.k, a.v, a.og, a.lg, pos, B, tq, T, H, Hkv, D));
    CHECK_OK(fsdp_cuda_attention_backward_pos(a.DQ, a.DK, a.DV, a.DO, a.Q, a.K, a.V, a.O, a.L, POS, B, tq, T, H, Hkv, D,
                                              dt, NULL));
    snprintf(what, sizeof what, "attention pos B%lld T%lld H%lld/%lld D%lld cp %d rank %d", (long long)B, (long long)T,
             (long long)H, (long long)Hkv, (long long)D, cp, rank);
    attn_check_finish(&a, what, "attention pos");
  }
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_AUTO) >= 0);
  fsdp_free(FSDP_CUDA, POS);
  free(pos);
}

/* the positional cases alone (`test_kernels pos`) */
static void test_pos_all(void) {
  test_attention_pos(2, 140, 4, 2, 16, 2, 0); /* chunks of 35: across the 32-row blocks */
  test_attention_pos(2, 140, 4, 2, 64, 2, 1);
  test_attention_pos(1, 512, 32, 8, 64, 2, 0); /* the Llama 3.2 1B head shape */
  test_attention_pos(1, 512, 8, 2, 128, 4, 3);
  test_attention_pos(1, 100, 2, 1, 64, 1, 0); /* q_pos[i] = i */
}

static void test_attention_choice(void) {
  /* asking for a family where it does not apply is an error, not a fallback */
  void *Q = poisoned(64, FSDP_FP32), *O = poisoned(64, FSDP_FP32), *L = poisoned(4, FSDP_FP32);
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_TENSOR_CORES) >= 0);
  CHECK_FAILS(fsdp_cuda_attention_forward(O, L, Q, Q, Q, 1, 4, 1, 1, 16, FSDP_FP32, NULL), FSDP_EUNSUPPORTED, "tensor-core");
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_CUDNN) == FSDP_ATTN_TENSOR_CORES);
  CHECK_FAILS(fsdp_cuda_attention_forward(O, L, Q, Q, Q, 1, 4, 1, 1, 16, FSDP_FP32, NULL), FSDP_EUNSUPPORTED, "bf16 only");
  CHECK_FAILS(fsdp_cuda_attention_impl_set(7), FSDP_EINVAL, "expected");
  CHECK(fsdp_cuda_attention_impl_set(FSDP_ATTN_AUTO) == FSDP_ATTN_CUDNN);
  /* fp32 never goes to cuDNN or the tensor cores */
  char desc[512];
  CHECK(fsdp_cuda_attention_choice(FSDP_FP32, 1, 64, 4, 2, 64, 0, desc, sizeof desc) == FSDP_ATTN_SIMPLE);
  CHECK(strstr(desc, "bf16 only") != NULL);
  fsdp_free(FSDP_CUDA, Q), fsdp_free(FSDP_CUDA, O), fsdp_free(FSDP_CUDA, L);
}

static void test_elementwise(void) {
  const int64_t n = 10007;
  DT_LOOP {
    float *a = rand_host(n, 3, dt), *b = rand_host(n, 3, dt), *dy = rand_host(n, 1, dt);
    float *y = malloc(sizeof(float) * n), *dg = malloc(sizeof(float) * n), *du = malloc(sizeof(float) * n);
    float *s = malloc(sizeof(float) * n), *sa = malloc(sizeof(float) * n);
    CHECK_OK(fsdp_swiglu_forward(y, a, b, n));
    CHECK_OK(fsdp_swiglu_backward(dg, du, dy, a, b, n));
    CHECK_OK(fsdp_add(s, a, b, n));
    memcpy(sa, a, sizeof(float) * n);
    CHECK_OK(fsdp_scale_add(sa, -0.75f, b, n));
    void *A = up(a, n, dt), *Bd = up(b, n, dt), *DY = up(dy, n, dt), *Y = poisoned(n, dt), *DG = poisoned(n, dt);
    void *DU = poisoned(n, dt), *S = poisoned(n, dt), *SA = up(a, n, dt);
    CHECK_OK(fsdp_cuda_swiglu_forward(Y, A, Bd, n, dt, NULL));
    CHECK_OK(fsdp_cuda_swiglu_backward(DG, DU, DY, A, Bd, n, dt, NULL));
    CHECK_OK(fsdp_cuda_add(S, A, Bd, n, dt, NULL));
    CHECK_OK(fsdp_cuda_scale_add(SA, -0.75f, Bd, n, dt, NULL));
    same("swiglu y", dt, Y, y, n, 2e-6);
    same("swiglu dgate", dt, DG, dg, n, 2e-6);
    same("swiglu dup", dt, DU, du, n, 2e-6);
    /* in place over gate and up, as the MLP's backward runs it */
    CHECK_OK(fsdp_cuda_swiglu_backward(A, Bd, DY, A, Bd, n, dt, NULL));
    same("swiglu dgate in place", dt, A, dg, n, 2e-6);
    same("swiglu dup in place", dt, Bd, du, n, 2e-6);
    same("add", dt, S, s, n, 0);
    same("scale_add", dt, SA, sa, n, 2e-7);
    fsdp_free(FSDP_CUDA, A), fsdp_free(FSDP_CUDA, Bd), fsdp_free(FSDP_CUDA, DY);
    free(a), free(b), free(dy), free(y), free(dg), free(du), free(s), free(sa);
  }
}

/* the device's loss sum and count (sums: a double, then an int64) against
 * the CPU op's, and the count against the rows that count */
static void same_loss(const void *sums, double loss, int64_t cnt, int64_t rows) {
  double got[2];
  CHECK_OK(fsdp_memcpy(got, sums, 16, NULL));
  int64_t gc;
  memcpy(&gc, &got[1], 8);
  CHECK(gc == cnt && cnt == rows);
  CHECK(fabs(got[0] - loss) <= 1e-5 * fabs(loss));
}

static void test_cross_entropy(void) {
  const int64_t n = 13, V = 3001;
  int32_t tg[13];
  for (int i = 0; i < n; i++) tg[i] = (i * 977 + 11) % V;
  tg[4] = -100; /* ignored */
  int32_t *TG = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof tg, (void **)&TG));
  CHECK_OK(fsdp_memcpy(TG, tg, sizeof tg, NULL));
  void *sums = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 16, &sums));
  DT_LOOP {
    float *x = rand_host(n * V, 4, dt), *d = malloc(sizeof(float) * n * V);
    double loss;
    int64_t cnt;
    CHECK_OK(fsdp_cross_entropy(&loss, &cnt, d, x, tg, n, V, -100, 0.25f));
    void *X = up(x, n * V, dt);
    CHECK_OK(fsdp_cuda_cross_entropy((double *)sums, (int64_t *)sums + 1, X, X, TG, n, V, -100, 0.25f, dt, NULL));
    same_loss(sums, loss, cnt, n - 1);
    same("cross_entropy dlogits (in place)", dt, X, d, n * V, 2e-5);
    free(x), free(d);
  }
  fsdp_free(FSDP_CUDA, TG), fsdp_free(FSDP_CUDA, sums);
}

/* Tensor parallelism's vocab-parallel ops, each rank's slice of tp = 3
 * (rows, or columns of the logits, [r V/3, (r+1) V/3)): the embedding's
 * forward (bit for bit) and backward; the cross-entropy's passes, the
 * all-gather and all-reduce between them done here as fsdp.tp does, with
 * the gathered stats combined on the device. */
static void test_vocab_parallel(void) {
  const int64_t n = 37, V = 3003, tp = 3, cols = V / tp, dim = 64;
  int32_t ids[37], tg[37];
  for (int i = 0; i < n; i++) ids[i] = (i * 977 + 11) % V, tg[i] = (i * 131 + 5) % V;
  ids[5] = ids[9] = 1001, tg[4] = -100; /* a repeated id at a slice's edge; an ignored row */
  int32_t *IDS = NULL, *TG = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof ids, (void **)&IDS));
  CHECK_OK(fsdp_memcpy(IDS, ids, sizeof ids, NULL));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof tg, (void **)&TG));
  CHECK_OK(fsdp_memcpy(TG, tg, sizeof tg, NULL));
  void *sums = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 16, &sums));
  DT_LOOP {
    for (int64_t r = 0; r < tp; r++) { /* the embedding: rank r's rows */
      float *t = rand_host(cols * dim, 1, dt), *dy = rand_host(n * dim, 1, dt), *t0 = rand_host(cols * dim, 1, dt);
      float *y = malloc(sizeof(float) * n * dim), *tab = malloc(sizeof(float) * cols * dim);
      memcpy(tab, t0, sizeof(float) * cols * dim);
      CHECK_OK(fsdp_embedding_forward_slice(y, ids, t, n, V, r * cols, cols, dim));
      CHECK_OK(fsdp_embedding_backward_slice(tab, dy, ids, n, V, r * cols, cols, dim));
      void *T = up(t, cols * dim, dt), *DY = up(dy, n * dim, dt), *Y = poisoned(n * dim, dt), *DT = up(t0, cols * dim, dt);
      CHECK_OK(fsdp_cuda_embedding_forward_slice(Y, IDS, T, n, V, r * cols, cols, dim, dt, NULL));
      CHECK_OK(fsdp_cuda_embedding_backward_slice(DT, DY, IDS, n, V, r * cols, cols, dim, dt, NULL));
      same("embedding slice y", dt, Y, y, n * dim, 0);
      same_tol("embedding slice dtable (accumulated)", dt, DT, tab, cols * dim, dt == FSDP_BF16 ? 5e-3 : 2e-6);
      fsdp_free(FSDP_CUDA, T), fsdp_free(FSDP_CUDA, DY);
      free(t), free(dy), free(t0), free(y), free(tab);
    }
    /* the cross-entropy: whole rows split into tp slices, each on the device */
    float *x = rand_host(n * V, 4, dt), *xs[3], *ds[3], st_all[3 * 2 * 37], st[2 * 37], sum[37], part[37];
    void *XS[3], *ALL = poisoned(tp * 2 * n, FSDP_FP32), *ST = poisoned(2 * n, FSDP_FP32), *SUM = poisoned(n, FSDP_FP32);
    for (int64_t r = 0; r < tp; r++) {
      xs[r] = malloc(sizeof(float) * n * cols), ds[r] = malloc(sizeof(float) * n * cols);
      for (int64_t i = 0; i < n; i++) memcpy(xs[r] + i * cols, x + i * V + r * cols, sizeof(float) * cols);
      XS[r] = up(xs[r], n * cols, dt);
      float *s = st_all + r * 2 * n;
      CHECK_OK(fsdp_cross_entropy_vocab_stats(s, s + n, xs[r], tg, n, V, r * cols, cols, -100));
      CHECK_OK(fsdp_cuda_cross_entropy_vocab_stats((float *)ALL + r * 2 * n, (float *)ALL + r * 2 * n + n, XS[r], TG, n, V,
                                                   r * cols, cols, -100, dt, NULL));
    }
    for (int64_t i = 0; i < n; i++) { /* fsdp.tp's combine on the host */
      st[i] = st_all[i], st[n + i] = st_all[n + i];
      for (int64_t r = 1; r < tp; r++) st[i] = fmaxf(st[i], st_all[r * 2 * n + i]), st[n + i] += st_all[r * 2 * n + n + i];
    }
    CHECK_OK(fsdp_cuda_cross_entropy_vocab_combine(ST, (float *)ST + n, ALL, n, (int)tp, NULL));
    float *got = down(ST, 2 * n, FSDP_FP32);
    CHECK(memcmp(got, st, sizeof st) == 0); /* the device's combine: the same bits */
    free(got);
    memset(sum, 0, sizeof sum);
    float *dsum = calloc((size_t)n, sizeof(float));
    for (int64_t r = 0; r < tp; r++) {
      CHECK_OK(fsdp_cross_entropy_vocab_sum(part, xs[r], st, n, cols));
      CHECK_OK(fsdp_cuda_cross_entropy_vocab_sum(SUM, XS[r], ST, n, cols, dt, NULL));
      float *g = down(SUM, n, FSDP_FP32);
      for (int64_t i = 0; i < n; i++) sum[i] += part[i], dsum[i] += g[i];
      free(g);
    }
    void *DSUM = up(dsum, n, FSDP_FP32);
    for (int64_t r = 0; r < tp; r++) {
      double loss;
      int64_t cnt;
      CHECK_OK(fsdp_cross_entropy_vocab_finish(&loss, &cnt, ds[r], xs[r], tg, st, sum, st + n, n, V, r * cols, cols, -100,
                                               0.25f));
      CHECK_OK(fsdp_cuda_cross_entropy_vocab_finish((double *)sums, (int64_t *)sums + 1, XS[r], XS[r], TG, ST, DSUM,
                                                    (float *)ST + n, n, V, r * cols, cols, -100, 0.25f, dt, NULL));
      same_loss(sums, loss, cnt, n - 1);
      same("cross_entropy_vocab dlogits (in place)", dt, XS[r], ds[r], n * cols, 2e-5);
      free(xs[r]), free(ds[r]);
    }
    fsdp_free(FSDP_CUDA, ALL), fsdp_free(FSDP_CUDA, ST), fsdp_free(FSDP_CUDA, SUM), fsdp_free(FSDP_CUDA, DSUM);
    free(x), free(dsum);
  }
  fsdp_free(FSDP_CUDA, IDS), fsdp_free(FSDP_CUDA, TG), fsdp_free(FSDP_CUDA, sums);
}

/* per-token logp, entropy and coef (onehot - softmax): in place over the
 * logits, then logp and entropy alone; logp and entropy are fp32 from the
 * same (rounded) logits in either dtype, so fp32's tolerance */
static void test_token_logprobs(void) {
  const int64_t n = 13, V = 3001;
  int32_t tg[13];
  float cf[13];
  for (int i = 0; i < n; i++) tg[i] = (i * 977 + 11) % V, cf[i] = 0.3f * (float)(i % 5) - 0.7f;
  tg[4] = -100; /* ignored */
  int32_t *TG = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, sizeof tg, (void **)&TG));
  CHECK_OK(fsdp_memcpy(TG, tg, sizeof tg, NULL));
  void *CF = up(cf, n, FSDP_FP32);
  DT_LOOP {
    float *x = rand_host(n * V, 4, dt), *d = malloc(sizeof(float) * n * V), lp[13], en[13];
    CHECK_OK(fsdp_token_logprobs(lp, en, d, x, tg, cf, n, V, -100));
    void *X = up(x, n * V, dt), *X2 = up(x, n * V, dt), *LP = poisoned(n, FSDP_FP32), *EN = poisoned(n, FSDP_FP32);
    CHECK_OK(fsdp_cuda_token_logprobs(LP, EN, X, X, TG, CF, n, V, -100, dt, NULL));
    same_tol("token_logprobs logp", FSDP_FP32, LP, lp, n, 2e-5);
    same_tol("token_logprobs entropy", FSDP_FP32, EN, en, n, 2e-5);
    same("token_logprobs dlogits (in place)", dt, X, d, n * V, 2e-5);
    LP = poisoned(n, FSDP_FP32), EN = poisoned(n, FSDP_FP32);
    CHECK_OK(fsdp_cuda_token_logprobs(LP, EN, NULL, X2, TG, NULL, n, V, -100, dt, NULL));
    same_tol("token_logprobs logp (no dlogits)", FSDP_FP32, LP, lp, n, 2e-5);
    same_tol("token_logprobs entropy (no dlogits)", FSDP_FP32, EN, en, n, 2e-5);
    fsdp_free(FSDP_CUDA, X2);
    free(x), free(d);
  }
  fsdp_free(FSDP_CUDA, TG), fsdp_free(FSDP_CUDA, CF);
}

static void test_optimizers(void) {
  const int64_t n = 5003;
  fsdp_adamw_config cfg = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float *p = rand_host(n, 1, FSDP_FP32), *g = rand_host(n, 1, FSDP_FP32), *m = rand_host(n, 0.1f, FSDP_FP32);
  float *v = rand_host(n, 0.1f, FSDP_FP32);
  for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  g[17] = NAN; /* counted as non-finite by sum_squares, skipped there */
  void *P = up(p, n, FSDP_FP32), *G = up(g, n, FSDP_FP32), *M = up(m, n, FSDP_FP32), *Vd = up(v, n, FSDP_FP32);
  void *OUT = poisoned(n, FSDP_BF16), *sums = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 16, &sums));
  CHECK_OK(fsdp_memset(sums, 0, 16, NULL));
  CHECK_OK(fsdp_cuda_sum_squares(G, FSDP_FP32, n, (double *)sums, (int64_t *)sums + 1, NULL));
  double ss;
  int64_t bad, got[2];
  CHECK_OK(fsdp_sum_squares(g, FSDP_FP32, n, &ss, &bad));
  CHECK_OK(fsdp_memcpy(got, sums, 16, NULL));
  double gs;
  memcpy(&gs, &got[0], 8);
  CHECK(got[1] == bad && bad == 1 && fabs(gs - ss) <= 1e-6 * ss);
  g[17] = 0.5f;
  fsdp_free(FSDP_CUDA, G);
  G = up(g, n, FSDP_FP32);
  uint16_t *pb = malloc(2 * n), *hi = malloc(2 * n), *lo = malloc(2 * n);
  /* split params (base/bf16_split.h): the same start, a tie among them */
  p[5] = fsdp_bf16_join(0x3f81, 0x8000);
  for (int64_t i = 0; i < n; i++) hi[i] = fsdp_bf16_round_away(p[i]), lo[i] = fsdp_bf16_low(p[i]);
  void *HI = NULL, *LO = NULL, *M2 = up(m, n, FSDP_FP32), *V2 = up(v, n, FSDP_FP32);
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 2 * n, &HI));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 2 * n, &LO));
  CHECK_OK(fsdp_memcpy(HI, hi, 2 * n, NULL));
  CHECK_OK(fsdp_memcpy(LO, lo, 2 * n, NULL));
  CHECK_OK(fsdp_memcpy(P, p, 4 * n, NULL));
  for (int step = 1; step <= 3; step++) {
    CHECK_OK(fsdp_adamw_step(p, pb, NULL, g, FSDP_FP32, m, v, n, step, &cfg, 0.5f));
    CHECK_OK(fsdp_cuda_adamw_step(P, OUT, FSDP_BF16, NULL, G, FSDP_FP32, M, Vd, n, step, &cfg, 0.5f, NULL));
    CHECK_OK(fsdp_cuda_adamw_step(NULL, HI, FSDP_BF16, (uint16_t *)LO, G, FSDP_FP32, M2, V2, n, step, &cfg, 0.5f, NULL));
  }
  float *pbf = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++) pbf[i] = fsdp_bf16_to_f32(pb[i]);
  same("adamw param (3 steps)", FSDP_FP32, P, p, n, 1e-6);
  same("adamw m", FSDP_FP32, M, m, n, 1e-6);
  same("adamw v", FSDP_FP32, Vd, v, n, 1e-6);
  same("adamw bf16 copy", FSDP_BF16, OUT, pbf, n, 0);
  /* split on the GPU: the same bits as the GPU's fp32 params and bf16 copy */
  float *pg = malloc(4 * n);
  uint16_t *og = malloc(2 * n);
  CHECK_OK(fsdp_memcpy(pg, P, 4 * n, NULL));
  CHECK_OK(fsdp_memcpy(og, OUT, 2 * n, NULL));
  CHECK_OK(fsdp_memcpy(hi, HI, 2 * n, NULL));
  CHECK_OK(fsdp_memcpy(lo, LO, 2 * n, NULL));
  int split_bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float joined = fsdp_bf16_join(hi[i], lo[i]);
    split_bad += memcmp(&joined, &pg[i], 4) != 0 || hi[i] != og[i];
  }
  CHECK(split_bad == 0);
  CHECK_FAILS(fsdp_cuda_adamw_step(NULL, NULL, FSDP_FP32, NULL, NULL, FSDP_FP32, NULL, NULL, 1, 0, &cfg, 1, NULL), FSDP_EINVAL,
              "first real step is 1");
  CHECK_FAILS(fsdp_cuda_adamw_step(P, HI, FSDP_BF16, (uint16_t *)LO, G, FSDP_FP32, M2, V2, n, 1, &cfg, 1, NULL), FSDP_EINVAL,
              "no fp32 array");
  fsdp_free(FSDP_CUDA, G), fsdp_free(FSDP_CUDA, sums), fsdp_free(FSDP_CUDA, HI), fsdp_free(FSDP_CUDA, LO);
  fsdp_free(FSDP_CUDA, M2), fsdp_free(FSDP_CUDA, V2);
  free(p), free(g), free(m), free(v), free(pb), free(pbf), free(hi), free(lo), free(pg), free(og);
}

/* bf16 grads (a unit's compact grads): the kernels read them as the fp32
 * grads of the same values, bit for bit, for AdamW on split params and
 * SGD; the sum of squares within 1e-6 (its atomic adds run in any order) */
static void test_optimizers_bf16_grads(void) {
  const int64_t n = 5003;
  fsdp_adamw_config cfg = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float *g = rand_host(n, 1, FSDP_FP32), *p = rand_host(n, 1, FSDP_FP32);
  uint16_t *g16 = malloc(2 * n), *hi = malloc(2 * n), *lo = malloc(2 * n), *back[2][2];
  for (int64_t i = 0; i < n; i++) {
    g16[i] = fsdp_f32_to_bf16(g[i]), g[i] = fsdp_bf16_to_f32(g16[i]);
    hi[i] = fsdp_bf16_round_away(p[i]), lo[i] = fsdp_bf16_low(p[i]);
  }
  g16[9] = fsdp_f32_to_bf16(INFINITY), g[9] = INFINITY;
  void *G[2] = {up(g, n, FSDP_FP32), NULL}, *HI[2], *LO[2], *M[2], *V[2], *sums = NULL;
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 2 * n, &G[1]));
  CHECK_OK(fsdp_memcpy(G[1], g16, 2 * n, NULL));
  CHECK_OK(fsdp_alloc(FSDP_CUDA, 32, &sums));
  CHECK_OK(fsdp_memset(sums, 0, 32, NULL));
  for (int k = 0; k < 2; k++) {
    CHECK_OK(fsdp_cuda_sum_squares(G[k], k ? FSDP_BF16 : FSDP_FP32, n, (double *)sums + 2 * k, (int64_t *)sums + 2 * k + 1,
                                   NULL));
  }
  double got[4];
  CHECK_OK(fsdp_memcpy(got, sums, 32, NULL));
  int64_t bad[2];
  memcpy(&bad[0], &got[1], 8), memcpy(&bad[1], &got[3], 8);
  CHECK(bad[0] == 1 && bad[1] == 1 && fabs(got[0] - got[2]) <= 1e-6 * got[0]);
  g16[9] = fsdp_f32_to_bf16(0.25f), g[9] = 0.25f;
  CHECK_OK(fsdp_memcpy(G[0], g, 4 * n, NULL));
  CHECK_OK(fsdp_memcpy(G[1], g16, 2 * n, NULL));
  for (int k = 0; k < 2; k++) {
    CHECK_OK(fsdp_alloc(FSDP_CUDA, 2 * n, &HI[k]));
    CHECK_OK(fsdp_alloc(FSDP_CUDA, 2 * n, &LO[k]));
    CHECK_OK(fsdp_memcpy(HI[k], hi, 2 * n, NULL));
    CHECK_OK(fsdp_memcpy(LO[k], lo, 2 * n, NULL));
    CHECK_OK(fsdp_alloc(FSDP_CUDA, 4 * n, &M[k]));
    CHECK_OK(fsdp_alloc(FSDP_CUDA, 4 * n, &V[k]));
    CHECK_OK(fsdp_memset(M[k], 0, 4 * n, NULL));
    CHECK_OK(fsdp_memset(V[k], 0, 4 * n, NULL));
    int gd = k ? FSDP_BF16 : FSDP_FP32;
    for (int step = 1; step <= 3; step++)
      CHECK_OK(fsdp_cuda_adamw_step(NULL, HI[k], FSDP_BF16, (uint16_t *)LO[k], G[k], gd, M[k], V[k], n, step, &cfg, 0.5f,
                                    NULL));
    for (int step = 1; step <= 2; step++)
      CHECK_OK(fsdp_cuda_sgd_step(NULL, HI[k], FSDP_BF16, (uint16_t *)LO[k], G[k], gd, M[k], n, step, 0.01f, 0.9f, 1e-4f,
                                  0.5f, NULL));
    back[k][0] = malloc(2 * n), back[k][1] = malloc(2 * n);
    CHECK_OK(fsdp_memcpy(back[k][0], HI[k], 2 * n, NULL));
    CHECK_OK(fsdp_memcpy(back[k][1], LO[k], 2 * n, NULL));
  }
  CHECK(!memcmp(back[0][0], back[1][0], 2 * n) && !memcmp(back[0][1], back[1][1], 2 * n));
  CHECK_FAILS(fsdp_cuda_adamw_step(NULL, HI[0], FSDP_BF16, (uint16_t *)LO[0], G[0], 9, M[0], V[0], n, 1, &cfg, 1, NULL),
              FSDP_EINVAL, "(grads)");
  for (int k = 0; k < 2; k++) {
    fsdp_free(FSDP_CUDA, G[k]), fsdp_free(FSDP_CUDA, HI[k]), fsdp_free(FSDP_CUDA, LO[k]);
    fsdp_free(FSDP_CUDA, M[k]), fsdp_free(FSDP_CUDA, V[k]);
    free(back[k][0]), free(back[k][1]);
  }
  fsdp_free(FSDP_CUDA, sums);
  free(g), free(p), free(g16), free(hi), free(lo);
}

/* the strided cast of NCCL's chunked bf16 -> fp32 reduce-scatter
 * (src/dist/comm_cast_chunks.c): rows x cols out of rows src_stride apart,
 * exact; more rows than a grid's y holds (65535) once */
static void test_cast_rows(size_t rows, size_t cols, size_t stride) {
  size_t n = rows * stride;
  float *h = rand_host((int64_t)n, 3.0f, FSDP_BF16);
  void *src = up(h, (int64_t)n, FSDP_BF16);
  float *dst = poisoned((int64_t)(rows * cols), FSDP_FP32);
  CHECK(fsdp_kernel_cast_rows_to_f32(dst, src, FSDP_BF16, rows, cols, stride, NULL) == 0);
  float *ref = malloc(sizeof(float) * rows * cols);
  for (size_t r = 0; r < rows; r++)
    for (size_t i = 0; i < cols; i++) ref[r * cols + i] = h[r * stride + i];
  same_tol("cast rows to fp32", FSDP_FP32, dst, ref, (int64_t)(rows * cols), 0.0);
  free(ref);
  free(h);
  fsdp_free(FSDP_CUDA, src);
}

int main(int argc, char **argv) {
  if (!fsdp_device_available(FSDP_CUDA)) {
    printf("test_kernels: no CUDA device here; skipped\n");
    return 77;
  }
  CHECK_OK(fsdp_device_set(FSDP_CUDA, 0));
  if (argc > 1 && !strcmp(argv[1], "docs")) {
    test_docs_all();
    return fsdp_test_summary("test_kernels docs");
  }
  if (argc > 1 && !strcmp(argv[1], "pos")) {
    test_pos_all();
    return fsdp_test_summary("test_kernels pos");
  }
  if (argc > 1 && !strcmp(argv[1], "vocab")) {
    test_vocab_parallel();
    return fsdp_test_summary("test_kernels vocab");
  }
  test_linear();
  test_linear_views();
  test_grad_sums();
  test_embedding();
  test_rmsnorm();
  test_rope();
  test_attention(2, 37, 4, 2, 16);
  test_attention(1, 70, 2, 1, 64);
  test_attention(1, 40, 4, 4, 128);
  /* several tiles of 64 rows, a partial last tile, grouped heads */
  test_attention(2, 150, 8, 2, 128);
  test_attention(1, 200, 4, 1, 64);
  /* the Llama 3.2 1B head shape at a longer sequence (several cuDNN tiles) */
  test_attention(1, 512, 32, 8, 64);
  test_attention_choice();
  test_docs_all();
  test_pos_all();
  test_attention_cached(1, 1, 0, 4, 2, 16);
  test_attention_cached(1, 1, 300, 32, 8, 64);  /* one token after 300: two chunks of keys */
  test_attention_cached(2, 5, 7, 4, 4, 128);
  test_attention_cached(1, 17, 600, 8, 2, 200); /* head_dim past the block's 128 threads */
  test_elementwise();
  test_cast_rows(8, 1000, 3001);
  test_cast_rows(3, 70000, 70000);
  test_cast_rows(70000, 3, 5);
  test_cross_entropy();
  test_vocab_parallel();
  test_token_logprobs();
  test_optimizers();
  test_optimizers_bf16_grads();
  return fsdp_test_summary("test_kernels");
}
