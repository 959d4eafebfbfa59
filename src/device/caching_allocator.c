/* caching_allocator.c: the per-device memory pools behind fsdp_alloc.
 *
 * Why: a training step allocates and frees the same activation and scratch
 * sizes every step. Without a cache each large CPU block is a fresh mmap
 * (page faults on every touch, every step) and each CUDA block a
 * cudaMalloc/cudaFree pair (a device-wide synchronisation). So freed blocks
 * are kept in free lists by size class and handed out again.
 *
 * Block sizes: up to 512 bytes one class; up to 8 MiB four classes per
 * power of two (2^k * 1.25, 1.5, 1.75, 2), a small block wasting at most 25%;
 * above 8 MiB whole 2 MiB granules (cudaMalloc's own granule), so a large
 * block wastes under 2 MiB. The large blocks are what a rank holds for the
 * whole run (params, optimizer state, grads: 116 MiB rows that a class of
 * 128 MiB would round up by 10%, 1.4 GiB on the 1B model), and reserved
 * bytes are what the device really gives up. A cached large block serves a
 * request whose own block would be at most 1/8 smaller (best fit), so sizes
 * that vary a little still find a cached block.
 *
 * Statistics per device: allocated (bytes as requested, in use), peak,
 * reserved (bytes held from the backend: in use plus cached, whole blocks),
 * its peak, cached, call counts and cache hits. When the backend runs out,
 * the device's cache is released and the allocation retried once.
 *
 * Every live block is in a hash table (pointer -> sizes), so freeing a
 * pointer that fsdp_alloc did not hand out, or freeing twice, is an error
 * with a message, not heap corruption. Under AddressSanitizer cached CPU
 * blocks are poisoned, and so is the tail past the requested size, so a
 * use after free or an overrun is still caught. FSDP_ALLOC_CACHE=0 in the
 * environment turns caching off (every free goes to the backend).
 *
 * CUDA: a cached block may be reused by the next allocation at once. That is
 * safe for memory used on one stream in issue order (compute); buffers that
 * cross streams (full unit buffers) come from fsdp_pool, which releases them
 * stream-ordered. Thread-safe: one mutex per device. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_device.h"
#include "cuda_backend.h"
#include "device_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define LARGE_MIN ((size_t)8 << 20) /* requests above this take whole granules */
#define GRANULE ((size_t)2 << 20)
#define NCLASS 57 /* class indices for sizes up to LARGE_MIN */
#define NDEV 2    /* FSDP_CPU, FSDP_CUDA */

typedef struct {
  void **v;
  int n, cap;
} stack;

typedef struct {
  void *ptr; /* NULL: empty slot */
  size_t block, requested;
} entry;

typedef struct {
  pthread_mutex_t mu;
  stack free_list[NCLASS];
  entry *large; /* cached large blocks (ptr, block), unordered */
  int nlarge, large_cap;
  entry *live;
  size_t live_cap, live_n;
  fsdp_memory_stats st;
} cache;

static cache caches[NDEV] = {{.mu = PTHREAD_MUTEX_INITIALIZER}, {.mu = PTHREAD_MUTEX_INITIALIZER}};
static int cache_enabled = -1; /* read from the environment once */

static const char *dev_name(int device) { return device == FSDP_CUDA ? "cuda" : "cpu"; }

/* the block size of class k: 512, then 2^e * (1 + j/4) for j = 1..4 */
static size_t class_bytes(int k) {
  if (k == 0) return 512;
  int e = (k - 1) / 4 + 9, j = (k - 1) % 4 + 1;
  return ((size_t)1 << e) + (size_t)j * ((size_t)1 << (e - 2));
}

/* the block a request of `bytes` gets, and its class (-1: a large block) */
static size_t block_of(size_t bytes, int *class_out) {
  if (bytes > LARGE_MIN) {
    *class_out = -1;
    return (bytes + GRANULE - 1) / GRANULE * GRANULE;
  }
  int k = 0;
  if (bytes > 512) {
    int e = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^e < bytes <= 2^(e+1), e >= 9 */
    size_t step = (size_t)1 << (e - 2);
    k = (e - 9) * 4 + (int)((bytes - ((size_t)1 << e) + step - 1) / step);
  }
  *class_out = k;
  return class_bytes(k);
}

int64_t fsdp_memory_block_bytes(int64_t bytes) {
  if (bytes <= 0) return 0;
  int k;
  return (int64_t)block_of((size_t)bytes, &k);
}

/* ---- backends ---- */
static int backend_alloc(int device, size_t bytes, void **out) {
  if (device == FSDP_CUDA) return fsdp_cuda()->alloc(bytes, out);
  return fsdp_host_alloc(bytes, out);
}

