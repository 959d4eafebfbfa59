/* bf16.h: inline bf16 <-> fp32 for hot loops (reductions, casts), so the
 * compiler can vectorise them; dtype.c exports the same functions. */
#ifndef FSDP_BASE_BF16_H
#define FSDP_BASE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float fsdp_bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* round to nearest even; NaN stays a (quiet) NaN */
static inline uint16_t fsdp_bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x40u;
  /* a select, not a branch, so loops over it vectorise */
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

#endif
