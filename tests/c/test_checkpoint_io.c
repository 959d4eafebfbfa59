/* test_checkpoint_io.c: the checkpoint layer's C pieces against references:
 * CRC-32C against the standard check value and a bitwise implementation;
 * the writer's files against the buffers (and a writer killed part-way, in
 * a child process); the checkpoint reader on a hand-made checkpoint, read
 * across segment boundaries, and each corruption rejected with its message;
 * safetensors headers written then parsed, data read back in every float
 * dtype, and malformed headers rejected, one fault each. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char root[256];

static uint32_t crc_bitwise(const unsigned char *p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

static void test_crc(void) {
  CHECK(fsdp_crc32c(0, "123456789", 9) == 0xE3069283u);
  CHECK(fsdp_crc32c_portable(0, "123456789", 9) == 0xE3069283u);
  unsigned char buf[1100];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + (i >> 3) * 7);
  int bad = 0;
  for (size_t off = 0; off < 8; off++)
    for (size_t n = 0; n + off < sizeof buf; n += 37) {
      uint32_t want = crc_bitwise(buf + off, n);
      if (fsdp_crc32c(0, buf + off, n) != want || fsdp_crc32c_portable(0, buf + off, n) != want) bad++;
      size_t h = n / 3; /* continued in two calls */
      if (fsdp_crc32c(fsdp_crc32c(0, buf + off, h), buf + off + h, n - h) != want) bad++;
    }
  CHECK(bad == 0);
}

static long file_size(const char *path) {
  int64_t b = -1;
  return fsdp_fs_stat(path, &b, NULL) == 0 ? (long)b : -1;
}

static void test_fs(void) {
  char d[512], f[600];
  snprintf(d, sizeof d, "%s/a/b/c", root);
  CHECK_OK(fsdp_fs_mkdirs(d));
  int is_dir = 0;
  CHECK(fsdp_fs_stat(d, NULL, &is_dir) == 0 && is_dir == 1);
  snprintf(f, sizeof f, "%s/x.txt", d);
  CHECK_OK(fsdp_fs_write_atomic(f, "hello", 5));
  CHECK(file_size(f) == 5);
  char list[256];
  int64_t n = fsdp_fs_list(d, list, sizeof list);
  CHECK(n == 6 && !memcmp(list, "x.txt\n", 6)); /* the .tmp is gone */
  snprintf(d, sizeof d, "%s/a", root);
  CHECK_OK(fsdp_fs_remove_tree(d));
  CHECK(fsdp_fs_stat(d, NULL, NULL) == FSDP_ABSENT);
  CHECK(fsdp_fs_list(d, list, sizeof list) == 0);
  CHECK_FAILS(fsdp_fs_remove_tree("/"), FSDP_EINVAL, "refusing");
}

/* a file of three segments; returns their offsets and crcs */
static float seg_a[10], seg_b[100], seg_c[7];
static void make_segments(void) {
  for (int i = 0; i < 10; i++) seg_a[i] = (float)i;
  for (int i = 0; i < 100; i++) seg_b[i] = 100.0f + (float)i;
  for (int i = 0; i < 7; i++) seg_c[i] = -1.0f - (float)i;
}

