/* test_rmsnorm: HF LlamaRMSNorm against float64. Forward within 1e-5
 * relative + 1e-6; dx and dw within 1e-3 relative + 1e-5 of central
 * differences (h = 1e-5) of L = sum r * y in float64; dw accumulates.
 * The forward and backward over 3001 rows (shared among CPU threads):
 * within the same bound with 3 threads (the backward against its formula in
 * float64: dx 1e-4 relative + 1e-6, dw summed over 3001 rows in fp32
 * partial sums 1e-4 relative + 1e-4), the same bits with 1, 2, 3 and 7. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

typedef struct { int n, dim; double eps, *x, *w, *r; } prob;

static void ref_forward(const prob *p, double *y) {
  for (int i = 0; i < p->n; i++) {
    double ss = 0;
    for (int j = 0; j < p->dim; j++) ss += p->x[i * p->dim + j] * p->x[i * p->dim + j];
    double rs = 1 / sqrt(ss / p->dim + p->eps);
    for (int j = 0; j < p->dim; j++) y[i * p->dim + j] = p->w[j] * p->x[i * p->dim + j] * rs;
  }
}

static double ref_loss(void *ctx) {
  prob *p = ctx;
  int n = p->n * p->dim;
  double *y = malloc(8 * (size_t)n), L = 0;
  ref_forward(p, y);
  for (int i = 0; i < n; i++) L += p->r[i] * y[i];
  free(y);
  return L;
}

static void run(int n, int dim, float eps, unsigned seed) {
  int N = n * dim;
  prob p = {n, dim, eps, malloc(8 * (size_t)N), malloc(8 * (size_t)dim), malloc(8 * (size_t)N)};
  float *x = malloc(4 * (size_t)N), *w = malloc(4 * (size_t)dim), *r = malloc(4 * (size_t)N);
  ref_fill(x, p.x, N, &seed, 2);
  ref_fill(w, p.w, dim, &seed, 1.5);
  ref_fill(r, p.r, N, &seed, 1);
  float *y = ref_poisoned(N), *rstd = ref_poisoned(n), *dx = ref_poisoned(N), *dw = calloc((size_t)dim, 4);
  double *want = malloc(8 * (size_t)N), *gx = malloc(8 * (size_t)N), *gw = malloc(8 * (size_t)dim);
  CHECK_OK(fsdp_rmsnorm_forward(y, rstd, x, w, n, dim, eps));
  ref_forward(&p, want);
  CHECK(ref_mismatches("rmsnorm y", y, want, N, 1e-5, 1e-6) == 0);
  for (int j = 0; j < dim; j++) dw[j] = 0.25f; /* accumulates onto what is there */
  CHECK_OK(fsdp_rmsnorm_backward(dx, dw, r, x, w, rstd, n, dim));
  for (int i = 0; i < N; i++) gx[i] = ref_central(ref_loss, &p, &p.x[i], 1e-5);
  for (int j = 0; j < dim; j++) gw[j] = 0.25 + ref_central(ref_loss, &p, &p.w[j], 1e-5);
  CHECK(ref_mismatches("rmsnorm dx", dx, gx, N, 1e-3, 1e-5) == 0);
  CHECK(ref_mismatches("rmsnorm dw", dw, gw, dim, 1e-3, 1e-5) == 0);
  free(p.x), free(p.w), free(p.r), free(x), free(w), free(r), free(y), free(rstd), free(dx), free(dw), free(want);
  free(gx), free(gw);
}

static void forward_threads(void) {
  enum { R = 3001, DIM = 64, N = R * DIM };
  unsigned seed = 21;
  prob p = {R, DIM, 1e-5, malloc(8 * N), malloc(8 * DIM), NULL};
  float *x = malloc(4 * N), *w = malloc(4 * DIM), *y1 = ref_poisoned(N), *r1 = ref_poisoned(R), *y = ref_poisoned(N),
        *r = ref_poisoned(R);
  double *want = malloc(8 * N);
  ref_fill(x, p.x, N, &seed, 2);
  ref_fill(w, p.w, DIM, &seed, 1.5);
  CHECK_OK(fsdp_cpu_threads_set(3));
  CHECK_OK(fsdp_rmsnorm_forward(y1, r1, x, w, R, DIM, 1e-5f));
  ref_forward(&p, want);
  CHECK(ref_mismatches("rmsnorm y, 3 threads", y1, want, N, 1e-5, 1e-6) == 0);
  static const int counts[] = {1, 2, 7};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    CHECK_OK(fsdp_cpu_threads_set(counts[k]));
    CHECK_OK(fsdp_rmsnorm_forward(y, r, x, w, R, DIM, 1e-5f));
    CHECK(memcmp(y, y1, 4 * N) == 0 && memcmp(r, r1, 4 * R) == 0);
  }
  free(p.x), free(p.w), free(x), free(w), free(y1), free(r1), free(y), free(r), free(want);
}

