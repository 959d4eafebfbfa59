/* test_ops: the CPU ops against float64 naive references and finite
 * differences. Tolerances: forward within 1e-5 relative (+1e-6 absolute) of
 * float64; analytic gradients within 1e-3 relative (+1e-5) of central
 * differences (h = 1e-3) of the float64 loss L = sum_k r_k y_k. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "ops/ops.h"

static double rnd(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (double)(*s >> 8) / 16777216.0 * 2 - 1;
}

/* float64 reference of linear, then L = sum r * y */
static double ref_loss(const double *x, const double *w, const double *b, const double *r, int n, int in, int out) {
  double L = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < out; j++) {
      double y = b ? b[j] : 0;
      for (int k = 0; k < in; k++) y += x[i * in + k] * w[j * in + k];
      L += r[i * out + j] * y;
    }
  return L;
}

/* dL/dv by central differences, v one of the inputs of ref_loss */
static double central_diff(double *v, const double *x, const double *w, const double *b, const double *r, int n, int in,
                           int out) {
  const double h = 1e-3, keep = *v;
  *v = keep + h;
  double lp = ref_loss(x, w, b, r, n, in, out);
  *v = keep - h;
  double lm = ref_loss(x, w, b, r, n, in, out);
  *v = keep;
  return (lp - lm) / (2 * h);
}

static int close_to(double got, double want, double rel, double abs_) { return fabs(got - want) <= rel * fabs(want) + abs_; }

static void test_linear(int n, int in, int out) {
  unsigned seed = (unsigned)(n * 31 + in * 7 + out);
  float *x = malloc(sizeof(float) * n * in), *w = malloc(sizeof(float) * out * in), *b = malloc(sizeof(float) * out);
  float *y = malloc(sizeof(float) * n * out), *dy = malloc(sizeof(float) * n * out), *dx = malloc(sizeof(float) * n * in);
  float *dw = calloc((size_t)out * in, sizeof(float)), *db = calloc((size_t)out, sizeof(float));
  double *xd = malloc(sizeof(double) * n * in), *wd = malloc(sizeof(double) * out * in), *bd = malloc(sizeof(double) * out),
         *rd = malloc(sizeof(double) * n * out);
  for (int i = 0; i < n * in; i++) xd[i] = x[i] = (float)rnd(&seed);
  for (int i = 0; i < out * in; i++) wd[i] = w[i] = (float)(0.3 * rnd(&seed));
  for (int i = 0; i < out; i++) bd[i] = b[i] = (float)rnd(&seed);
  for (int i = 0; i < n * out; i++) rd[i] = dy[i] = (float)rnd(&seed);
  CHECK_OK(fsdp_linear_forward(y, x, w, b, n, in, out));
  int bad = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < out; j++) {
      double want = bd[j];
      for (int k = 0; k < in; k++) want += xd[i * in + k] * wd[j * in + k];
      bad += !close_to(y[i * out + j], want, 1e-5, 1e-5);
    }
  CHECK(bad == 0);
  /* backward twice: the weight grads accumulate */
  CHECK_OK(fsdp_linear_backward(dx, dw, db, dy, x, w, n, in, out));
  CHECK_OK(fsdp_linear_backward(NULL, dw, db, dy, x, w, n, in, out));
  bad = 0;
  for (int t = 0; t < 12; t++) { /* a sample of weights, inputs, biases */
    int jw = (int)((t * 7919u) % (unsigned)(out * in)), jx = (int)((t * 104729u) % (unsigned)(n * in)), jb = t % out;
    bad += !close_to(dw[jw] / 2, central_diff(&wd[jw], xd, wd, bd, rd, n, in, out), 1e-3, 1e-5);
    bad += !close_to(dx[jx], central_diff(&xd[jx], xd, wd, bd, rd, n, in, out), 1e-3, 1e-5);
    bad += !close_to(db[jb] / 2, central_diff(&bd[jb], xd, wd, bd, rd, n, in, out), 1e-3, 1e-5);
  }
  CHECK(bad == 0);
  free(x); free(w); free(b); free(y); free(dy); free(dx); free(dw); free(db);
  free(xd); free(wd); free(bd); free(rd);
}

/* OpenBLAS threads by GEMM size (src/ops/blas_threads.c): one thread per
 * 4 MFLOP, at most the rank's share of the cores (what the largest GEMM
 * gets). The demo's GEMMs (recipes/tiny.lua: 8 x 128 tokens, hidden 128)
 * are 33.5 MFLOP: 8 threads where the share allows; a GEMM under 8 MFLOP
 * stays on one. */
static void test_blas_threads(void) {
  int all = fsdp_blas_threads_for(1 << 14, 1 << 14, 1 << 14);
  CHECK(all >= 1 && fsdp_blas_threads_for(2048, 2048, 2048) == all);
  CHECK(fsdp_blas_threads_for(1024, 128, 128) == (all < 8 ? all : 8));
  CHECK(fsdp_blas_threads_for(128, 1024, 128) == (all < 8 ? all : 8)); /* any orientation */
  CHECK(fsdp_blas_threads_for(768, 128, 128) == (all < 6 ? all : 6));   /* 25 MFLOP: 6 */
  CHECK(fsdp_blas_threads_for(256, 128, 128) == (all < 2 ? all : 2));   /* 8 MFLOP: 2 */
  CHECK(fsdp_blas_threads_for(128, 128, 128) == 1);                     /* 4 MFLOP: 1 */
  CHECK(fsdp_blas_threads_for(64, 64, 64) == 1);
}

int main(void) {
  test_blas_threads();
  test_linear(1, 1, 1);
  test_linear(5, 3, 7);
  test_linear(64, 33, 17);
  test_linear(128, 256, 64);
  float x[6] = {-2, -0.5f, 0, 0.3f, 1, 3}, y[6], dy[6] = {1, 2, 3, 4, 5, 6}, dx[6];
  CHECK_OK(fsdp_tanh_forward(y, x, 6));
  CHECK_OK(fsdp_tanh_backward(dx, dy, y, 6));
  int bad = 0;
  for (int i = 0; i < 6; i++) {
    double fd = (tanh(x[i] + 1e-4) - tanh(x[i] - 1e-4)) / 2e-4 * dy[i];
    bad += !close_to(y[i], tanh(x[i]), 1e-6, 1e-7) || !close_to(dx[i], fd, 1e-4, 1e-6);
  }
  CHECK(bad == 0);
  float t[6] = {0, 0, 0, 0, 0, 1}, g[6];
  double loss;
  CHECK_OK(fsdp_mse_forward_backward(&loss, g, x, t, 6, 0.5f));
  CHECK(close_to(loss, (4 + 0.25 + 0 + 0.09 + 1 + 4) / 6.0, 1e-6, 0));
  CHECK(close_to(g[5], 0.5 * 2 * 2 / 6.0, 1e-6, 0));
  CHECK_FAILS(fsdp_linear_forward(y, x, x, NULL, 1, 0, 1), FSDP_EINVAL, "in=0");
  return fsdp_test_summary("test_ops");
}
