/* test_comm_bytes: the bytes a rank sends per comm (fsdp_comm_bytes_sent,
 * fsdp_comm_calls, fsdp_comm_bytes_reset), on 1 to 4 ranks started by
 * fsdprun, against the ring formula the planner uses: of the full buffer
 * of n members, (n-1)/n for an all-gather (count x n elements), a
 * reduce-scatter (count x n, in its output dtype) and a broadcast
 * (count), 2(n-1)/n for an all-reduce (count), all of a shift's count (0
 * for a copy: dist a multiple of n). Checked for each kind and
 * dtype on the world and on a 2-D mesh's groups (each counts only its
 * own), with a failed call not counted, a barrier counting nothing, a
 * reset, the errors, and two threads issuing on two channels of one group
 * while a third reads the counts. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

static int W, R;

/* the expected counts of one comm, kept beside it */
typedef struct {
  double sent[FSDP_COMM_KINDS];
  int64_t calls[FSDP_COMM_KINDS];
} expected;

static int same(double got, double want) { return fabs(got - want) <= 1e-12 * fabs(want); }

static void check_counts(const fsdp_comm *c, const expected *e, const char *where) {
  double total = 0;
  int64_t calls = 0;
  for (int k = 0; k < FSDP_COMM_KINDS; k++) {
    double got = fsdp_comm_bytes_sent(c, k);
    if (!same(got, e->sent[k]) || fsdp_comm_calls(c, k) != e->calls[k]) {
      fprintf(stderr, "rank %d: %s on '%s': kind %d sent %.17g bytes in %lld calls, expected %.17g in %lld\n", R, where,
              fsdp_comm_name(c), k, got, (long long)fsdp_comm_calls(c, k), e->sent[k], (long long)e->calls[k]);
      CHECK(0);
    } else {
      CHECK(1);
    }
    total += e->sent[k];
    calls += e->calls[k];
  }
  CHECK(same(fsdp_comm_bytes_sent(c, FSDP_COMM_KINDS), total));
  CHECK(fsdp_comm_calls(c, FSDP_COMM_KINDS) == calls);
}

/* rc of a call on any thread (the CHECK counters are the main thread's) */
static int call_failed(int rc, const char *what) {
  if (rc == FSDP_OK) return 0;
  fprintf(stderr, "rank %d: %s returned %d: %s\n", R, what, rc, fsdp_last_error());
  return 1;
}
#define CALL(expr) (failed += call_failed((expr), #expr))

/* One collective of each kind of count elements (the all-gather's and the
 * reduce-scatter's per member), recorded in e; returns the calls that failed */
static int one_of_each(fsdp_comm *c, size_t count, int dtype, expected *e) {
  size_t n = (size_t)fsdp_comm_size(c), es = fsdp_dtype_size(dtype);
  void *in = calloc(count * n + 1, es), *out = calloc(count * n + 1, es);
  float *out32 = calloc(count + 1, 4);
  int failed = 0;
  CALL(fsdp_comm_all_gather(c, out, in, count, dtype));
  e->sent[FSDP_COMM_ALL_GATHER] += (double)(n - 1) * (double)(count * es);
  CALL(fsdp_comm_reduce_scatter(c, out, dtype, in, dtype, count, FSDP_SUM));
  e->sent[FSDP_COMM_REDUCE_SCATTER] += (double)(n - 1) * (double)(count * es);
  if (dtype == FSDP_BF16) { /* bf16 in, fp32 out: counted in fp32, what it reduces in */
    CALL(fsdp_comm_reduce_scatter(c, out32, FSDP_FP32, in, FSDP_BF16, count, FSDP_AVG));
    e->sent[FSDP_COMM_REDUCE_SCATTER] += (double)(n - 1) * (double)(count * 4);
    e->calls[FSDP_COMM_REDUCE_SCATTER]++;
  }
  CALL(fsdp_comm_all_reduce(c, out, in, count, dtype, FSDP_AVG));
  e->sent[FSDP_COMM_ALL_REDUCE] += 2.0 * (double)(n - 1) / (double)n * (double)(count * es);
  CALL(fsdp_comm_broadcast(c, out, count, dtype, (int)n - 1));
  e->sent[FSDP_COMM_BROADCAST] += (double)(n - 1) / (double)n * (double)(count * es);
  CALL(fsdp_comm_shift(c, out, in, count, dtype, -1));
  e->sent[FSDP_COMM_SHIFT] += n > 1 ? (double)(count * es) : 0;
  CALL(fsdp_comm_shift(c, out, in, count, dtype, (int)n)); /* a copy: a call, no bytes */
  e->calls[FSDP_COMM_SHIFT]++;
  for (int k = 0; k < FSDP_COMM_KINDS; k++) e->calls[k]++;
  CALL(fsdp_comm_synchronize(c));
  free(in);
  free(out);
  free(out32);
  return failed;
}

