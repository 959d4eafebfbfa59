/* test_collectives: every collective of the shared-memory transport against a
 * naive reference, run on each rank of a job started by fsdprun (1 to 4
 * ranks), plus async ordering, concurrent groups, and the error paths.
 *
 * Reference: each rank can compute every rank's input (value(r, i) below), so
 * the expected result is computed locally in float64, in rank order.
 * Tolerances: inputs of the "exact" family are multiples of 1/4 below 8, so
 * sums are exact in fp32 and bf16 and must match bit for bit; averages are
 * checked to 1e-6 relative (fp32) and 2^-8 relative (bf16, half an ulp);
 * the "random" family (uniform in [-1, 1)) to 1e-5 absolute per member (fp32)
 * or 2^-8 relative + 1e-5 (bf16).
 *
 * Shifts: dist 1, -1, 2 and n (a copy) at every size, one over many
 * default chunks, and with 4 KiB chunks many in flight at once.
 *
 * Modes: (none) the full suite; --dead-peer: rank 1 exits before a collective
 * and the others must get FSDP_EPEER naming it; --late-peer: with a 1 s
 * timeout, rank 1 arrives 3 s late and the others must get FSDP_ETIMEOUT. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fsdp.h"

static int W, R;

static double value(int family, int r, size_t i) {
  if (family == 0) return (double)((int)((r * 131u + i * 7u) % 61u) - 30) * 0.25;
  uint64_t x = (uint64_t)r * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return (double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void fill(void *buf, int dtype, size_t n, int family, int r, size_t base) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)value(family, r, base + i);
    if (dtype == FSDP_FP32)
      ((float *)buf)[i] = v;
    else
      ((uint16_t *)buf)[i] = fsdp_f32_to_bf16(v);
  }
}

static double get(const void *buf, int dtype, size_t i) {
  return dtype == FSDP_FP32 ? ((const float *)buf)[i] : fsdp_bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* the input each rank holds, as stored (bf16-rounded when bf16) */
static double input(int family, int dtype, int r, size_t i) {
  float v = (float)value(family, r, i);
  return dtype == FSDP_FP32 ? v : fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
}

static void poison(void *buf, size_t bytes) { memset(buf, 0xff, bytes); } /* NaN in fp32 and bf16 */

static int close_enough(double got, double want, int family, int dtype, int op, int n) {
  if (isnan(got)) return 0;
  if (family == 0 && op == FSDP_SUM) return got == want;
  double rel = dtype == FSDP_FP32 ? 1e-6 : 1.0 / 256;
  double abs_tol = family == 1 ? 1e-5 * n : 0;
  return fabs(got - want) <= rel * fabs(want) + abs_tol + 1e-30;
}

static int bad_count; /* mismatches reported per case, at most a few lines each */

static void expect(const char *what, size_t i, double got, double want, int ok) {
  if (ok) return;
  if (bad_count++ < 5) fprintf(stderr, "rank %d: %s: element %zu is %.9g, expected %.9g\n", R, what, i, got, want);
}

static double reduced(int family, int dtype, int op, const fsdp_comm *c, size_t i) {
  double s = 0;
  for (int j = 0; j < fsdp_comm_size(c); j++) s += input(family, dtype, fsdp_comm_member(c, j), i);
  return op == FSDP_AVG ? s / fsdp_comm_size(c) : s;
}

static void case_all_reduce(fsdp_comm *c, size_t n, int dtype, int op, int family) {
  size_t es = fsdp_dtype_size(dtype);
  void *in = malloc(n * es + 1), *out = malloc(n * es + 1);
  fill(in, dtype, n, family, R, 0);
  poison(out, n * es);
  CHECK_OK(fsdp_comm_all_reduce(c, out, in, n, dtype, op));
  CHECK_OK(fsdp_comm_synchronize(c));
  bad_count = 0;
  for (size_t i = 0; i < n; i++) {
    double want = reduced(family, dtype, op, c, i), got = get(out, dtype, i);
    expect("all_reduce", i, got, want, close_enough(got, want, family, dtype, op, fsdp_comm_size(c)));
  }
  if (bad_count) fprintf(stderr, "  (all_reduce n=%zu %s op=%d family=%d on %s)\n", n, fsdp_dtype_name(dtype), op, family, fsdp_comm_name(c));
  CHECK(bad_count == 0);
  /* in place */
  CHECK_OK(fsdp_comm_all_reduce(c, in, in, n, dtype, op));
  CHECK_OK(fsdp_comm_synchronize(c));
  CHECK(n == 0 || memcmp(in, out, n * es) == 0);
  free(in);
  free(out);
}

