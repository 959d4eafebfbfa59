/* scan.c: one pass over a large buffer for the first bad element: a
 * non-finite float (weights at load), a token id at or above the vocabulary
 * (token files at open). Each block is reduced to one flag by a loop the
 * compiler vectorises (built -O3: about 20 GB/s on one core, so a file or a
 * shard is checked at memory speed); only a block that has a bad element is
 * scanned again for its position. */
#include "scan.h"

#include <string.h>

#include "../fsdp_base.h"
#include "heartbeat.h"

enum { BLOCK = 4096 };

static int nonfinite_bits(uint32_t u) { return (u & 0x7f800000u) == 0x7f800000u; }

int64_t fsdp_find_nonfinite(const float *x, int64_t n) {
  if (!x) return -1;
  for (int64_t b = 0; b < n; b += BLOCK) {
    int64_t m = n - b < BLOCK ? n - b : BLOCK;
    const float *p = x + b;
    uint32_t any = 0;
    for (int64_t i = 0; i < m; i++) {
      uint32_t u;
      memcpy(&u, p + i, 4);
      any |= (uint32_t)nonfinite_bits(u);
    }
    for (int64_t i = 0; any && i < m; i++) {
      uint32_t u;
      memcpy(&u, p + i, 4);
      if (nonfinite_bits(u)) return b + i;
    }
  }
  return -1;
}

/* little-endian tokens of `width` bytes at p (any alignment) */
static uint32_t token_at(const unsigned char *p, int width) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (width == 2) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
#else
  uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8;
  if (width == 4) v |= (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  return v;
#endif
}

/* the block's largest token; written per width so that each loop vectorises */
static uint32_t block_max(const unsigned char *p, int width, int64_t m) {
  if (width == 2) {
    uint16_t mx = 0;
    for (int64_t i = 0; i < m; i++) {
      uint16_t v = (uint16_t)token_at(p + 2 * i, 2);
      mx = v > mx ? v : mx;
    }
    return mx;
  }
  uint32_t mx = 0;
  for (int64_t i = 0; i < m; i++) {
    uint32_t v = token_at(p + 4 * i, 4);
    mx = v > mx ? v : mx;
  }
  return mx;
}

int64_t fsdp_scan_tokens_at_least(const unsigned char *tokens, int width, int64_t n, uint32_t bound, uint32_t *value) {
  for (int64_t b = 0; b < n; b += BLOCK) {
    int64_t m = n - b < BLOCK ? n - b : BLOCK;
    const unsigned char *p = tokens + (size_t)b * (size_t)width;
    /* every 1Mi tokens: a corpus of hundreds of GB read from disk is
     * minutes of progress, not a stall (fsdprun --heartbeat-timeout) */
    if ((b & ((1 << 20) - 1)) == 0) fsdp_heartbeat_pulse();
    if (block_max(p, width, m) < bound) continue;
    for (int64_t i = 0; i < m; i++) {
      uint32_t v = token_at(p + (size_t)i * (size_t)width, width);
      if (v >= bound) {
        if (value) *value = v;
        return b + i;
      }
    }
  }
  return -1;
}