static void suite_kinds(fsdp_comm *c) {
  expected e = {{0}, {0}};
  check_counts(c, &e, "a new comm");
  static const size_t counts[] = {0, 1, 7, 1001, 65537};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    CHECK(one_of_each(c, counts[i], FSDP_FP32, &e) == 0);
    check_counts(c, &e, "fp32");
    CHECK(one_of_each(c, counts[i], FSDP_BF16, &e) == 0);
    check_counts(c, &e, "bf16");
  }
  /* a barrier moves nothing; a refused call is not counted */
  CHECK_OK(fsdp_comm_barrier(c));
  CHECK_OK(fsdp_comm_synchronize(c));
  float x[4] = {0};
  CHECK_FAILS(fsdp_comm_all_reduce(c, x, x, 4, FSDP_INT32, FSDP_SUM), FSDP_EINVAL, "dtype");
  CHECK_FAILS(fsdp_comm_all_gather(c, NULL, x, 4, FSDP_FP32), FSDP_EINVAL, "out is NULL");
  CHECK_FAILS(fsdp_comm_reduce_scatter(c, x, FSDP_FP32, x, FSDP_FP32, 1, 7), FSDP_EINVAL, "unknown reduction");
  CHECK_FAILS(fsdp_comm_shift(c, x, x, 4, FSDP_FP32, 1), FSDP_EINVAL, "overlap");
  check_counts(c, &e, "after a barrier and refused calls");
  /* one collective of 1 MiB fp32 of each kind, the figures written out for n = 1..4 */
  CHECK_OK(fsdp_comm_bytes_reset(c));
  expected zero = {{0}, {0}};
  check_counts(c, &zero, "after a reset");
  size_t n = (size_t)fsdp_comm_size(c), count = 262144; /* 1 MiB of fp32 per member's part */
  float *buf = calloc(count * n, 4), *part = calloc(count, 4);
  CHECK_OK(fsdp_comm_all_gather(c, buf, part, count, FSDP_FP32));
  CHECK_OK(fsdp_comm_all_reduce(c, part, part, count, FSDP_FP32, FSDP_SUM));
  CHECK_OK(fsdp_comm_shift(c, buf, part, count, FSDP_FP32, 1));
  CHECK_OK(fsdp_comm_synchronize(c));
  static const double ag[] = {0, 0, 1048576, 2097152, 3145728}; /* (n-1) MiB */
  static const double ar[] = {0, 0, 1048576, 1398101.3333333333, 1572864}; /* 2(n-1)/n MiB */
  if (n <= 4) {
    CHECK(fsdp_comm_bytes_sent(c, FSDP_COMM_ALL_GATHER) == ag[n]);
    CHECK(same(fsdp_comm_bytes_sent(c, FSDP_COMM_ALL_REDUCE), ar[n]));
  }
  CHECK(fsdp_comm_bytes_sent(c, FSDP_COMM_SHIFT) == (n > 1 ? 1048576 : 0)); /* 1 MiB, or a copy */
  CHECK(fsdp_comm_calls(c, FSDP_COMM_SHIFT) == 1);
  free(buf);
  free(part);
}

/* groups of a 2-D mesh: each comm counts its own collectives only */
static void suite_groups(void) {
  const char *names[] = {"row", "col"};
  int64_t sizes[] = {2, -1};
  fsdp_mesh *m = NULL;
  CHECK_OK(fsdp_mesh_create(2, names, sizes, FSDP_CPU, &m));
  if (!m) return;
  fsdp_comm *rows = NULL, *cols = NULL, *rows1 = NULL;
  CHECK_OK(fsdp_mesh_group(m, "col", &rows));
  CHECK_OK(fsdp_mesh_group(m, "row", &cols));
  CHECK_OK(fsdp_mesh_group_channel(m, "col", 1, &rows1));
  expected er = {{0}, {0}}, ec = {{0}, {0}}, e1 = {{0}, {0}};
  CHECK(one_of_each(rows, 333, FSDP_FP32, &er) == 0);
  CHECK(one_of_each(cols, 555, FSDP_BF16, &ec) == 0);
  CHECK(one_of_each(cols, 17, FSDP_FP32, &ec) == 0);
  check_counts(rows, &er, "the row group");
  check_counts(cols, &ec, "the column group");
  check_counts(rows1, &e1, "channel 1 of the row group");
  fsdp_mesh_destroy(m);
}

