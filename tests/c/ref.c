/* ref.c: see ref.h. */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

double ref_rand(unsigned *s, double a) {
  *s = *s * 1664525u + 1013904223u;
  return ((double)(*s >> 8) / 16777216.0 * 2 - 1) * a;
}

void ref_fill(float *x, double *xd, int64_t n, unsigned *seed, double a) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)ref_rand(seed, a);
    if (xd) xd[i] = x[i];
  }
}

/* got: gf's floats, or gd's doubles */
static int mismatches(const char *label, const float *gf, const double *gd, const double *want, int64_t n, double rel,
                      double abs_) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const double g = gf ? (double)gf[i] : gd[i];
    if (!(fabs(g - want[i]) <= rel * fabs(want[i]) + abs_) && bad++ < 3)
      fprintf(stderr, "%s[%lld] = %.9g, expected %.9g\n", label, (long long)i, g, want[i]);
  }
  return bad;
}

int ref_mismatches(const char *label, const float *got, const double *want, int64_t n, double rel, double abs_) {
  return mismatches(label, got, NULL, want, n, rel, abs_);
}

int ref_mismatches64(const char *label, const double *got, const double *want, int64_t n, double rel, double abs_) {
  return mismatches(label, NULL, got, want, n, rel, abs_);
}

double ref_central(double (*loss)(void *ctx), void *ctx, double *v, double h) {
  double keep = *v;
  *v = keep + h;
  double lp = loss(ctx);
  *v = keep - h;
  double lm = loss(ctx);
  *v = keep;
  return (lp - lm) / (2 * h);
}

float *ref_poisoned(int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; p && i < n; i++) p[i] = NAN;
  return p;
}
