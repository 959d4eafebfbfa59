/* test_residual: y = a + b and y += alpha x, exact against float64 of the
 * same fp32 operations (one rounding each), aliasing allowed. */
#include <stdlib.h>

#include "check.h"
#include "ref.h"

int main(void) {
  enum { N = 257 };
  unsigned seed = 3;
  static float a[N], b[N], y[N];
  static double want[N];
  ref_fill(a, NULL, N, &seed, 10);
  ref_fill(b, NULL, N, &seed, 10);
  CHECK_OK(fsdp_add(y, a, b, N));
  for (int i = 0; i < N; i++) want[i] = (float)(a[i] + b[i]);
  CHECK(ref_mismatches("add", y, want, N, 0, 0) == 0);
  CHECK_OK(fsdp_add(a, a, b, N)); /* in place */
  CHECK(ref_mismatches("add in place", a, want, N, 0, 0) == 0);
  CHECK_OK(fsdp_scale_add(y, 0.5f, b, N));
  for (int i = 0; i < N; i++) want[i] = (float)(want[i] + (float)(0.5f * b[i]));
  CHECK(ref_mismatches("scale_add", y, want, N, 0, 0) == 0);
  CHECK_FAILS(fsdp_add(y, a, NULL, 2), FSDP_EINVAL, "add");
  CHECK_FAILS(fsdp_scale_add(y, 1, b, -1), FSDP_EINVAL, "n=-1");
  return fsdp_test_summary("test_residual");
}
