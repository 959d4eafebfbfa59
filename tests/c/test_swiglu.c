/* test_swiglu: silu(gate) * up against float64: forward within 1e-6
 * relative + 1e-7; dgate, dup within 1e-4 relative + 1e-6 of the float64
 * analytic derivative checked itself by central differences (h = 1e-6).
 * 1001 gates in +-8 (two of the op's 512-element chunks), then gates
 * from -120 to 120 (the exponential's clamp at -87 and saturation), and a
 * NaN gate stays NaN. The backward in place over gate and up gives the
 * same bits. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "ref.h"

static double f(double g, double u) { return g / (1 + exp(-g)) * u; }

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
  return fsdp_test_summary("test_swiglu");
}
