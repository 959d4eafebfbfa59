/* scan.h: the engine's side of scan.c (fsdp_find_nonfinite is public). */
#ifndef FSDP_BASE_SCAN_H
#define FSDP_BASE_SCAN_H

#include <stdint.h>

/* The index of the first of n little-endian tokens of `width` bytes (2 or 4)
 * that is >= bound, its value in *value; -1 when there is none. */
int64_t fsdp_scan_tokens_at_least(const unsigned char *tokens, int width, int64_t n, uint32_t bound, uint32_t *value);

#endif
