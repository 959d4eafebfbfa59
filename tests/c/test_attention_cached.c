/* test_attention_cached: generation's attention against a KV cache, held
 * to a float64 causal attention over the whole sequence: the prompt at once
 * (pos 0), then one query a step, and a chunk of queries part way in, each
 * within 1e-5 relative + 1e-6 absolute; the cache's rows past the last
 * position written are NaN and must never be read. Sequences of 600 keys
 * pass the op's chunk of 256 scores (the running max rescales). Also equal
 * to the training op (fsdp_attention_forward) on the same prompt within
 * 1e-5, bit for bit with 1 and 3 threads, and bad arguments refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

/* out[b, i, h, :] for every position i of q [B, T, H, D], k, v [B, T, Hkv, D] */
static void ref_causal(const double *q, const double *k, const double *v, double *out, int B, int T, int H, int Hkv,
                       int D) {
  int G = H / Hkv;
  double *s = malloc(sizeof(double) * (size_t)T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        double m = -INFINITY, z = 0;
        for (int j = 0; j <= i; j++) {
          double dot = 0;
          for (int c = 0; c < D; c++) dot += q[((b * T + i) * H + h) * D + c] * k[((b * T + j) * Hkv + h / G) * D + c];
          s[j] = dot / sqrt((double)D);
          m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - m));
        for (int c = 0; c < D; c++) {
          double o = 0;
          for (int j = 0; j <= i; j++) o += s[j] / z * v[((b * T + j) * Hkv + h / G) * D + c];
          out[((b * T + i) * H + h) * D + c] = o;
        }
      }
  free(s);
}

/* the rows [from, from + n) of x [B, T, width] as [B, n, width] */
static void rows_of(float *dst, const float *x, int B, int T, int width, int from, int n) {
  for (int b = 0; b < B; b++) memcpy(dst + (size_t)b * n * width, x + ((size_t)b * T + from) * width, sizeof(float) * n * width);
}
static void rows_of_d(double *dst, const double *x, int B, int T, int width, int from, int n) {
  for (int b = 0; b < B; b++) memcpy(dst + (size_t)b * n * width, x + ((size_t)b * T + from) * width, sizeof(double) * n * width);
}

static void run(int B, int T, int H, int Hkv, int D, unsigned seed) {
  int cap = T + 7, width = H * D, kvw = Hkv * D;
  size_t nq = (size_t)B * T * width, nkv = (size_t)B * T * kvw;
  float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nkv), *v = malloc(sizeof(float) * nkv);
  double *qd = malloc(sizeof(double) * nq), *kd = malloc(sizeof(double) * nkv), *vd = malloc(sizeof(double) * nkv);
  double *want = malloc(sizeof(double) * nq), *wrow = malloc(sizeof(double) * nq);
  ref_fill(q, qd, (int64_t)nq, &seed, 1.0);
  ref_fill(k, kd, (int64_t)nkv, &seed, 1.0);
  ref_fill(v, vd, (int64_t)nkv, &seed, 1.0);
  ref_causal(qd, kd, vd, want, B, T, H, Hkv, D);
  /* the cache: positions 0 .. T-1 filled as they are written, the rest NaN */
  size_t ncache = (size_t)B * cap * kvw;
  float *kc = malloc(sizeof(float) * ncache), *vc = malloc(sizeof(float) * ncache);
  float *out = malloc(sizeof(float) * nq), *qrows = malloc(sizeof(float) * nq);
  for (size_t i = 0; i < ncache; i++) kc[i] = vc[i] = NAN;
  int prompt = T / 2 > 0 ? T / 2 : 1;
  char label[96];
  int pos = 0;
  while (pos < T) { /* the prompt at once, one query a step, then the rest as one chunk of 3 */
    int n = pos == 0 ? prompt : (pos < T - 3 ? 1 : T - pos);
    for (int b = 0; b < B; b++) {
      memcpy(kc + ((size_t)b * cap + pos) * kvw, k + ((size_t)b * T + pos) * kvw, sizeof(float) * n * kvw);
      memcpy(vc + ((size_t)b * cap + pos) * kvw, v + ((size_t)b * T + pos) * kvw, sizeof(float) * n * kvw);
    }
    rows_of(qrows, q, B, T, width, pos, n);
    CHECK_OK(fsdp_attention_cached(out, qrows, kc, vc, B, n, pos, cap, H, Hkv, D));
    rows_of_d(wrow, want, B, T, width, pos, n);
    snprintf(label, sizeof label, "B%d T%d H%d/%d D%d: %d queries at %d", B, T, H, Hkv, D, n, pos);
    CHECK(ref_mismatches(label, out, wrow, (int64_t)B * n * width, 1e-5, 1e-6) == 0);
    pos += n;
  }
  /* the whole sequence as one prefill equals the training op */
  float *lse = malloc(sizeof(float) * (size_t)B * H * T), *train = malloc(sizeof(float) * nq);
  double *trd = malloc(sizeof(double) * nq);
  CHECK_OK(fsdp_attention_forward(train, lse, q, k, v, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_cached(out, q, kc, vc, B, T, 0, cap, H, Hkv, D));
  for (size_t i = 0; i < nq; i++) trd[i] = train[i];
  snprintf(label, sizeof label, "B%d T%d: the prompt at once against fsdp_attention_forward", B, T);
  CHECK(ref_mismatches(label, out, trd, (int64_t)nq, 1e-5, 1e-6) == 0);
  free(q), free(k), free(v), free(qd), free(kd), free(vd), free(want), free(wrow), free(kc), free(vc), free(out);
  free(qrows), free(lse), free(train), free(trd);
}