static void backend_free(int device, void *p, size_t bytes) {
  if (device == FSDP_CUDA) {
    fsdp_cuda()->free(p);
  } else {
    UNPOISON(p, bytes);
    fsdp_host_free(p);
  }
}

/* ---- the live-block table: open addressing, linear probing ---- */
static size_t slot_of(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p >> 8; /* blocks are 256-byte aligned */
  h *= 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 17) & (cap - 1);
}

static int live_insert(cache *c, void *p, size_t block, size_t requested);

static int live_grow(cache *c) {
  size_t old_cap = c->live_cap;
  entry *old = c->live;
  size_t cap = old_cap ? old_cap * 2 : 1024;
  entry *t = calloc(cap, sizeof *t);
  if (!t) return fsdp_fail(FSDP_ENOMEM, "alloc: cannot grow the allocator's block table to %zu entries", cap);
  c->live = t;
  c->live_cap = cap;
  c->live_n = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].ptr) live_insert(c, old[i].ptr, old[i].block, old[i].requested);
  free(old);
  return FSDP_OK;
}

static int live_insert(cache *c, void *p, size_t block, size_t requested) {
  if ((c->live_n + 1) * 2 > c->live_cap) FSDP_CHECK(live_grow(c));
  size_t i = slot_of(p, c->live_cap);
  while (c->live[i].ptr) i = (i + 1) & (c->live_cap - 1);
  c->live[i] = (entry){p, block, requested};
  c->live_n++;
  return FSDP_OK;
}

/* removes p; returns 0 when it was not there */
static int live_remove(cache *c, const void *p, entry *out) {
  if (!c->live_cap) return 0;
  size_t mask = c->live_cap - 1, i = slot_of(p, c->live_cap);
  while (c->live[i].ptr != p) {
    if (!c->live[i].ptr) return 0;
    i = (i + 1) & mask;
  }
  *out = c->live[i];
  /* backward-shift deletion keeps probe chains intact without tombstones */
  size_t j = i;
  for (;;) {
    c->live[i].ptr = NULL;
    for (;;) {
      j = (j + 1) & mask;
      if (!c->live[j].ptr) {
        c->live_n--;
        return 1;
      }
      size_t home = slot_of(c->live[j].ptr, c->live_cap);
      /* move j back to i unless its home lies cyclically in (i, j] */
      if (i <= j ? (i < home && home <= j) : (i < home || home <= j)) continue;
      break;
    }
    c->live[i] = c->live[j];
    i = j;
  }
}

static int push(stack *s, void *p) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 8;
    void **v = realloc(s->v, sizeof *v * (size_t)cap);
    if (!v) return 0;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = p;
  return 1;
}

/* keeps a freed block for reuse; 0 when it cannot be kept. c->mu held */
static int cache_put(cache *c, int k, void *p, size_t block) {
  if (k >= 0) return push(&c->free_list[k], p);
  if (c->nlarge == c->large_cap) {
    int cap = c->large_cap ? c->large_cap * 2 : 16;
    entry *v = realloc(c->large, sizeof *v * (size_t)cap);
    if (!v) return 0;
    c->large = v;
    c->large_cap = cap;
  }
  c->large[c->nlarge++] = (entry){p, block, 0};
  return 1;
}

/* a cached block for a request of *block bytes (class k), NULL on a miss;
 * a large one is the smallest that wastes at most 1/8 of itself, and
 * *block becomes its size. c->mu held */
static void *cache_take(cache *c, int k, size_t *block) {
  if (k >= 0) {
    stack *s = &c->free_list[k];
    return s->n ? s->v[--s->n] : NULL;
  }
  int best = -1;
  for (int i = 0; i < c->nlarge; i++) {
    size_t b = c->large[i].block;
    if (b >= *block && b - *block <= b / 8 && (best < 0 || b < c->large[best].block)) best = i;
  }
  if (best < 0) return NULL;
  void *p = c->large[best].ptr;
  *block = c->large[best].block;
  c->large[best] = c->large[--c->nlarge];
  return p;
}

/* gives every cached block of the device back to the backend; c->mu held */
static void release_cached(int device, cache *c) {
  for (int k = 0; k < NCLASS; k++) {
    stack *s = &c->free_list[k];
    while (s->n) {
      size_t block = class_bytes(k);
      void *p = s->v[--s->n];
      backend_free(device, p, block);
      c->st.reserved -= (int64_t)block;
      c->st.cached -= (int64_t)block;
    }
  }
  while (c->nlarge) {
    entry e = c->large[--c->nlarge];
    backend_free(device, e.ptr, e.block);
    c->st.reserved -= (int64_t)e.block;
    c->st.cached -= (int64_t)e.block;
  }
}