static void case_all_gather(fsdp_comm *c, size_t n, int dtype, int family) {
  size_t es = fsdp_dtype_size(dtype), W_ = (size_t)fsdp_comm_size(c);
  void *in = malloc(n * es + 1), *out = malloc(n * es * W_ + 1);
  fill(in, dtype, n, family, R, 0);
  poison(out, n * es * W_);
  CHECK_OK(fsdp_comm_all_gather(c, out, in, n, dtype));
  CHECK_OK(fsdp_comm_synchronize(c));
  bad_count = 0;
  for (size_t j = 0; j < W_; j++)
    for (size_t i = 0; i < n; i++) {
      double want = input(family, dtype, fsdp_comm_member(c, (int)j), i), got = get(out, dtype, j * n + i);
      expect("all_gather", j * n + i, got, want, got == want);
    }
  CHECK(bad_count == 0);
  free(in);
  free(out);
}

/* in: W*n elements, of which piece j holds value(., j*n + i) */
static void case_reduce_scatter(fsdp_comm *c, size_t n, int in_dtype, int out_dtype, int op, int family) {
  size_t W_ = (size_t)fsdp_comm_size(c);
  void *in = malloc(n * W_ * fsdp_dtype_size(in_dtype) + 1), *out = malloc(n * fsdp_dtype_size(out_dtype) + 1);
  fill(in, in_dtype, n * W_, family, R, 0);
  poison(out, n * fsdp_dtype_size(out_dtype));
  CHECK_OK(fsdp_comm_reduce_scatter(c, out, out_dtype, in, in_dtype, n, op));
  CHECK_OK(fsdp_comm_synchronize(c));
  bad_count = 0;
  size_t me = (size_t)fsdp_comm_rank(c);
  for (size_t i = 0; i < n; i++) {
    double want = reduced(family, in_dtype, op, c, me * n + i), got = get(out, out_dtype, i);
    expect("reduce_scatter", i, got, want, close_enough(got, want, family, out_dtype, op, (int)W_));
  }
  if (bad_count) fprintf(stderr, "  (reduce_scatter n=%zu %s->%s op=%d on %s)\n", n, fsdp_dtype_name(in_dtype), fsdp_dtype_name(out_dtype), op, fsdp_comm_name(c));
  CHECK(bad_count == 0);
  free(in);
  free(out);
}

static void case_broadcast(fsdp_comm *c, size_t n, int dtype, int root) {
  size_t es = fsdp_dtype_size(dtype);
  void *buf = malloc(n * es + 1);
  if (fsdp_comm_rank(c) == root)
    fill(buf, dtype, n, 1, R, 0);
  else
    poison(buf, n * es);
  CHECK_OK(fsdp_comm_broadcast(c, buf, n, dtype, root));
  CHECK_OK(fsdp_comm_synchronize(c));
  bad_count = 0;
  for (size_t i = 0; i < n; i++) {
    double want = input(1, dtype, fsdp_comm_member(c, root), i), got = get(buf, dtype, i);
    expect("broadcast", i, got, want, got == want);
  }
  CHECK(bad_count == 0);
  free(buf);
}

/* out = the input of member (me - dist) mod n; in left as it was */
static void check_shift(fsdp_comm *c, const void *out, const void *in, size_t n, int dtype, int dist) {
  int W_ = fsdp_comm_size(c), src = ((fsdp_comm_rank(c) - dist) % W_ + W_) % W_;
  size_t es = fsdp_dtype_size(dtype);
  void *mine = malloc(n * es + 1);
  fill(mine, dtype, n, 1, R, 0);
  bad_count = 0;
  for (size_t i = 0; i < n; i++) {
    double want = input(1, dtype, fsdp_comm_member(c, src), i), got = get(out, dtype, i);
    expect("shift", i, got, want, got == want);
  }
  if (bad_count)
    fprintf(stderr, "  (shift n=%zu %s dist=%d on %s)\n", n, fsdp_dtype_name(dtype), dist, fsdp_comm_name(c));
  CHECK(bad_count == 0);
  CHECK(n == 0 || memcmp(in, mine, n * es) == 0);
  free(mine);
}

