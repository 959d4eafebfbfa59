/* test_rope: rotary embeddings as Hugging Face applies them. The table
 * against a float64 version of transformers' formulas (inv_freq, Llama-3
 * scaling, cat(freqs, freqs)) within 2e-6 absolute (cos/sin are rounded
 * once; positions up to 4096); forward against
 * x * cos + rotate_half(x) * sin in float64 within 1e-5 relative + 1e-6;
 * backward against central differences of L = sum r * y (1e-4 relative +
 * 1e-6): the rotation is linear, so this checks the transpose. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "ref.h"

static const double PI = 3.14159265358979323846;

/* transformers' inv_freq, float64, optionally scaled (rope_type llama3) */
static double inv_freq(int j, int d, double theta, const fsdp_rope_scaling *s) {
  double f = (double)(1.0f / powf((float)theta, (float)(2 * j) / (float)d)); /* HF computes it in fp32 */
  if (!s) return f;
  double orig = (double)s->original_max_position_embeddings, wl = 2 * PI / f;
  double low_wl = orig / s->low_freq_factor, high_wl = orig / s->high_freq_factor;
  if (wl > low_wl) return f / s->factor;
  if (wl < high_wl) return f;
  double sm = (orig / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
  return (1 - sm) * f / s->factor + sm * f;
}

static void table_check(int seq, int d, double theta, const fsdp_rope_scaling *s) {
  float *c = ref_poisoned((int64_t)seq * d), *sn = ref_poisoned((int64_t)seq * d);
  double *wc = malloc(8 * (size_t)seq * d), *ws = malloc(8 * (size_t)seq * d);
  CHECK_OK(fsdp_rope_table(c, sn, seq, d, theta, s));
  for (int p = 0; p < seq; p++)
    for (int j = 0; j < d; j++) {
      double a = p * inv_freq(j % (d / 2), d, theta, s);
      wc[p * d + j] = cos(a), ws[p * d + j] = sin(a);
    }
  CHECK(ref_mismatches("rope cos", c, wc, (int64_t)seq * d, 0, 2e-6) == 0);
  CHECK(ref_mismatches("rope sin", sn, ws, (int64_t)seq * d, 0, 2e-6) == 0);
  free(c), free(sn), free(wc), free(ws);
}

typedef struct { int B, T, H, D; const float *c, *s; double *x, *r; } prob;

static void ref_apply(const prob *p, double *y) {
  int h = p->D / 2;
  for (int b = 0; b < p->B; b++)
    for (int t = 0; t < p->T; t++)
      for (int hd = 0; hd < p->H; hd++) {
        const double *x = p->x + ((b * p->T + t) * p->H + hd) * p->D;
        double *o = y + ((b * p->T + t) * p->H + hd) * p->D;
        for (int j = 0; j < p->D; j++) {
          double rh = j < h ? -x[j + h] : x[j - h]; /* rotate_half */
          o[j] = x[j] * p->c[t * p->D + j] + rh * p->s[t * p->D + j];
        }
      }
}

static double ref_loss(void *ctx) {
  prob *p = ctx;
  int n = p->B * p->T * p->H * p->D;
  double *y = malloc(8 * (size_t)n), L = 0;
  ref_apply(p, y);
  for (int i = 0; i < n; i++) L += p->r[i] * y[i];
  free(y);
  return L;
}

static void apply_check(int B, int T, int H, int D, unsigned seed) {
  int n = B * T * H * D;
  float *c = malloc(4 * (size_t)T * D), *s = malloc(4 * (size_t)T * D), *x = malloc(4 * (size_t)n), *r = malloc(4 * (size_t)n);
  prob p = {B, T, H, D, c, s, malloc(8 * (size_t)n), malloc(8 * (size_t)n)};
  CHECK_OK(fsdp_rope_table(c, s, T, D, 10000.0, NULL));
  ref_fill(x, p.x, n, &seed, 2);
  ref_fill(r, p.r, n, &seed, 1);
  double *want = malloc(8 * (size_t)n), *g = malloc(8 * (size_t)n);
  ref_apply(&p, want);
  CHECK_OK(fsdp_rope_forward(x, c, s, B, T, H, D));
  CHECK(ref_mismatches("rope forward", x, want, n, 1e-5, 1e-6) == 0);
  for (int i = 0; i < n; i++) g[i] = ref_central(ref_loss, &p, &p.x[i], 1e-4);
  CHECK_OK(fsdp_rope_backward(r, c, s, B, T, H, D)); /* dy = r, in place -> dx */
  CHECK(ref_mismatches("rope backward", r, g, n, 1e-4, 1e-6) == 0);
  free(c), free(s), free(x), free(r), free(p.x), free(p.r), free(want), free(g);
}

int main(void) {
  table_check(64, 8, 10000.0, NULL);
  table_check(4096, 128, 500000.0, NULL);
  /* Llama 3.1: factor 8, low 1, high 4, original context 8192 */
  fsdp_rope_scaling l31 = {
      .factor = 8.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f, .original_max_position_embeddings = 8192};
  table_check(4096, 128, 500000.0, &l31);
  /* worked by hand: j = 0 is 1 (wavelength 2 pi, far below 8192 / 4:
   * unchanged); j = 63 is 500000^(-126/128) ~ 2.4e-6, wavelength ~2.6e6 >
   * 8192: divided by 8 */
  CHECK(fabs(inv_freq(0, 128, 500000.0, &l31) - 1.0) < 1e-12);
  CHECK(fabs(inv_freq(63, 128, 500000.0, &l31) - inv_freq(63, 128, 500000.0, NULL) / 8) < 1e-15);
  apply_check(1, 1, 1, 2, 1);
  apply_check(2, 5, 3, 8, 2);
  apply_check(1, 9, 2, 6, 3);
  float z[4];
  CHECK_FAILS(fsdp_rope_table(z, z, 1, 3, 10000.0, NULL), FSDP_EINVAL, "must be even");
  CHECK_FAILS(fsdp_rope_forward(z, z, z, 1, 1, 1, 5), FSDP_EINVAL, "must be even");
  return fsdp_test_summary("test_rope");
}
