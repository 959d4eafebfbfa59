/* host_memory.c: raw CPU memory for the caching pool, 256-byte aligned like
 * cudaMalloc (so kernels and vector code see the same alignment on both
 * devices). Statistics and reuse live in caching_allocator.c. */
#include <stdint.h>
#include <stdlib.h>

#include "../base/error.h"
#include "../fsdp_device.h"
#include "device_impl.h"

int fsdp_host_alloc(size_t bytes, void **out) {
  size_t rounded = (bytes + 255) & ~(size_t)255;
  void *p = rounded >= bytes ? aligned_alloc(256, rounded ? rounded : 256) : NULL;
  if (!p) return fsdp_fail(FSDP_ENOMEM, "alloc: %zu bytes of host memory failed", bytes);
  *out = p;
  return FSDP_OK;
}

void fsdp_host_free(void *ptr) { free(ptr); }
