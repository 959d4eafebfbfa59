/* json_util.h: the checks both JSON readers (checkpoint index, safetensors
 * header) apply to cJSON's values. cJSON keeps numbers as doubles: an
 * integer is accepted only when it is exactly representable (below 2^53),
 * so that a huge offset can never be rounded into a plausible one. */
#ifndef FSDP_IO_JSON_UTIL_H
#define FSDP_IO_JSON_UTIL_H

#include <cjson/cJSON.h>
#include <stdint.h>

/* 1 and *out when item is an integer in [0, 2^53], else 0 */
static inline int json_uint(const cJSON *item, int64_t *out) {
  if (!cJSON_IsNumber(item)) return 0;
  double d = item->valuedouble;
  if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return 0;
  *out = (int64_t)d;
  return 1;
}

/* the number of members of an object or array (cJSON_GetArraySize is an int) */
static inline int64_t json_count(const cJSON *item) {
  int64_t n = 0;
  for (const cJSON *c = item ? item->child : NULL; c; c = c->next) n++;
  return n;
}

#endif
