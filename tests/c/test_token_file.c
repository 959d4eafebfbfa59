/* test_token_file.c: the token file reader against files written here: each
 * format read back at random ranges equals what was written; each malformed
 * file is refused at open with a message that names the problem. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char dir[64];

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
  /* xorshift64*: enough for test data, no dependency on the library's RNG */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static const char *tmp_path(const char *name) {
  static char buf[4][160];
  static int slot;
  char *p = buf[slot++ % 4];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

static void put_le(unsigned char *p, uint32_t v, int width) {
  for (int i = 0; i < width; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* header (when magic != 0) then n tokens of width bytes, then extra bytes of 0xAB */
static const char *write_file(const char *name, int32_t magic, int32_t version, int32_t count, const uint32_t *tok,
                              int64_t n, int width, int64_t extra) {
  const char *path = tmp_path(name);
  FILE *fp = fopen(path, "wb");
  if (!fp) {
    perror(path);
    exit(2);
  }
  if (magic != 0) {
    unsigned char h[1024] = {0};
    put_le(h, (uint32_t)magic, 4);
    put_le(h + 4, (uint32_t)version, 4);
    put_le(h + 8, (uint32_t)count, 4);
    fwrite(h, 1, sizeof h, fp);
  }
  for (int64_t i = 0; i < n; i++) {
    unsigned char b[4];
    put_le(b, tok[i], width);
    fwrite(b, 1, (size_t)width, fp);
  }
  for (int64_t i = 0; i < extra; i++) fputc(0xAB, fp);
  fclose(fp);
  return path;
}

/* open path in format, check count and width, compare 200 random ranges */
static void round_trip(const char *what, const char *path, int32_t format, const uint32_t *tok, int64_t n, int width) {
  fsdp_token_file *f = NULL;
  CHECK_OK(fsdp_token_file_open(path, format, &f));
  if (!f) return;
  CHECK(fsdp_token_file_count(f) == n);
  CHECK(fsdp_token_file_width(f) == width);
  int32_t *buf = malloc((size_t)n * sizeof *buf);
  int bad = 0;
  for (int trial = 0; trial < 200; trial++) {
    int64_t start = next_u32() % (uint64_t)(n + 1);
    int64_t len = next_u32() % (uint64_t)(n - start + 1);
    if (trial == 0) start = 0, len = n; /* the whole file once */
    if (fsdp_token_file_read(f, start, len, buf) != 0) {
      bad++;
      continue;
    }
    for (int64_t i = 0; i < len; i++) bad += buf[i] != (int32_t)tok[start + i];
  }
  if (bad) fprintf(stderr, "%s: %d mismatches\n", what, bad);
  CHECK(bad == 0);
  free(buf);
  fsdp_token_file_close(f);
}

static void expect_open_fails(const char *path, int32_t format, int status, const char *needle) {
  fsdp_token_file *f = (fsdp_token_file *)&rng_state; /* must be reset to NULL */
  CHECK_FAILS(fsdp_token_file_open(path, format, &f), status, needle);
  CHECK(f == NULL);
  CHECK(strstr(fsdp_last_error(), path) != NULL); /* the message names the file */
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/fsdp_token_file_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 2;
  }
  enum { N = 5003 };
  uint32_t *t16 = malloc(N * sizeof *t16), *t32 = malloc(N * sizeof *t32);
  for (int i = 0; i < N; i++) {
    t16[i] = next_u32() & 0xFFFF;
    t32[i] = next_u32() & 0x7FFFFFFF;
  }
  t16[0] = 0xFFFF;      /* the extremes widen without sign trouble */
  t32[1] = INT32_MAX;

  /* ---- the four formats read back ---- */
  round_trip("gpt2 header", write_file("u16.bin", 20240520, 1, N, t16, N, 2, 0), FSDP_TOKENS_AUTO, t16, N, 2);
  round_trip("llama3 header", write_file("u32.bin", 20240801, 7, N, t32, N, 4, 0), FSDP_TOKENS_AUTO, t32, N, 4);
  round_trip("raw u16", write_file("raw16.bin", 0, 0, 0, t16, N, 2, 0), FSDP_TOKENS_RAW_U16, t16, N, 2);
  round_trip("raw u32", write_file("raw32.bin", 0, 0, 0, t32, N, 4, 0), FSDP_TOKENS_RAW_U32, t32, N, 4);
  round_trip("one token", write_file("one.bin", 20240520, 1, 1, t16, 1, 2, 0), FSDP_TOKENS_AUTO, t16, 1, 2);
  { /* raw u8 (loss masks): bytes widen to int32; check_ids(2) finds the first byte that is not 0 or 1 */
    uint32_t *t8 = malloc(N * sizeof *t8);
    for (int i = 0; i < N; i++) t8[i] = next_u32() & 1;
    t8[7] = 0xFF;
    round_trip("raw u8", write_file("raw8.bin", 0, 0, 0, t8, N, 1, 0), FSDP_TOKENS_RAW_U8, t8, N, 1);
    fsdp_token_file *m = NULL;
    CHECK_OK(fsdp_token_file_open(tmp_path("raw8.bin"), FSDP_TOKENS_RAW_U8, &m));
    CHECK_FAILS(fsdp_token_file_check_ids(m, 2), FSDP_EINVAL, "token 7 (byte offset 7) is id 255, outside the vocabulary of 2");
    CHECK_OK(fsdp_token_file_check_ids(m, 256));
    fsdp_token_file_close(m);
    free(t8);
  }

  /* ---- malformed files: refused at open ---- */
  expect_open_fails(tmp_path("no_such.bin"), FSDP_TOKENS_AUTO, FSDP_EIO, "cannot open: No such file");
  expect_open_fails(write_file("magic.bin", 12345, 1, N, t16, N, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "bad magic 12345 (expected 20240520");
  /* a headerless file given as auto: its first tokens are not a magic */
  expect_open_fails(tmp_path("raw16.bin"), FSDP_TOKENS_AUTO, FSDP_EINVAL, "needs format raw_u16 or raw_u32");
  expect_open_fails(write_file("ver.bin", 20240520, 2, N, t16, N, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "unknown version 2 for magic 20240520 (expected 1)");
  expect_open_fails(write_file("ver32.bin", 20240801, 1, N, t32, N, 4, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "unknown version 1 for magic 20240801 (expected 7)");
  expect_open_fails(write_file("trunc.bin", 20240520, 1, N, t16, N - 10, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "truncated: the header counts 5003 tokens of 2 bytes, expected 11030 bytes, the file has 11010");
  expect_open_fails(write_file("half.bin", 20240801, 7, N, t32, N - 1, 4, 2), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "expected 21036 bytes, the file has 21034");
  expect_open_fails(write_file("extra.bin", 20240520, 1, N, t16, N, 2, 3), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "3 bytes after the 5003 tokens the header counts");
  expect_open_fails(write_file("zero.bin", 20240520, 1, 0, t16, 0, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "the header counts 0 tokens");
  expect_open_fails(write_file("neg.bin", 20240520, 1, -5, t16, 0, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "the header counts -5 tokens");
  expect_open_fails(write_file("small.bin", 0, 0, 0, t16, 100, 2, 0), FSDP_TOKENS_AUTO, FSDP_EINVAL,
                    "200 bytes, too small for the 1024-byte header");
  expect_open_fails(write_file("odd.bin", 0, 0, 0, t16, 10, 2, 1), FSDP_TOKENS_RAW_U16, FSDP_EINVAL,
                    "21 bytes is not a multiple of the token width 2");
  expect_open_fails(write_file("odd32.bin", 0, 0, 0, t16, 3, 2, 0), FSDP_TOKENS_RAW_U32, FSDP_EINVAL,
                    "6 bytes is not a multiple of the token width 4");
  expect_open_fails(write_file("empty.bin", 0, 0, 0, t16, 0, 2, 0), FSDP_TOKENS_RAW_U16, FSDP_EINVAL,
                    "the file is empty");
  expect_open_fails(dir, FSDP_TOKENS_AUTO, FSDP_EINVAL, "not a regular file");
  expect_open_fails(tmp_path("u16.bin"), 7, FSDP_EINVAL, "unknown format 7");
  CHECK_FAILS(fsdp_token_file_open(NULL, FSDP_TOKENS_AUTO, &(fsdp_token_file *){NULL}), FSDP_EINVAL, "path is NULL");
  CHECK_FAILS(fsdp_token_file_open(tmp_path("u16.bin"), FSDP_TOKENS_AUTO, NULL), FSDP_EINVAL, "out is NULL");

  /* ---- reads out of range, and a uint32 token that int32 cannot hold ---- */
  fsdp_token_file *f = NULL;
  CHECK_OK(fsdp_token_file_open(tmp_path("u16.bin"), FSDP_TOKENS_AUTO, &f));
  int32_t buf[8];
  CHECK_OK(fsdp_token_file_read(f, N, 0, buf)); /* empty read at the end is fine */
  CHECK_OK(fsdp_token_file_read(f, 0, 0, NULL));
  CHECK_FAILS(fsdp_token_file_read(f, N - 2, 3, buf), FSDP_EINVAL, "read of 3 tokens at 5001 is out of range [0, 5003)");
  CHECK_FAILS(fsdp_token_file_read(f, -1, 1, buf), FSDP_EINVAL, "out of range");
  CHECK_FAILS(fsdp_token_file_read(f, 0, -1, buf), FSDP_EINVAL, "out of range");
  CHECK_FAILS(fsdp_token_file_read(f, N + 1, 0, buf), FSDP_EINVAL, "out of range");
  CHECK_FAILS(fsdp_token_file_read(f, 1, INT64_MAX, buf), FSDP_EINVAL, "out of range"); /* no overflow */
  CHECK_FAILS(fsdp_token_file_read(f, 0, 1, NULL), FSDP_EINVAL, "read into NULL");
  CHECK(strstr(fsdp_last_error(), "u16.bin") != NULL);
  fsdp_token_file_close(f);

  uint32_t big[3] = {7, 0x80000000u, 9};
  f = NULL;
  CHECK_OK(fsdp_token_file_open(write_file("big.bin", 20240801, 7, 3, big, 3, 4, 0), FSDP_TOKENS_AUTO, &f));
  CHECK_OK(fsdp_token_file_read(f, 0, 1, buf));
  CHECK(buf[0] == 7);
  CHECK_FAILS(fsdp_token_file_read(f, 0, 3, buf), FSDP_EINVAL, "token 1 is 2147483648, above the int32 range");
  fsdp_token_file_close(f);

  /* ---- ids at or above a vocabulary: the first one named, found by one
   * pass over the file; against a plain loop, at block edges (4096) ---- */
  {
    enum { M = 3 * 4096 + 5 };
    uint32_t *ids = malloc(M * sizeof *ids);
    const int64_t at[] = {0, 4095, 4096, 8200, M - 1};
    const struct { int32_t format, magic, version, width; const char *name; } kinds[] = {
        {FSDP_TOKENS_AUTO, 20240520, 1, 2, "ids16.bin"}, {FSDP_TOKENS_AUTO, 20240801, 7, 4, "ids32.bin"},
        {FSDP_TOKENS_RAW_U16, 0, 0, 2, "idsraw16.bin"}, {FSDP_TOKENS_RAW_U32, 0, 0, 4, "idsraw32.bin"}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
        for (int i = 0; i < M; i++) ids[i] = next_u32() % 50257; /* GPT-2's vocabulary */
        ids[at[a]] = kinds[k].width == 2 ? 50257 + a : 128256 + (uint32_t)a;
        if (a == 0) ids[M - 1] = 60000; /* a later one is not the first */
        int64_t first = -1;
        uint32_t vocab = 50257;
        for (int i = 0; i < M && first < 0; i++)
          if (ids[i] >= vocab) first = i;
        const char *path = write_file(kinds[k].name, kinds[k].magic, kinds[k].version, M, ids, M, kinds[k].width, 0);
        f = NULL;
        CHECK_OK(fsdp_token_file_open(path, kinds[k].format, &f));
        char want[160];
        snprintf(want, sizeof want, "token %lld (byte offset %lld) is id %lu, outside the vocabulary of 50257 ids",
                 (long long)first, (long long)((kinds[k].magic ? 1024 : 0) + first * kinds[k].width),
                 (unsigned long)ids[first]);
        CHECK_FAILS(fsdp_token_file_check_ids(f, vocab), FSDP_EINVAL, want);
        CHECK(strstr(fsdp_last_error(), path) != NULL);
        CHECK_OK(fsdp_token_file_check_ids(f, (int64_t)ids[first] + 1 > 60001 ? (int64_t)ids[first] + 1 : 60001));
        fsdp_token_file_close(f);
      }
    }
    free(ids);
    CHECK_FAILS(fsdp_token_file_check_ids(NULL, 5), FSDP_EINVAL, "the file is NULL");
  }

  /* NULL handles */
  CHECK(fsdp_token_file_count(NULL) == 0 && fsdp_token_file_width(NULL) == 0);
  CHECK_FAILS(fsdp_token_file_read(NULL, 0, 0, buf), FSDP_EINVAL, "the file is NULL");
  fsdp_token_file_close(NULL);

  free(t16);
  free(t32);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return fsdp_test_summary("test_token_file");
}
