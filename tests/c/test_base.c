/* test_base: status/last-error plumbing and the dtype conversions, against
 * naive references (float64 arithmetic and exhaustive enumeration). */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "check.h"
#include "fsdp.h"

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* bf16 by definition: the nearest of the two bf16 neighbours, ties to even */
static uint16_t ref_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0; /* handled by the caller */
  uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
  double dl = fabs((double)f - (double)bits_f((uint32_t)lo << 16));
  double dh = fabs((double)bits_f((uint32_t)hi << 16) - (double)f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

static double ref_fp16_decode(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp(m, -24);
  else v = ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

static void test_bf16(void) {
  CHECK(fsdp_bf16_to_f32(0x3f80) == 1.0f);
  CHECK(fsdp_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(fsdp_f32_to_bf16(-2.0f) == 0xc000);
  CHECK(isnan(fsdp_bf16_to_f32(fsdp_f32_to_bf16(NAN))));
  CHECK(fsdp_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(fsdp_f32_to_bf16(3.4e38f) == 0x7f80); /* past the last bf16 halfway point */
  /* ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1) */
  CHECK(fsdp_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
  CHECK(fsdp_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
  /* decode is exact for every bf16 */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = fsdp_bf16_to_f32((uint16_t)h);
    uint32_t u;
    memcpy(&u, &f, 4);
    if (u != h << 16) bad++;
    if (!isnan(f) && fsdp_f32_to_bf16(f) != h) bad++; /* round trip */
  }
  CHECK(bad == 0);
  /* encode: random finite floats against the nearest-neighbour reference */
  srand(1);
  bad = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t u = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
    float f = bits_f(u);
    if (isnan(f) || isinf(f) || fabsf(f) > 3.3e38f) continue;
    if (fsdp_f32_to_bf16(f) != ref_bf16(f)) {
      if (bad++ < 3) fprintf(stderr, "bf16(%a) = %04x, expected %04x\n", f, fsdp_f32_to_bf16(f), ref_bf16(f));
    }
  }
  CHECK(bad == 0);
}

static void test_fp16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    double want = ref_fp16_decode((uint16_t)h);
    float got = fsdp_fp16_to_f32((uint16_t)h);
    if (isnan(want) ? !isnan(got) : (double)got != want) bad++;
  }
  CHECK(bad == 0);
  /* encode: the result is the nearest fp16 (ties to even); inf past 65520 */
  bad = 0;
  srand(2);
  for (int i = 0; i < 1000000; i++) {
    float f = (float)((rand() / (double)RAND_MAX - 0.5) * ldexp(1.0, rand() % 40 - 25));
    uint16_t h = fsdp_f32_to_fp16(f);
    double got = ref_fp16_decode(h);
    double dn = fabs(ref_fp16_decode((uint16_t)(h + 1)) - f), dp = h & 0x7fff ? fabs(ref_fp16_decode((uint16_t)(h - 1)) - f) : INFINITY;
    double d = fabs(got - f);
    if (fabs(f) >= 65520.0) {
      if (!isinf(got)) bad++;
    } else if (d > dn || d > dp || (d == dn && (h & 1)) || (d == dp && (h & 1))) {
      if (bad++ < 3) fprintf(stderr, "fp16(%a) = %04x\n", f, h);
    }
  }
  CHECK(bad == 0);
  CHECK(fsdp_f32_to_fp16(65504.0f) == 0x7bff);
  CHECK(fsdp_f32_to_fp16(65520.0f) == 0x7c00);
  CHECK(fsdp_f32_to_fp16(ldexpf(1.0f, -24)) == 0x0001);
  CHECK(fsdp_f32_to_fp16(ldexpf(1.0f, -26)) == 0x0000); /* below half the smallest subnormal */
}

static void test_dtypes(void) {
  CHECK(fsdp_dtype_size(FSDP_FP32) == 4 && fsdp_dtype_size(FSDP_BF16) == 2 && fsdp_dtype_size(FSDP_FP64) == 8);
  CHECK(fsdp_dtype_size(99) == 0);
  CHECK(fsdp_dtype_from_name("bfloat16") == FSDP_BF16);
  CHECK_FAILS(fsdp_dtype_from_name("int8"), FSDP_EINVAL, "unknown dtype 'int8'");
  double src[5] = {1.0, -2.5, 1e-3, 65504.0, 3.0e38};
  uint16_t bf[5];
  float f[5];
  CHECK_OK(fsdp_convert(bf, FSDP_BF16, src, FSDP_FP64, 5));
  CHECK_OK(fsdp_convert(f, FSDP_FP32, bf, FSDP_BF16, 5));
  for (int i = 0; i < 5; i++) CHECK(fabs(f[i] - src[i]) <= fabs(src[i]) / 256);
  CHECK_FAILS(fsdp_convert(f, 17, src, FSDP_FP64, 5), FSDP_EINVAL, "unknown dtype");
  { /* int32: token ids; conversions truncate, NaN -> 0, saturate at the ends */
    double d[5] = {3.9, -2.5, 0.0 / 0.0, 1e12, -1e12};
    int32_t iv[5];
    CHECK(fsdp_dtype_size(FSDP_INT32) == 4 && fsdp_dtype_from_name("int32") == FSDP_INT32);
    CHECK_OK(fsdp_convert(iv, FSDP_INT32, d, FSDP_FP64, 5));
    CHECK(iv[0] == 3 && iv[1] == -2 && iv[2] == 0 && iv[3] == INT32_MAX && iv[4] == INT32_MIN);
    CHECK_OK(fsdp_convert(d, FSDP_FP64, iv, FSDP_INT32, 2));
    CHECK(d[0] == 3.0 && d[1] == -2.0);
  }
  /* accumulate rounds once: bf16 1 + fp32 2^-9 stays 1 (half an ulp of 1 is 2^-8) */
  uint16_t acc[2] = {fsdp_f32_to_bf16(1.0f), fsdp_f32_to_bf16(1.0f)};
  float add[2] = {1.0f / 512, 3.0f / 256};
  CHECK_OK(fsdp_accumulate(acc, FSDP_BF16, add, FSDP_FP32, 2));
  CHECK(fsdp_bf16_to_f32(acc[0]) == 1.0f && fsdp_bf16_to_f32(acc[1]) == fsdp_bf16_to_f32(fsdp_f32_to_bf16(1.0f + 3.0f / 256)));
}

/* the first non-finite element, against a plain loop over isfinite(), with
 * the bad value before, at and after block boundaries (scan.c: 4096) */
static int64_t ref_nonfinite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return i;
  return -1;
}

static void test_find_nonfinite(void) {
  enum { N = 3 * 4096 + 17 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = (i % 7 - 3) * 1e30f + (float)i; /* large and small, all finite */
  x[5] = 3.4028235e38f;                                               /* FLT_MAX is finite */
  x[6] = bits_f(0x00000001);                                          /* so is a subnormal */
  CHECK(fsdp_find_nonfinite(x, N) == -1 && ref_nonfinite(x, N) == -1);
  const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffd00123u, 0x7f800001u};
  const int64_t at[] = {0, 1, 4095, 4096, 4097, 8191, 12288, N - 1};
  int wrong = 0;
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++)
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
      float keep = x[at[k]];
      x[at[k]] = bits_f(bad[b]);
      wrong += fsdp_find_nonfinite(x, N) != at[k] || ref_nonfinite(x, N) != at[k];
      wrong += fsdp_find_nonfinite(x, at[k]) != -1; /* not within the first at[k] */
      x[at[k]] = keep;
    }
  CHECK(wrong == 0);
  x[9000] = bits_f(0x7fc00000u);
  x[100] = bits_f(0xff800000u);
  CHECK(fsdp_find_nonfinite(x, N) == 100); /* the first of two */
  CHECK(fsdp_find_nonfinite(x, 0) == -1 && fsdp_find_nonfinite(NULL, 5) == -1);
  free(x);
}