/* the same bits with 1 and 3 threads (rows shared out, each computed alone) */
static void same_bits_any_threads(void) {
  int B = 2, T = 40, H = 6, Hkv = 2, D = 8, cap = 48;
  unsigned seed = 99;
  size_t nq = (size_t)B * T * H * D, nc = (size_t)B * cap * Hkv * D;
  float *q = malloc(sizeof(float) * nq), *kc = malloc(sizeof(float) * nc), *vc = malloc(sizeof(float) * nc);
  float *o1 = malloc(sizeof(float) * nq), *o3 = malloc(sizeof(float) * nq);
  ref_fill(q, NULL, (int64_t)nq, &seed, 1.0);
  ref_fill(kc, NULL, (int64_t)nc, &seed, 1.0);
  ref_fill(vc, NULL, (int64_t)nc, &seed, 1.0);
  CHECK_OK(fsdp_cpu_threads_set(1));
  CHECK_OK(fsdp_attention_cached(o1, q, kc, vc, B, T, 3, cap, H, Hkv, D));
  CHECK_OK(fsdp_cpu_threads_set(3));
  CHECK_OK(fsdp_attention_cached(o3, q, kc, vc, B, T, 3, cap, H, Hkv, D));
  CHECK(memcmp(o1, o3, sizeof(float) * nq) == 0);
  free(q), free(kc), free(vc), free(o1), free(o3);
}

int main(void) {
  same_bits_any_threads();
  CHECK_OK(fsdp_cpu_threads_set(3));
  run(1, 1, 1, 1, 4, 1);
  run(1, 9, 4, 2, 6, 2);
  run(2, 12, 6, 3, 8, 3);
  run(1, 20, 8, 1, 16, 4);
  run(1, 600, 2, 1, 8, 5); /* chunks of 256 keys: 3 of them, the last partial */
  float x = 0;
  CHECK_FAILS(fsdp_attention_cached(&x, &x, &x, &x, 1, 1, 0, 1, 4, 3, 2), FSDP_EINVAL, "kv_heads=3");
  CHECK_FAILS(fsdp_attention_cached(&x, &x, &x, &x, 1, 2, 5, 6, 1, 1, 2), FSDP_EINVAL, "cache of 6");
  CHECK_FAILS(fsdp_attention_cached(NULL, &x, &x, &x, 1, 1, 0, 1, 1, 1, 2), FSDP_EINVAL, "bad arguments");
  return fsdp_test_summary("test_attention_cached");
}