static void case_shift(fsdp_comm *c, size_t n, int dtype, int dist) {
  size_t es = fsdp_dtype_size(dtype);
  void *in = malloc(n * es + 1), *out = malloc(n * es + 1);
  fill(in, dtype, n, 1, R, 0);
  poison(out, n * es);
  CHECK_OK(fsdp_comm_shift(c, out, in, n, dtype, dist));
  CHECK_OK(fsdp_comm_synchronize(c));
  check_shift(c, out, in, n, dtype, dist);
  free(in);
  free(out);
}

/* the shifts ring attention makes (1, -1), a longer one, and a copy */
static void shifts_on(fsdp_comm *c, size_t n, int dtype) {
  int dists[] = {1, -1, 2, fsdp_comm_size(c)};
  for (int k = 0; k < 4; k++) case_shift(c, n, dtype, dists[k]);
}

static void suite_on(fsdp_comm *c) {
  static const size_t sizes[] = {0, 1, 7, 1001, 100003};
  int dtypes[] = {FSDP_FP32, FSDP_BF16};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (int d = 0; d < 2; d++) {
      for (int op = FSDP_SUM; op <= FSDP_AVG; op++)
        for (int fam = 0; fam < 2; fam++) {
          case_all_reduce(c, sizes[k], dtypes[d], op, fam);
          case_reduce_scatter(c, sizes[k], dtypes[d], dtypes[d], op, fam);
        }
      case_all_gather(c, sizes[k], dtypes[d], 1);
      case_broadcast(c, sizes[k], dtypes[d], fsdp_comm_size(c) - 1);
      case_broadcast(c, sizes[k], dtypes[d], 0);
      shifts_on(c, sizes[k], dtypes[d]);
    }
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (int op = FSDP_SUM; op <= FSDP_AVG; op++) case_reduce_scatter(c, sizes[k], FSDP_BF16, FSDP_FP32, op, 1);
}

/* 64 MiB messages: 16 Mi fp32 elements (32 Mi for bf16) in the buffer that
 * crosses the ranks: the all_reduce vector, the reduce_scatter input, the
 * all_gather output. */
static void suite_large(fsdp_comm *c) {
  size_t W_ = (size_t)fsdp_comm_size(c);
  case_all_reduce(c, (size_t)16 << 20, FSDP_FP32, FSDP_SUM, 1);
  case_all_reduce(c, (size_t)32 << 20, FSDP_BF16, FSDP_AVG, 0);
  case_reduce_scatter(c, ((size_t)32 << 20) / W_ + 3, FSDP_BF16, FSDP_FP32, FSDP_SUM, 1);
  case_all_gather(c, ((size_t)16 << 20) / W_ + 1, FSDP_FP32, 1);
  case_shift(c, ((size_t)16 << 20) / W_ + 1, FSDP_FP32, 1);
}

/* Shifts over staging chunks of 4 KiB (FSDP_SHM_CHUNK for this mesh
 * only): many steps per shift, counts on and off a chunk's edge, all of
 * them in flight at once and checked at the end (the two slots alternate
 * across collectives as within one). */
static void suite_shift_chunks(void) {
  const char *old = getenv("FSDP_SHM_CHUNK");
  char keep[64] = "";
  if (old) snprintf(keep, sizeof keep, "%s", old);
  setenv("FSDP_SHM_CHUNK", "4096", 1);
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (old)
    setenv("FSDP_SHM_CHUNK", keep, 1);
  else
    unsetenv("FSDP_SHM_CHUNK");
  if (!c) {
    fsdp_mesh_destroy(m);
    return;
  }
  enum { K = 16 };
  static const size_t counts[] = {1024, 3001, 2048 * 3, 5};
  int dists[] = {1, -1, 2, W, -3, 2 * W + 1};
  void *in[K], *out[K];
  int dt[K], dist[K];
  size_t cnt[K];
  for (int k = 0; k < K; k++) {
    dt[k] = k % 2 ? FSDP_BF16 : FSDP_FP32;
    dist[k] = dists[k % 6];
    cnt[k] = counts[k % 4];
    size_t es = fsdp_dtype_size(dt[k]);
    in[k] = malloc(cnt[k] * es);
    out[k] = malloc(cnt[k] * es);
    fill(in[k], dt[k], cnt[k], 1, R, 0);
    poison(out[k], cnt[k] * es);
    CHECK_OK(fsdp_comm_shift(c, out[k], in[k], cnt[k], dt[k], dist[k]));
  }
  CHECK_OK(fsdp_comm_synchronize(c));
  for (int k = 0; k < K; k++) {
    check_shift(c, out[k], in[k], cnt[k], dt[k], dist[k]);
    free(in[k]);
    free(out[k]);
  }
  fsdp_mesh_destroy(m);
}