static void *other_thread(void *arg) {
  fsdp_fail(FSDP_EIO, "message from the other thread");
  return arg;
}

static void test_errors(void) {
  CHECK(fsdp_fail(FSDP_EINVAL, "bad %s %d", "thing", 3) == FSDP_EINVAL);
  CHECK(strcmp(fsdp_last_error(), "bad thing 3") == 0);
  pthread_t t;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, NULL);
  CHECK(strcmp(fsdp_last_error(), "bad thing 3") == 0); /* thread-local */
  CHECK(fsdp_fail_context(FSDP_EINVAL, "mesh '%s'", "dp") == FSDP_EINVAL);
  CHECK(strcmp(fsdp_last_error(), "mesh 'dp': bad thing 3") == 0);
  /* the last message as an argument of the next (a caller adding context by hand) */
  fsdp_fail(FSDP_EINVAL, "probe failed");
  fsdp_fail(FSDP_EUNSUPPORTED, "no device here (%s); %s", fsdp_last_error(), fsdp_last_error());
  CHECK(strcmp(fsdp_last_error(), "no device here (probe failed); probe failed") == 0);
  char big[3000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  fsdp_fail(FSDP_EINVAL, "%s", big);
  fsdp_fail_context(FSDP_EINVAL, "ctx");
  CHECK(strncmp(fsdp_last_error(), "ctx: xxx", 8) == 0 && strlen(fsdp_last_error()) < 1024);
  fsdp_clear_error();
  CHECK(fsdp_last_error()[0] == 0);
  CHECK(strcmp(fsdp_status_name(FSDP_EPEER), "FSDP_EPEER") == 0);
  CHECK(strcmp(fsdp_status_name(-99), "FSDP_E?") == 0);
  /* calls before init fail with a status, never a crash */
  CHECK_FAILS(fsdp_kv_put("k", "v", 1), FSDP_ESTATE, "fsdp_init");
}