static int caching_on(void) {
  if (cache_enabled < 0) {
    const char *e = getenv("FSDP_ALLOC_CACHE");
    cache_enabled = !(e && strcmp(e, "0") == 0);
  }
  return cache_enabled;
}

int fsdp_cache_alloc(int device, size_t bytes, void **out) {
  cache *c = &caches[device == FSDP_CUDA];
  if (bytes > ((size_t)1 << 60)) return fsdp_fail(FSDP_ENOMEM, "alloc: %zu bytes on %s is more than any device has", bytes, dev_name(device));
  int k;
  size_t block = block_of(bytes, &k);
  pthread_mutex_lock(&c->mu);
  void *p = cache_take(c, k, &block);
  int hit = p != NULL, rc = FSDP_OK;
  if (hit) {
    c->st.cached -= (int64_t)block;
  } else {
    rc = backend_alloc(device, block, &p);
    if (rc == FSDP_ENOMEM && c->st.cached > 0) { /* give the cache back and retry once */
      release_cached(device, c);
      rc = backend_alloc(device, block, &p);
    }
    if (rc < 0) {
      pthread_mutex_unlock(&c->mu);
      return fsdp_fail_context(rc, "%zu bytes on %s (in use %lld, reserved %lld)", bytes, dev_name(device),
                               (long long)c->st.allocated, (long long)c->st.reserved);
    }
    c->st.reserved += (int64_t)block;
    if (c->st.reserved > c->st.peak_reserved) c->st.peak_reserved = c->st.reserved;
  }
  if (live_insert(c, p, block, bytes) < 0) {
    if (hit && cache_put(c, k, p, block)) c->st.cached += (int64_t)block;
    else backend_free(device, p, block), c->st.reserved -= (int64_t)block;
    pthread_mutex_unlock(&c->mu);
    return FSDP_ENOMEM;
  }
  if (device != FSDP_CUDA) {
    UNPOISON(p, bytes);
    POISON((char *)p + bytes, block - bytes);
  }
  c->st.allocated += (int64_t)bytes;
  if (c->st.allocated > c->st.peak) c->st.peak = c->st.allocated;
  c->st.allocs++;
  c->st.cache_hits += hit;
  pthread_mutex_unlock(&c->mu);
  *out = p;
  return FSDP_OK;
}

int fsdp_cache_free(int device, void *ptr) {
  cache *c = &caches[device == FSDP_CUDA];
  entry e;
  pthread_mutex_lock(&c->mu);
  if (!live_remove(c, ptr, &e)) {
    pthread_mutex_unlock(&c->mu);
    return fsdp_fail(FSDP_EINVAL, "free: %p on %s was not allocated by fsdp_alloc there, or was freed already", ptr,
                     dev_name(device));
  }
  c->st.allocated -= (int64_t)e.requested;
  c->st.frees++;
  int k;
  block_of(e.block, &k); /* a block's own size maps to its class */
  if (caching_on() && cache_put(c, k, ptr, e.block)) {
    if (device != FSDP_CUDA) POISON(ptr, e.block);
    c->st.cached += (int64_t)e.block;
  } else {
    backend_free(device, ptr, e.block);
    c->st.reserved -= (int64_t)e.block;
  }
  pthread_mutex_unlock(&c->mu);
  return FSDP_OK;
}

static int check_stats_device(int device, const char *what) {
  if (device == FSDP_CPU || device == FSDP_CUDA) return FSDP_OK;
  return fsdp_fail(FSDP_EINVAL, "%s: unknown device %d (expected 0 = cpu, 1 = cuda)", what, device);
}

int fsdp_memory_get_stats(int device, fsdp_memory_stats *out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "memory_get_stats: NULL out");
  FSDP_CHECK(check_stats_device(device, "memory_get_stats"));
  cache *c = &caches[device == FSDP_CUDA];
  pthread_mutex_lock(&c->mu);
  *out = c->st;
  pthread_mutex_unlock(&c->mu);
  return FSDP_OK;
}

int fsdp_memory_reset_peak(int device) {
  FSDP_CHECK(check_stats_device(device, "memory_reset_peak"));
  cache *c = &caches[device == FSDP_CUDA];
  pthread_mutex_lock(&c->mu);
  c->st.peak = c->st.allocated;
  c->st.peak_reserved = c->st.reserved;
  pthread_mutex_unlock(&c->mu);
  return FSDP_OK;
}

int fsdp_memory_empty_cache(int device) {
  FSDP_CHECK(check_stats_device(device, "memory_empty_cache"));
  cache *c = &caches[device == FSDP_CUDA];
  pthread_mutex_lock(&c->mu);
  release_cached(device, c);
  pthread_mutex_unlock(&c->mu);
  return FSDP_OK;
}