/* two threads issue on two channels of one group; a third reads meanwhile */
typedef struct {
  fsdp_comm *c;
  expected e;
  int rounds, failed;
} issuer;

static void *issue(void *arg) {
  issuer *t = arg;
  for (int i = 0; i < t->rounds; i++) t->failed += one_of_each(t->c, 100 + (size_t)i, FSDP_FP32, &t->e);
  return NULL;
}

static volatile int reading_done;
static void *read_counts(void *arg) {
  fsdp_comm **cs = arg;
  double last[2] = {0, 0};
  int backwards = 0;
  while (!__atomic_load_n(&reading_done, __ATOMIC_ACQUIRE))
    for (int i = 0; i < 2; i++) {
      double v = fsdp_comm_bytes_sent(cs[i], FSDP_COMM_KINDS);
      if (v < last[i]) backwards++;
      last[i] = v;
    }
  return (void *)(intptr_t)backwards;
}

static void suite_threads(void) {
  const char *names[] = {"dp"};
  int64_t sizes[] = {-1};
  fsdp_mesh *m = NULL;
  CHECK_OK(fsdp_mesh_create(1, names, sizes, FSDP_CPU, &m));
  if (!m) return;
  issuer a = {NULL, {{0}, {0}}, 40, 0}, b = {NULL, {{0}, {0}}, 40, 0};
  CHECK_OK(fsdp_mesh_group(m, "dp", &a.c));
  CHECK_OK(fsdp_mesh_group_channel(m, "dp", 1, &b.c));
  fsdp_comm *cs[2] = {a.c, b.c};
  pthread_t ta, tb, tr;
  reading_done = 0;
  pthread_create(&tr, NULL, read_counts, cs);
  pthread_create(&ta, NULL, issue, &a);
  pthread_create(&tb, NULL, issue, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  __atomic_store_n(&reading_done, 1, __ATOMIC_RELEASE);
  void *backwards = NULL;
  pthread_join(tr, &backwards);
  CHECK(a.failed == 0 && b.failed == 0);
  CHECK(backwards == NULL); /* the counts only grew */
  check_counts(a.c, &a.e, "channel 0, from a thread");
  check_counts(b.c, &b.e, "channel 1, from another");
  fsdp_mesh_destroy(m);
}

static void suite_errors(void) {
  CHECK(fsdp_comm_bytes_sent(NULL, FSDP_COMM_ALL_GATHER) == -1);
  CHECK(strstr(fsdp_last_error(), "NULL comm") != NULL);
  CHECK(fsdp_comm_calls(NULL, FSDP_COMM_KINDS) == FSDP_EINVAL);
  CHECK_FAILS(fsdp_comm_bytes_reset(NULL), FSDP_EINVAL, "NULL comm");
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (!c) return;
  CHECK(fsdp_comm_bytes_sent(c, FSDP_COMM_KINDS + 1) == -1);
  CHECK(strstr(fsdp_last_error(), "kind 6") != NULL);
  CHECK(fsdp_comm_bytes_sent(c, -1) == -1);
  CHECK_FAILS((int)fsdp_comm_calls(c, 9), FSDP_EINVAL, "kind 9");
  fsdp_mesh_destroy(m);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) {
    fprintf(stderr, "fsdp_init: %s\n", fsdp_last_error());
    return 1;
  }
  W = info.size;
  R = info.rank;
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  if (c) suite_kinds(c);
  fsdp_mesh_destroy(m);
  if (W % 2 == 0) suite_groups();
  suite_threads();
  suite_errors();
  char name[64];
  snprintf(name, sizeof name, "test_comm_bytes[%d/%d]", R, W);
  int rc = fsdp_test_summary(name);
  fsdp_finalize();
  return rc;
}