static void test_writer(void) {
  make_segments();
  char path[512];
  snprintf(path, sizeof path, "%s/w.bin", root);
  const void *bufs[3] = {seg_a, seg_b, seg_c};
  int64_t bytes[3] = {40, 400, 28}, offs[3];
  uint32_t crcs[3];
  int64_t total = 0;
  fsdp_ckpt_writer *w = NULL;
  CHECK_OK(fsdp_ckpt_writer_start(path, 3, bufs, bytes, &w));
  CHECK_OK(fsdp_ckpt_writer_finish(w, offs, crcs, &total));
  CHECK(offs[0] == 0 && offs[1] == 64 && offs[2] == 512 && total == 540);
  CHECK(crcs[1] == crc_bitwise((const unsigned char *)seg_b, 400));
  CHECK(file_size(path) == 540);
  FILE *f = fopen(path, "rb");
  float back[100] = {0};
  if (f) {
    fseek(f, 64, SEEK_SET);
    CHECK(fread(back, 4, 100, f) == 100);
    fclose(f);
  }
  CHECK(!memcmp(back, seg_b, 400));
  /* an unwritable place fails with the path named */
  CHECK_OK(fsdp_ckpt_writer_start("/nonexistent-dir/x.bin", 3, bufs, bytes, &w));
  CHECK_FAILS(fsdp_ckpt_writer_finish(w, offs, crcs, &total), FSDP_EIO, "/nonexistent-dir/x.bin");
  /* a process killed part-way leaves a short file (in a child) */
  snprintf(path, sizeof path, "%s/killed.bin", root);
  pid_t pid = fork();
  if (pid == 0) {
    fsdp_ckpt_writer_fault(100);
    fsdp_ckpt_writer *k = NULL;
    if (fsdp_ckpt_writer_start(path, 3, bufs, bytes, &k) == 0) fsdp_ckpt_writer_finish(k, NULL, NULL, NULL);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  long sz = file_size(path);
  CHECK(sz >= 100 && sz < 540);
}

/* A two-file checkpoint of tensor "w" (shape 3x39 = 117 elements, one state
 * "param"): file 0 holds [0, 10) and [10, 110), file 1 holds [110, 117). */
static void write_text(const char *dir, const char *name, const char *text) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static void make_checkpoint(const char *dir, const char *segments_json) {
  char p[600];
  fsdp_fs_remove_tree(dir);
  fsdp_fs_mkdirs(dir);
  const void *b0[2] = {seg_a, seg_b}, *b1[1] = {seg_c};
  int64_t n0[2] = {40, 400}, n1[1] = {28}, o[2];
  uint32_t c0[2], c1[1];
  int64_t t0 = 0, t1 = 0;
  fsdp_ckpt_writer *w;
  snprintf(p, sizeof p, "%s/rank-00000.bin", dir);
  if (fsdp_ckpt_writer_start(p, 2, b0, n0, &w) == 0) fsdp_ckpt_writer_finish(w, o, c0, &t0);
  snprintf(p, sizeof p, "%s/rank-00001.bin", dir);
  if (fsdp_ckpt_writer_start(p, 1, b1, n1, &w) == 0) fsdp_ckpt_writer_finish(w, o, c1, &t1);
  char segs[512], index[2048], sum[64];
  if (segments_json)
    snprintf(segs, sizeof segs, "%s", segments_json);
  else
    snprintf(segs, sizeof segs, "[[0,0,0,10,0,0,%u],[0,0,10,110,0,64,%u],[0,0,110,117,1,0,%u]]", c0[0], c0[1], c1[0]);
  snprintf(index, sizeof index,
           "{\"format\":\"fsdp-checkpoint\",\"version\":1,\"meta\":{\"step\":7,\"optimizer\":\"adamw\",\"train\":{\"lr\":0.5}},"
           "\"states\":[\"param\"],\"tensors\":[{\"name\":\"w\",\"dtype\":\"F32\",\"shape\":[3,39]}],"
           "\"files\":[{\"name\":\"rank-00000.bin\",\"bytes\":%lld},{\"name\":\"rank-00001.bin\",\"bytes\":%lld}],"
           "\"segments\":%s}",
           (long long)t0, (long long)t1, segs);
  write_text(dir, "index.json", index);
  snprintf(sum, sizeof sum, "crc32c %08x bytes %zu\n", fsdp_crc32c(0, index, strlen(index)), strlen(index));
  write_text(dir, "index.sum", sum);
}

static void flip_byte(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  if (!f) return;
  fseek(f, at, SEEK_SET);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
}

static void test_reader(void) {
  make_segments();
  char dir[512], p[600];
  snprintf(dir, sizeof dir, "%s/ck", root);
  make_checkpoint(dir, NULL);
  fsdp_ckpt *c = NULL;
  CHECK_OK(fsdp_ckpt_open(dir, &c));
  if (!c) return;
  double step = 0, lr = 0;
  char opt[32] = "";
  CHECK(fsdp_ckpt_meta_number(c, "step", &step) == 0 && step == 7);
  CHECK(fsdp_ckpt_meta_number(c, "train.lr", &lr) == 0 && lr == 0.5);
  CHECK(fsdp_ckpt_meta_number(c, "nope", &lr) == FSDP_ABSENT);
  CHECK(fsdp_ckpt_meta_string(c, "optimizer", opt, sizeof opt) == 0 && !strcmp(opt, "adamw"));
  const char *name = NULL;
  int nd = 0;
  int64_t shape[8];
  CHECK(fsdp_ckpt_tensor_count(c) == 1);
  CHECK_OK(fsdp_ckpt_tensor_info(c, 0, &name, &nd, shape));
  CHECK(name && !strcmp(name, "w") && nd == 2 && shape[0] == 3 && shape[1] == 39);
  CHECK(fsdp_ckpt_has_state(c, "param") == 1 && fsdp_ckpt_has_state(c, "exp_avg") == 0);
  /* a range across all three segments, and one inside a segment */
  float all[117], want[117], part[5];
  memcpy(want, seg_a, 40);
  memcpy(want + 10, seg_b, 400);
  memcpy(want + 110, seg_c, 28);
  CHECK_OK(fsdp_ckpt_read(c, "w", "param", 0, 117, all));
  CHECK(!memcmp(all, want, sizeof all));
  CHECK_OK(fsdp_ckpt_read(c, "w", "param", 8, 113, all));
  CHECK(!memcmp(all, want + 8, 105 * 4));
  CHECK_OK(fsdp_ckpt_read(c, "w", "param", 50, 55, part));
  CHECK(!memcmp(part, want + 50, 20));
  CHECK_FAILS(fsdp_ckpt_read(c, "v", "param", 0, 1, part), FSDP_EINVAL, "no tensor 'v'");
  CHECK_FAILS(fsdp_ckpt_read(c, "w", "exp_avg", 0, 1, part), FSDP_EINVAL, "no state 'exp_avg'");
  CHECK_FAILS(fsdp_ckpt_read(c, "w", "param", 100, 118, part), FSDP_EINVAL, "which has 117");
  fsdp_ckpt_close(c);

  /* corruptions, each caught with its message */
  snprintf(p, sizeof p, "%s/rank-00000.bin", dir);
  flip_byte(p, 64 + 17);
  CHECK_OK(fsdp_ckpt_open(dir, &c)); /* data is checked when read */
  CHECK_FAILS(fsdp_ckpt_read(c, "w", "param", 0, 117, all), FSDP_ECORRUPT, "checksum mismatch in 'rank-00000.bin' bytes 64..464");
  CHECK_OK(fsdp_ckpt_read(c, "w", "param", 0, 10, all)); /* the segments before it are fine */
  fsdp_ckpt_close(c);

  make_checkpoint(dir, NULL);
  snprintf(p, sizeof p, "%s/rank-00001.bin", dir);
  CHECK(truncate(p, 20) == 0);
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "'rank-00001.bin' is truncated: 20 bytes, the index expects 28");
  CHECK(c == NULL);
  unlink(p);
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "shard file 'rank-00001.bin' is missing");

  make_checkpoint(dir, NULL);
  snprintf(p, sizeof p, "%s/index.json", dir);
  flip_byte(p, 30);
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "index.json is damaged");
  snprintf(p, sizeof p, "%s/index.sum", dir);
  unlink(p);
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "index.sum is missing");
  snprintf(p, sizeof p, "%s/index.json", dir);
  unlink(p);
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_EIO, "has no index.json");

  /* a segment left out (a shard that never made it into the index), two
   * segments claiming the same elements, a segment past its file's end */
  make_checkpoint(dir, "[[0,0,0,10,0,0,0],[0,0,110,117,1,0,0]]");
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "param of 'w': elements [10, 110) are in no segment");
  make_checkpoint(dir, "[[0,0,0,10,0,0,0],[0,0,5,105,0,64,0],[0,0,110,117,1,0,0]]");
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "are in two segments");
  make_checkpoint(dir, "[[0,0,0,10,0,0,0],[0,0,10,110,0,64,0],[0,0,110,117,1,8,0]]");
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "ends past the end of 'rank-00001.bin'");
  make_checkpoint(dir, "[[0,0,0,10,0,0,0],[0,0,10,110,0,64,0],[0,0,110,117.5,1,0,0]]");
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "segments[2] must be");
  make_checkpoint(dir, "[[0,0,0,10,0,0,0],[0,0,10,110,0,64,0],[0,0,110,117,9,0,0]]");
  CHECK_FAILS(fsdp_ckpt_open(dir, &c), FSDP_ECORRUPT, "does not exist");
}

