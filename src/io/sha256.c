/* sha256.c: SHA-256 (FIPS 180-4), for the one fingerprint the trainer
 * compares with what a tool outside the engine wrote: the sha256 of a
 * Hugging Face folder's tokenizer.json, which `fsdp prepare` records in a
 * token file's manifest.json (Python's hashlib gives the same hex digest).
 * A plain implementation: a tokenizer.json of 10-20 MB hashes in well under
 * a second, once per run. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_io.h"

typedef struct {
  uint32_t h[8];
  uint64_t bytes;          /* message length so far */
  unsigned char block[64]; /* a partial block */
  size_t fill;
} sha256_state;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void compress(uint32_t h[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ w[i - 15] >> 3;
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ w[i - 2] >> 10;
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

static void sha_init(sha256_state *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->bytes = 0;
  s->fill = 0;
}

static void sha_update(sha256_state *s, const unsigned char *p, size_t n) {
  s->bytes += n;
  if (s->fill) {
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->block + s->fill, p, take);
    s->fill += take;
    p += take;
    n -= take;
    if (s->fill < 64) return;
    compress(s->h, s->block);
    s->fill = 0;
  }
  for (; n >= 64; p += 64, n -= 64) compress(s->h, p);
  memcpy(s->block, p, n);
  s->fill = n;
}

static void sha_hex(sha256_state *s, char hex[65]) {
  uint64_t bits = s->bytes * 8;
  unsigned char pad[72] = {0x80};
  size_t padn = (s->fill < 56 ? 56 : 120) - s->fill; /* to 56 mod 64, then the 8-byte length */
  for (int i = 0; i < 8; i++) pad[padn + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
  sha_update(s, pad, padn + 8);
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    unsigned v = s->h[i / 4] >> (24 - 8 * (i % 4)) & 0xff;
    hex[2 * i] = digits[v >> 4];
    hex[2 * i + 1] = digits[v & 15];
  }
  hex[64] = '\0';
}

int fsdp_sha256(const void *data, size_t n, char *hex) {
  if (!hex || (!data && n)) return fsdp_fail(FSDP_EINVAL, "fsdp_sha256: NULL argument");
  sha256_state s;
  sha_init(&s);
  sha_update(&s, data, n);
  sha_hex(&s, hex);
  return FSDP_OK;
}

int fsdp_sha256_file(const char *path, char *hex) {
  if (!path || !hex) return fsdp_fail(FSDP_EINVAL, "fsdp_sha256_file: NULL argument");
  FILE *fp = fopen(path, "rb");
  if (!fp) return fsdp_fail(FSDP_EIO, "sha256 of '%s': cannot open: %s", path, strerror(errno));
  sha256_state s;
  sha_init(&s);
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, fp)) > 0) sha_update(&s, buf, n);
  int bad = ferror(fp);
  int err = errno;
  fclose(fp);
  if (bad) return fsdp_fail(FSDP_EIO, "sha256 of '%s': read failed: %s", path, strerror(err));
  sha_hex(&s, hex);
  return FSDP_OK;
}