/* Member 0 shifts by 1; the others all-gather (others_gather) or shift by
 * others_dist: all fail, each message naming both calls. */
static void mismatch(int others_gather, int others_dist, const char *call0, const char *call1) {
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (!c) {
    fsdp_mesh_destroy(m);
    return;
  }
  float in[4] = {1, 2, 3, 4}, *out = calloc(4 * (size_t)W, sizeof(float));
  if (R != 0 && others_gather)
    CHECK_OK(fsdp_comm_all_gather(c, out, in, 4, FSDP_FP32));
  else
    CHECK_OK(fsdp_comm_shift(c, out, in, 4, FSDP_FP32, R == 0 ? 1 : others_dist));
  int rc = fsdp_comm_synchronize(c);
  CHECK(rc == FSDP_ECOMM);
  CHECK(strstr(fsdp_last_error(), call0) && strstr(fsdp_last_error(), call1));
  if (R == 0) printf("rank 0 got: %s\n", fsdp_last_error());
  free(out);
  fsdp_mesh_destroy(m);
}

/* Work behind an event must not run before the event: a CPU "compute"
 * stream sleeps, then writes the input; the comm stream waits on an event
 * recorded after the write. */
static void suite_ordering(fsdp_comm *c) {
  size_t n = 4096;
  float *in = malloc(n * 4), *fresh = malloc(n * 4), *out = malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    in[i] = -1000.0f; /* stale */
    fresh[i] = (float)value(0, R, i);
  }
  poison(out, n * 4);
  fsdp_stream *compute = NULL;
  fsdp_event *ready = NULL, *done = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &compute));
  CHECK_OK(fsdp_event_create(FSDP_CPU, &ready));
  CHECK_OK(fsdp_event_create(FSDP_CPU, &done));
  CHECK_OK(fsdp_stream_delay(compute, 200000));
  CHECK_OK(fsdp_memcpy(in, fresh, n * 4, compute));
  CHECK_OK(fsdp_event_record(ready, compute));
  CHECK_OK(fsdp_stream_wait_event(fsdp_comm_stream(c), ready));
  CHECK_OK(fsdp_comm_all_reduce(c, out, in, n, FSDP_FP32, FSDP_SUM));
  CHECK_OK(fsdp_event_record(done, fsdp_comm_stream(c)));
  CHECK(fsdp_event_query(done) == 0);         /* still behind the delay */
  CHECK(isnan(out[0]) && isnan(out[n - 1]));  /* nothing written yet */
  CHECK_OK(fsdp_event_synchronize(done));
  CHECK(fsdp_event_query(done) == 1);
  bad_count = 0;
  for (size_t i = 0; i < n; i++) {
    double want = reduced(0, FSDP_FP32, FSDP_SUM, c, i);
    expect("ordered all_reduce", i, out[i], want, out[i] == want);
  }
  CHECK(bad_count == 0);
  fsdp_event_destroy(ready);
  fsdp_event_destroy(done);
  fsdp_stream_destroy(compute);
  free(in);
  free(fresh);
  free(out);
}

/* Two groups of a 2-D mesh (rows and columns), many collectives in flight on
 * both at once, checked only at the end. */