/* fsdp_rank_cores: every core of this process's affinity (no rank count
 * to divide by without fsdp_init); a child bound to one core of several
 * (as mpirun binds a rank) reads 1 core, bound. */
static void test_rank_cores(void) {
  cpu_set_t self;
  CHECK(sched_getaffinity(0, sizeof self, &self) == 0);
  int bound = -1, n = fsdp_rank_cores(&bound);
  CHECK((bound == 0 || bound == 1) && n == CPU_COUNT(&self)); /* (bound when this test runs under taskset) */
  if (CPU_COUNT(&self) < 2) return; /* nothing to bind to a part of */
  int first = 0;
  while (!CPU_ISSET(first, &self)) first++;
  pid_t pid = fork();
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(3);
    int b = -1, cores = fsdp_rank_cores(&b);
    _exit(b == 1 && cores == 1 ? 0 : 1);
  }
  int status = -1;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* the stop signals, each case in a child (a wrong rule would kill it):
 * the first is recorded; a second ends the process; once the stop is saved
 * (mode 2) a later one is ignored and the first stays the record */
static int stop_child(int finishing) {
  pid_t pid = fork();
  if (pid == 0) {
    if (fsdp_stop_signals_watch(1) != FSDP_OK) _exit(2);
    raise(SIGUSR1);
    if (fsdp_stop_signal() != SIGUSR1) _exit(3);
    if (finishing && fsdp_stop_signals_watch(2) != FSDP_OK) _exit(4);
    raise(SIGTERM);
    _exit(fsdp_stop_signal() == SIGUSR1 ? 0 : 5);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

static void test_stop_signals(void) {
  int st = stop_child(1);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  st = stop_child(0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
  CHECK_FAILS(fsdp_stop_signals_watch(3), FSDP_EINVAL, "watch mode 3");
  CHECK_OK(fsdp_stop_signals_watch(0));
}

int main(void) {
  test_stop_signals();
  test_rank_cores();
  test_bf16();
  test_fp16();
  test_dtypes();
  test_find_nonfinite();
  test_errors();
  return fsdp_test_summary("test_base");
}