/* the backward's formula in float64: dx = rstd (w dy - xhat mean(xhat w dy)), dw = sum dy xhat */
static void ref_backward(const prob *p, const double *dy, double *dx, double *dw) {
  for (int j = 0; j < p->dim; j++) dw[j] = 0;
  for (int i = 0; i < p->n; i++) {
    const double *xr = p->x + (size_t)i * p->dim, *g = dy + (size_t)i * p->dim;
    double ss = 0, dot = 0;
    for (int j = 0; j < p->dim; j++) ss += xr[j] * xr[j];
    double rs = 1 / sqrt(ss / p->dim + p->eps);
    for (int j = 0; j < p->dim; j++) {
      dot += xr[j] * rs * p->w[j] * g[j];
      dw[j] += g[j] * xr[j] * rs;
    }
    for (int j = 0; j < p->dim; j++) dx[(size_t)i * p->dim + j] = rs * (p->w[j] * g[j] - xr[j] * rs * dot / p->dim);
  }
}

static void backward_threads(void) {
  enum { R = 3001, DIM = 64, N = R * DIM };
  unsigned seed = 22;
  prob p = {R, DIM, 1e-5, malloc(8 * N), malloc(8 * DIM), NULL};
  double *gy = malloc(8 * N), *want_dx = malloc(8 * N), *want_dw = malloc(8 * DIM);
  float *x = malloc(4 * N), *w = malloc(4 * DIM), *dy = malloc(4 * N), *y = ref_poisoned(N), *rstd = ref_poisoned(R);
  float *dx1 = ref_poisoned(N), *dw1 = calloc(DIM, 4), *dx = ref_poisoned(N), *dw = calloc(DIM, 4);
  ref_fill(x, p.x, N, &seed, 2);
  ref_fill(w, p.w, DIM, &seed, 1.5);
  ref_fill(dy, gy, N, &seed, 1);
  CHECK_OK(fsdp_cpu_threads_set(3));
  CHECK_OK(fsdp_rmsnorm_forward(y, rstd, x, w, R, DIM, 1e-5f));
  CHECK_OK(fsdp_rmsnorm_backward(dx1, dw1, dy, x, w, rstd, R, DIM));
  ref_backward(&p, gy, want_dx, want_dw);
  CHECK(ref_mismatches("rmsnorm dx, 3 threads", dx1, want_dx, N, 1e-4, 1e-6) == 0);
  CHECK(ref_mismatches("rmsnorm dw, 3 threads", dw1, want_dw, DIM, 1e-4, 1e-4) == 0);
  static const int counts[] = {1, 2, 7};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    CHECK_OK(fsdp_cpu_threads_set(counts[k]));
    memset(dw, 0, 4 * DIM);
    CHECK_OK(fsdp_rmsnorm_backward(dx, dw, dy, x, w, rstd, R, DIM));
    CHECK(memcmp(dx, dx1, 4 * N) == 0 && memcmp(dw, dw1, 4 * DIM) == 0);
    CHECK_OK(fsdp_rmsnorm_backward(dx, NULL, dy, x, w, rstd, R, DIM)); /* no dw: the same dx */
    CHECK(memcmp(dx, dx1, 4 * N) == 0);
  }
  free(p.x), free(p.w), free(gy), free(want_dx), free(want_dw), free(x), free(w), free(dy), free(y), free(rstd);
  free(dx1), free(dw1), free(dx), free(dw);
}

int main(void) {
  forward_threads();
  backward_threads();
  run(1, 1, 1e-6f, 1);
  run(3, 7, 1e-5f, 2);
  run(5, 64, 1e-6f, 3);
  run(2, 33, 0.1f, 4);
  float x = 1;
  CHECK_FAILS(fsdp_rmsnorm_forward(&x, NULL, &x, &x, 1, 0, 1e-6f), FSDP_EINVAL, "dim=0");
  CHECK_FAILS(fsdp_rmsnorm_backward(&x, NULL, &x, &x, &x, NULL, 1, 1), FSDP_EINVAL, "NULL");
  return fsdp_test_summary("test_rmsnorm");
}