static void suite_2d(void) {
  const char *names[] = {"row", "col"};
  int64_t sizes[] = {2, -1};
  fsdp_mesh *m = NULL;
  CHECK_OK(fsdp_mesh_create(2, names, sizes, FSDP_CPU, &m));
  if (!m) return;
  fsdp_comm *rows = NULL, *cols = NULL, *flat = NULL;
  CHECK_OK(fsdp_mesh_group(m, "col", &rows)); /* ranks sharing a row index, varying col */
  CHECK_OK(fsdp_mesh_group(m, "row", &cols));
  CHECK_OK(fsdp_mesh_group(m, "row,col", &flat));
  CHECK(fsdp_comm_size(flat) == W);
  CHECK(fsdp_comm_size(rows) * fsdp_comm_size(cols) == W);
  enum { K = 40 };
  size_t n = 3001;
  float *in = malloc(n * 4), *out_r[K], *out_c[K];
  fill(in, FSDP_FP32, n, 0, R, 0);
  for (int k = 0; k < K; k++) {
    out_r[k] = malloc(n * 4);
    out_c[k] = malloc(n * 4);
    poison(out_r[k], n * 4);
    poison(out_c[k], n * 4);
    CHECK_OK(fsdp_comm_all_reduce(rows, out_r[k], in, n, FSDP_FP32, k % 2 ? FSDP_AVG : FSDP_SUM));
    CHECK_OK(fsdp_comm_all_reduce(cols, out_c[k], in, n, FSDP_FP32, FSDP_SUM));
  }
  CHECK_OK(fsdp_comm_synchronize(rows));
  CHECK_OK(fsdp_comm_synchronize(cols));
  bad_count = 0;
  for (int k = 0; k < K; k++)
    for (size_t i = 0; i < n; i++) {
      int op = k % 2 ? FSDP_AVG : FSDP_SUM;
      double wr = reduced(0, FSDP_FP32, op, rows, i), wc = reduced(0, FSDP_FP32, FSDP_SUM, cols, i);
      expect("row all_reduce", i, out_r[k][i], wr, close_enough(out_r[k][i], wr, 0, FSDP_FP32, op, 2));
      expect("col all_reduce", i, out_c[k][i], wc, out_c[k][i] == wc);
    }
  CHECK(bad_count == 0);
  for (int k = 0; k < K; k++) {
    free(out_r[k]);
    free(out_c[k]);
  }
  suite_on(rows);
  free(in);
  char desc[2048];
  CHECK_OK(fsdp_mesh_describe(m, desc, sizeof desc));
  if (R == 0) printf("%s\n", desc);
  fsdp_mesh_destroy(m);
}

static void suite_errors(void) {
  const char *names[] = {"dp_outer", "dp_shard"};
  int64_t bad[] = {3, 5};
  fsdp_mesh *m = NULL;
  CHECK_FAILS(fsdp_mesh_create(2, names, bad, FSDP_CPU, &m), FSDP_EINVAL, "dp_outer=3 x dp_shard=5 has 15 ranks");
  int64_t two_rest[] = {-1, -1};
  CHECK_FAILS(fsdp_mesh_create(2, names, two_rest, FSDP_CPU, &m), FSDP_EINVAL, "both -1");
  int64_t zero[] = {0, 1};
  CHECK_FAILS(fsdp_mesh_create(2, names, zero, FSDP_CPU, &m), FSDP_EINVAL, "'dp_outer' has size 0");
  const char *dup[] = {"dp", "dp"};
  int64_t ones[] = {1, -1};
  CHECK_FAILS(fsdp_mesh_create(2, dup, ones, FSDP_CPU, &m), FSDP_EINVAL, "'dp' appears twice");
  if (W % 3) {
    int64_t rest[] = {3, -1};
    CHECK_FAILS(fsdp_mesh_create(2, names, rest, FSDP_CPU, &m), FSDP_EINVAL, "not a multiple of 3");
  }
  int64_t ok[] = {1, -1};
  CHECK_OK(fsdp_mesh_create(2, names, ok, FSDP_CPU, &m));
  fsdp_comm *c = NULL;
  CHECK_FAILS(fsdp_mesh_group(m, "tp", &c), FSDP_EINVAL, "no dimension 'tp' (dimensions: dp_outer, dp_shard)");
  CHECK_OK(fsdp_mesh_group(m, "dp_shard", &c));
  float x[4] = {0};
  CHECK_FAILS(fsdp_comm_reduce_scatter(c, x, FSDP_BF16, x, FSDP_FP32, 1, FSDP_SUM), FSDP_EINVAL, "fp32 in, bf16 out");
  CHECK_FAILS(fsdp_comm_all_reduce(c, x, x, 1, FSDP_FP32, 7), FSDP_EINVAL, "unknown reduction 7");
  CHECK_FAILS(fsdp_comm_broadcast(c, x, 1, FSDP_FP32, W), FSDP_EINVAL, "root");
  CHECK_FAILS(fsdp_comm_all_gather(c, NULL, x, 1, FSDP_FP32), FSDP_EINVAL, "out is NULL");
  CHECK_FAILS(fsdp_comm_all_gather(c, x, x, 1, 42), FSDP_EINVAL, "dtype 42");
  CHECK_FAILS(fsdp_comm_shift(c, x, x, 2, FSDP_FP32, 1), FSDP_EINVAL, "out and in overlap");
  CHECK(strstr(fsdp_last_error(), "shift on 'dp_shard") != NULL);
  CHECK_FAILS(fsdp_comm_shift(c, (uint16_t *)x + 1, x, 2, FSDP_BF16, 0), FSDP_EINVAL, "overlap"); /* even a copy */
  CHECK_FAILS(fsdp_comm_shift(c, x, NULL, 1, FSDP_FP32, 1), FSDP_EINVAL, "in is NULL");
  CHECK_FAILS(fsdp_comm_shift(c, x + 2, x, 2, FSDP_INT32, 1), FSDP_EINVAL, "dtype");
  CHECK_FAILS(fsdp_comm_shift(NULL, x + 2, x, 2, FSDP_FP32, 1), FSDP_EINVAL, "NULL comm");
  if (W > 1) {
    /* ranks disagree on the count: everyone must fail, nobody may hang */
    float *buf = calloc(64, 4);
    CHECK_OK(fsdp_comm_all_reduce(c, buf, buf, R == 0 ? 10 : 11, FSDP_FP32, FSDP_SUM));
    CHECK_FAILS(fsdp_comm_synchronize(c), FSDP_ECOMM, "but rank");
    CHECK_FAILS(fsdp_comm_all_reduce(c, buf, buf, 1, FSDP_FP32, FSDP_SUM), FSDP_ECOMM, "failed earlier");
    free(buf);
  }
  fsdp_mesh_destroy(m);
  if (W > 1) mismatch(1, 0, "shift(count=4, fp32, dist=1)", "all_gather(count=4, fp32)");
  if (W > 2) mismatch(0, 2, "shift(count=4, fp32, dist=1)", "shift(count=4, fp32, dist=2)");
}

