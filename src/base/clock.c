/* clock.c: a monotonic clock for timings, the same one in C and Lua. */
#include <time.h>

#include "../fsdp_base.h"

double fsdp_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
