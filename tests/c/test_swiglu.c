/* test_swiglu: silu(gate) * up against float64: forward within 1e-6
 * relative + 1e-7; dgate, dup within 1e-4 relative + 1e-6 of the float64
 * analytic derivative checked itself by central differences (h = 1e-6).
 * 1001 gates in +-8 (two of the op's 512-element chunks), then gates
 * from -120 to 120 (the exponential's clamp at -87 and saturation), and a
 * NaN gate stays NaN. The backward in place over gate and up gives the
 * same bits. 300001 elements (shared among CPU threads): within the same
 * bounds of float64 with 3 threads, and the same bits with 1, 2, 3 and 7. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

static double f(double g, double u) { return g / (1 + exp(-g)) * u; }

static void threads_share(void) {
  enum { L = 300001 };
  unsigned seed = 9;
  float *g = malloc(4 * L), *u = malloc(4 * L), *r = malloc(4 * L), *y1 = ref_poisoned(L), *g1 = ref_poisoned(L),
        *u1 = ref_poisoned(L), *y = ref_poisoned(L), *dg = ref_poisoned(L), *du = ref_poisoned(L);
  double *gd = malloc(8 * L), *ud = malloc(8 * L), *want = malloc(8 * L);
  ref_fill(g, gd, L, &seed, 8);
  ref_fill(u, ud, L, &seed, 2);
  ref_fill(r, NULL, L, &seed, 1);
  CHECK_OK(fsdp_cpu_threads_set(3));
  CHECK_OK(fsdp_swiglu_forward(y1, g, u, L));
  for (int i = 0; i < L; i++) want[i] = f(gd[i], ud[i]);
  CHECK(ref_mismatches("swiglu y, 3 threads", y1, want, L, 1e-6, 1e-7) == 0);
  CHECK_OK(fsdp_swiglu_backward(g1, u1, r, g, u, L));
  for (int i = 0; i < L; i++) want[i] = r[i] * f(gd[i], 1.0); /* d/dup = dy silu(gate) */
  CHECK(ref_mismatches("swiglu dup, 3 threads", u1, want, L, 1e-4, 1e-6) == 0);
  static const int counts[] = {1, 2, 7};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    CHECK_OK(fsdp_cpu_threads_set(counts[k]));
    CHECK_OK(fsdp_swiglu_forward(y, g, u, L));
    CHECK_OK(fsdp_swiglu_backward(dg, du, r, g, u, L));
    CHECK(memcmp(y, y1, 4 * L) == 0 && memcmp(dg, g1, 4 * L) == 0 && memcmp(du, u1, 4 * L) == 0);
  }
  free(g), free(u), free(r), free(y1), free(g1), free(u1), free(y), free(dg), free(du), free(gd), free(ud), free(want);
}

int main(void) {
  enum { N = 1001 };
  unsigned seed = 7;
  static float g[N], u[N], r[N];
  static double gd[N], ud[N], want[N], wg[N], wu[N];
  ref_fill(g, gd, N, &seed, 8);
  ref_fill(u, ud, N, &seed, 2);
  ref_fill(r, NULL, N, &seed, 1);
  float *y = ref_poisoned(N), *dg = ref_poisoned(N), *du = ref_poisoned(N);
  CHECK_OK(fsdp_swiglu_forward(y, g, u, N));
  for (int i = 0; i < N; i++) want[i] = f(gd[i], ud[i]);
  CHECK(ref_mismatches("swiglu y", y, want, N, 1e-6, 1e-7) == 0);
  CHECK_OK(fsdp_swiglu_backward(dg, du, r, g, u, N));
  for (int i = 0; i < N; i++) {
    double h = 1e-6;
    wg[i] = r[i] * (f(gd[i] + h, ud[i]) - f(gd[i] - h, ud[i])) / (2 * h);
    wu[i] = r[i] * (f(gd[i], ud[i] + h) - f(gd[i], ud[i] - h)) / (2 * h);
  }
  CHECK(ref_mismatches("swiglu dgate", dg, wg, N, 1e-4, 1e-6) == 0);
  CHECK(ref_mismatches("swiglu dup", du, wu, N, 1e-4, 1e-6) == 0);
  /* in place (the MLP's backward writes the gradients over gate and up):
   * the same bits as into separate buffers */
  static float gi[N], ui[N];
  for (int i = 0; i < N; i++) gi[i] = g[i], ui[i] = u[i];
  CHECK_OK(fsdp_swiglu_backward(gi, ui, r, gi, ui, N));
  int same = 1;
  for (int i = 0; i < N; i++) same &= gi[i] == dg[i] && ui[i] == du[i];
  CHECK(same);
  enum { M = 481 };
  static float ge[M], ue[M], ye[M + 1];
  static double we[M];
  for (int i = 0; i < M; i++) ge[i] = -120.0f + 0.5f * (float)i, ue[i] = 1.0f, we[i] = f(ge[i], 1.0);
  CHECK_OK(fsdp_swiglu_forward(ye, ge, ue, M));
  CHECK(ref_mismatches("swiglu y, gates -120..120", ye, we, M, 1e-6, 1e-7) == 0);
  float gn[2] = {NAN, 1.0f}, un[2] = {1.0f, 1.0f};
  CHECK_OK(fsdp_swiglu_forward(ye, gn, un, 2));
  CHECK(isnan(ye[0]) && fabsf(ye[1] - (float)f(1.0, 1.0)) < 1e-6f);
  CHECK_FAILS(fsdp_swiglu_forward(y, NULL, u, 3), FSDP_EINVAL, "swiglu_forward");
  free(y), free(dg), free(du);
  threads_share();
  return fsdp_test_summary("test_swiglu");
}