static int dead_or_late(int late) {
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (!c) return 1;
  CHECK_OK(fsdp_comm_set_timeout(c, late ? 1.0 : 30.0));
  float x[16] = {0};
  if (R == 1) {
    if (!late) _exit(0); /* vanish without a word */
    sleep(3);
  }
  double t0 = (double)time(NULL);
  CHECK_OK(fsdp_comm_all_reduce(c, x, x, 16, FSDP_FP32, FSDP_SUM));
  int rc = fsdp_comm_synchronize(c);
  /* The first member to notice reports FSDP_ETIMEOUT / FSDP_EPEER; the others
   * may see the group fail first (FSDP_ECOMM). Every message names rank 1. */
  if (R == 1) {
    CHECK(rc < 0); /* the group failed while it slept */
  } else {
    CHECK(rc == (late ? FSDP_ETIMEOUT : FSDP_EPEER) || rc == FSDP_ECOMM);
    CHECK(strstr(fsdp_last_error(), late ? "waited 1 s for rank 1" : "rank 1") != NULL);
    if (!late) CHECK(strstr(fsdp_last_error(), "died") != NULL);
    if (R == 0) printf("rank 0 got: %s\n", fsdp_last_error());
  }
  CHECK((double)time(NULL) - t0 < 10);
  fsdp_mesh_destroy(m);
  char name[64];
  snprintf(name, sizeof name, "test_collectives[%d]", R);
  return fsdp_test_summary(name);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) {
    fprintf(stderr, "fsdp_init: %s\n", fsdp_last_error());
    return 1;
  }
  W = info.size;
  R = info.rank;
  if (argc > 1 && !strcmp(argv[1], "--dead-peer")) return dead_or_late(0);
  if (argc > 1 && !strcmp(argv[1], "--late-peer")) return dead_or_late(1);
  int large = !(argc > 1 && !strcmp(argv[1], "--no-large"));

  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (c) {
    CHECK(fsdp_comm_size(c) == W && fsdp_comm_rank(c) == R);
    suite_on(c);
    suite_ordering(c);
    if (large) suite_large(c);
  }
  suite_shift_chunks();
  if (W % 2 == 0) suite_2d();
  fsdp_mesh_destroy(m);
  suite_errors();
  char name[64];
  snprintf(name, sizeof name, "test_collectives[%d/%d]", R, W);
  int rc = fsdp_test_summary(name);
  fsdp_finalize();
  return rc;
}
