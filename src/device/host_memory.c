/* host_memory.c: CPU memory for the engine, 256-byte aligned like cudaMalloc,
 * with statistics (bytes allocated now, peak, counts), so tests and the
 * planner can check what a rank really holds. Each block carries its size in
 * a 256-byte header, which keeps the user pointer aligned. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "../base/error.h"
#include "device_impl.h"

#define HEADER 256u

static _Atomic int64_t allocated, peak, n_allocs, n_frees;

int fsdp_host_alloc(size_t bytes, void **out) {
  if (bytes > SIZE_MAX - 2 * HEADER) return fsdp_fail(FSDP_ENOMEM, "alloc: %zu bytes of host memory failed", bytes);
  size_t rounded = (bytes + HEADER - 1) & ~(size_t)(HEADER - 1);
  char *base = aligned_alloc(HEADER, rounded + HEADER);
  if (!base) return fsdp_fail(FSDP_ENOMEM, "alloc: %zu bytes of host memory failed", bytes);
  *(size_t *)base = bytes;
  int64_t now = atomic_fetch_add(&allocated, (int64_t)bytes) + (int64_t)bytes;
  int64_t old = atomic_load(&peak);
  while (now > old && !atomic_compare_exchange_weak(&peak, &old, now)) {
  }
  atomic_fetch_add(&n_allocs, 1);
  *out = base + HEADER;
  return FSDP_OK;
}

void fsdp_host_free(void *ptr) {
  if (!ptr) return;
  char *base = (char *)ptr - HEADER;
  atomic_fetch_sub(&allocated, (int64_t)*(size_t *)base);
  atomic_fetch_add(&n_frees, 1);
  free(base);
}

int fsdp_memory_get_stats(int device, fsdp_memory_stats *out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "memory_get_stats: NULL out");
  if (device != FSDP_CPU)
    return fsdp_fail(FSDP_EUNSUPPORTED, "memory_get_stats: only the cpu device keeps statistics so far");
  out->allocated = atomic_load(&allocated);
  out->peak = atomic_load(&peak);
  out->allocs = atomic_load(&n_allocs);
  out->frees = atomic_load(&n_frees);
  return FSDP_OK;
}

int fsdp_memory_reset_peak(int device) {
  if (device != FSDP_CPU)
    return fsdp_fail(FSDP_EUNSUPPORTED, "memory_reset_peak: only the cpu device keeps statistics so far");
  atomic_store(&peak, atomic_load(&allocated));
  return FSDP_OK;
}