/* ---- safetensors ---- */

static int parse(const void *buf, size_t n, fsdp_safetensors **st) {
  *st = NULL;
  return fsdp_safetensors_parse(buf, n, (int64_t)n, "t.safetensors", st);
}

/* a file from a header text and data bytes */
static size_t build(unsigned char *out, const char *header, size_t data_bytes) {
  size_t h = strlen(header);
  for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)h >> (8 * i));
  memcpy(out + 8, header, h);
  memset(out + 8 + h, 0x11, data_bytes);
  return 8 + h + data_bytes;
}

static void bad_header(const char *header, size_t data_bytes, const char *needle) {
  static unsigned char buf[4096];
  size_t n = build(buf, header, data_bytes);
  fsdp_safetensors *st = NULL;
  CHECK_FAILS(parse(buf, n, &st), FSDP_ECORRUPT, needle);
  CHECK(st == NULL);
}

static void test_safetensors(void) {
  /* written by our header writer, read back by the parser and from a file */
  const char *names[3] = {"model.a", "model.b", "z"};
  const char *dts[3] = {"F32", "BF16", "F16"};
  int32_t nds[3] = {2, 1, 0};
  int64_t shapes[24] = {0};
  shapes[0] = 2, shapes[1] = 3, shapes[8] = 4;
  const char *meta[2] = {"format", "pt"};
  int64_t begins[3];
  int64_t len = fsdp_safetensors_header(3, names, dts, nds, shapes, 1, meta, NULL, 0, NULL);
  CHECK(len > 8 && len % 8 == 0);
  unsigned char file[1024];
  CHECK(fsdp_safetensors_header(3, names, dts, nds, shapes, 1, meta, (char *)file, sizeof file, begins) == len);
  CHECK(begins[0] == len && begins[1] == len + 24 && begins[2] == len + 32);
  float a[6] = {1.5f, -2.0f, 3.25f, 0, 1e-3f, 65504.0f};
  uint16_t b[4] = {0x3fc0, 0xc000, 0x0000, 0x7f80}; /* bf16 1.5, -2, 0, inf */
  uint16_t z = 0x3c00;                               /* f16 1.0 */
  memcpy(file + begins[0], a, 24);
  memcpy(file + begins[1], b, 8);
  memcpy(file + begins[2], &z, 2);
  size_t n = (size_t)begins[2] + 2;
  fsdp_safetensors *st = NULL;
  CHECK_OK(parse(file, n, &st));
  CHECK(fsdp_safetensors_count(st) == 3);
  int ia = -1, ib = -1, iz = -1, missing = 7;
  CHECK(fsdp_safetensors_find(st, "model.b", &ib) == FSDP_OK && ib == 1);
  /* not there: a named result, not an error (no message), the index untouched */
  fsdp_clear_error();
  CHECK(fsdp_safetensors_find(st, "nope", &missing) == FSDP_ABSENT && missing == 7 && !*fsdp_last_error());
  CHECK_FAILS(fsdp_safetensors_find(st, "nope", NULL), FSDP_EINVAL, "NULL argument");
  const char *fm = fsdp_safetensors_metadata(st, "format");
  CHECK(fm && !strcmp(fm, "pt"));
  fsdp_safetensors_entry e;
  CHECK_OK(fsdp_safetensors_find(st, "model.a", &ia));
  CHECK_OK(fsdp_safetensors_entry_get(st, ia, &e));
  CHECK(e.ndim == 2 && e.shape[0] == 2 && e.shape[1] == 3 && !strcmp(e.dtype, "F32") && e.begin == begins[0] && e.end == begins[0] + 24);
  float x[6];
  CHECK_FAILS(fsdp_safetensors_read(st, 0, 0, 1, x), FSDP_ESTATE, "no file to read");
  CHECK_OK(fsdp_safetensors_close(st));
  char path[512];
  snprintf(path, sizeof path, "%s/t.safetensors", root);
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(file, 1, n, f);
    fclose(f);
  }
  CHECK_OK(fsdp_safetensors_open(path, &st));
  if (st) {
    CHECK(fsdp_safetensors_find(st, "model.a", &ia) == FSDP_OK && fsdp_safetensors_find(st, "model.b", &ib) == FSDP_OK &&
          fsdp_safetensors_find(st, "z", &iz) == FSDP_OK);
    CHECK_OK(fsdp_safetensors_read(st, ia, 1, 6, x));
    CHECK(!memcmp(x, a + 1, 20));
    CHECK_OK(fsdp_safetensors_read(st, ib, 0, 4, x));
    CHECK(x[0] == 1.5f && x[1] == -2.0f && x[2] == 0.0f && x[3] > 1e38f);
    CHECK_OK(fsdp_safetensors_read(st, iz, 0, 1, x));
    CHECK(x[0] == 1.0f);
    CHECK_FAILS(fsdp_safetensors_read(st, ia, 0, 7, x), FSDP_EINVAL, "which has 6");
    fsdp_safetensors_close(st);
  }
  CHECK(truncate(path, (off_t)n - 1) == 0);
  CHECK_FAILS(fsdp_safetensors_open(path, &st), FSDP_ECORRUPT, "tensor 'z': data_offsets [32, 34] out of range"); /* truncated */

  /* malformed headers, one fault each */
  unsigned char tiny[4] = {1, 0, 0, 0};
  CHECK_FAILS(parse(tiny, 4, &st), FSDP_ECORRUPT, "shorter than the 8-byte header length");
  unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  CHECK_FAILS(parse(huge, 16, &st), FSDP_ECORRUPT, "over the format's 100 MB limit");
  unsigned char past[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  CHECK_FAILS(parse(past, 16, &st), FSDP_ECORRUPT, "runs past the end of the file");
  bad_header("[1]     ", 0, "does not start with '{'");
  bad_header("{\"a\":1  ", 0, "not a JSON object");
  bad_header("{}  x   ", 0, "only spaces may pad it");
  bad_header("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'F33'");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "data_offsets span 4");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, "out of range");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "out of range");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "not a non-negative integer");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4, "non-negative integers");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "not a non-negative integer");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, "make more bytes");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unexpected or repeated key 'x'");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6, "overlap");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "bytes 4..8 of the data belong to no tensor");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "4 bytes after the last tensor");
  bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "'a' appears twice");
  bad_header("{\"__metadata__\":{\"k\":1}}", 0, "value 'k' is not a string");
  bad_header("{\"a\":[1]}", 0, "tensor 'a' is not an object");
  /* the empty file of no tensors is valid */
  unsigned char empty[16];
  size_t en = build(empty, "{}      ", 0);
  CHECK_OK(parse(empty, en, &st));
  fsdp_safetensors_close(st);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/fsdp-test-ckio-%d", (int)getpid());
  fsdp_fs_remove_tree(root);
  fsdp_fs_mkdirs(root);
  test_crc();
  test_fs();
  test_writer();
  test_reader();
  test_safetensors();
  fsdp_fs_remove_tree(root);
  return fsdp_test_summary("test_checkpoint_io");
}
