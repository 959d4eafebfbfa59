/* device.c: the public device API; dispatches to the CPU or CUDA backend by
 * the handle's device kind, and owns CPU memory. The CUDA backend is opened
 * only when CUDA is asked for (a device, a stream, an event on it): without
 * it no memory in this process is CUDA memory, so host copies and pinned
 * memory never open it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"
#include "../fsdp_device.h"
#include "cuda_backend.h"
#include "device_impl.h"

static int check_device(int device, const char *what) {
  if (device == FSDP_CPU) return FSDP_OK;
  if (device == FSDP_CUDA) {
    if (!fsdp_cuda()->available())
      return fsdp_fail_context(FSDP_EUNSUPPORTED, "%s: no CUDA device here", what); /* + the probe's reason */
    return FSDP_OK;
  }
  return fsdp_fail(FSDP_EINVAL, "%s: unknown device %d (expected 0 = cpu, 1 = cuda)", what, device);
}

int fsdp_device_available(int device) {
  if (device == FSDP_CPU) return 1;
  if (device == FSDP_CUDA) return fsdp_cuda()->available();
  return 0;
}

int fsdp_device_count(int device) {
  if (device == FSDP_CPU) return 1;
  if (device == FSDP_CUDA) return fsdp_cuda()->available() ? fsdp_cuda()->device_count() : 0;
  return 0;
}

int fsdp_device_set(int device, int index) {
  FSDP_CHECK(check_device(device, "device_set"));
  if (device == FSDP_CUDA) return fsdp_cuda()->set_device(index);
  return index == 0 ? FSDP_OK : fsdp_fail(FSDP_EINVAL, "device_set: the cpu device has index 0");
}

int fsdp_alloc(int device, size_t bytes, void **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "alloc: NULL out");
  *out = NULL;
  FSDP_CHECK(check_device(device, "alloc"));
  return fsdp_cache_alloc(device, bytes, out);
}

int fsdp_free(int device, void *ptr) {
  if (!ptr) return FSDP_OK;
  if (device != FSDP_CPU && device != FSDP_CUDA) return fsdp_fail(FSDP_EINVAL, "free: unknown device %d", device);
  return fsdp_cache_free(device, ptr);
}

int fsdp_device_memory_info(int device, int64_t *free_bytes, int64_t *total) {
  if (!free_bytes || !total) return fsdp_fail(FSDP_EINVAL, "device_memory_info: NULL out");
  FSDP_CHECK(check_device(device, "device_memory_info"));
  if (device == FSDP_CUDA) return fsdp_cuda()->mem_info(free_bytes, total);
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return fsdp_fail(FSDP_EIO, "device_memory_info: cannot read /proc/meminfo");
  char line[256];
  long long avail = -1, tot = -1, kb;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) avail = kb;
    if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) tot = kb;
  }
  fclose(f);
  if (avail < 0 || tot < 0) return fsdp_fail(FSDP_EIO, "device_memory_info: /proc/meminfo has no MemAvailable/MemTotal");
  *free_bytes = avail * 1024;
  *total = tot * 1024;
  return FSDP_OK;
}

int fsdp_device_name(int device, char *buf, int64_t size) {
  if (!buf || size < 1) return fsdp_fail(FSDP_EINVAL, "device_name: no buffer");
  FSDP_CHECK(check_device(device, "device_name"));
  if (device == FSDP_CUDA) return fsdp_cuda()->device_name(buf, (size_t)size);
  snprintf(buf, (size_t)size, "cpu");
  return FSDP_OK;
}

/* 1 when the CUDA backend is open and has a GPU (never opens it) */
static int cuda_in_use(void) { return fsdp_cuda_loaded() && fsdp_cuda()->available(); }

int fsdp_alloc_host_pinned(size_t bytes, void **out) {
  if (cuda_in_use()) return fsdp_cuda()->alloc_host_pinned(bytes, out);
  return fsdp_alloc(FSDP_CPU, bytes, out);
}

int fsdp_free_host_pinned(void *ptr) {
  /* by what the memory is: it may predate the backend's opening */
  if (ptr && cuda_in_use() && fsdp_cuda()->is_pinned_ptr(ptr)) return fsdp_cuda()->free_host_pinned(ptr);
  return fsdp_free(FSDP_CPU, ptr);
}

int fsdp_stream_create(int device, fsdp_stream **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "stream_create: NULL out");
  *out = NULL;
  FSDP_CHECK(check_device(device, "stream_create"));
  return device == FSDP_CUDA ? fsdp_cuda()->stream_create(out) : fsdp_cpu_stream_create(out);
}

int fsdp_stream_destroy(fsdp_stream *s) {
  if (!s) return FSDP_OK;
  return s->device == FSDP_CUDA ? fsdp_cuda()->stream_destroy(s) : fsdp_cpu_stream_destroy(s);
}

int fsdp_stream_device(const fsdp_stream *s) { return s ? s->device : FSDP_EINVAL; }

int fsdp_stream_synchronize(fsdp_stream *s) {
  if (!s) return FSDP_OK;
  return s->device == FSDP_CUDA ? fsdp_cuda()->stream_synchronize(s) : fsdp_cpu_stream_synchronize(s);
}

int fsdp_stream_wait_event(fsdp_stream *s, fsdp_event *e) {
  if (!e) return fsdp_fail(FSDP_EINVAL, "stream_wait_event: NULL event");
  if (!s) return fsdp_event_synchronize(e);
  if (s->device != e->device)
    return fsdp_fail(FSDP_EINVAL, "stream_wait_event: a %s stream cannot wait on a %s event",
                     s->device == FSDP_CUDA ? "cuda" : "cpu", e->device == FSDP_CUDA ? "cuda" : "cpu");
  return s->device == FSDP_CUDA ? fsdp_cuda()->stream_wait_event(s, e) : fsdp_cpu_stream_wait_event(s, e);
}

static int delay_task(void *arg) {
  int64_t us = *(int64_t *)arg;
  while (us > 0) {
    useconds_t step = us > 500000 ? 500000 : (useconds_t)us;
    usleep(step);
    us -= step;
  }
  return FSDP_OK;
}

int fsdp_stream_delay(fsdp_stream *s, int64_t microseconds) {
  if (microseconds < 0) return fsdp_fail(FSDP_EINVAL, "stream_delay: negative time %lld", (long long)microseconds);
  if (!s) return delay_task(&microseconds);
  if (s->device == FSDP_CUDA) return fsdp_cuda()->stream_delay(s, microseconds);
  int64_t *arg = malloc(sizeof *arg);
  if (!arg) return fsdp_fail(FSDP_ENOMEM, "stream_delay: out of memory");
  *arg = microseconds;
  return fsdp_cpu_stream_enqueue(s, delay_task, arg, free);
}

int fsdp_event_create(int device, fsdp_event **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "event_create: NULL out");
  *out = NULL;
  FSDP_CHECK(check_device(device, "event_create"));
  return device == FSDP_CUDA ? fsdp_cuda()->event_create(out) : fsdp_cpu_event_create(out);
}

int fsdp_event_create_timed(int device, fsdp_event **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "event_create_timed: NULL out");
  *out = NULL;
  FSDP_CHECK(check_device(device, "event_create_timed"));
  return device == FSDP_CUDA ? fsdp_cuda()->event_create_timed(out) : fsdp_cpu_event_create_timed(out);
}

int fsdp_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds) {
  if (!a || !b || !seconds) return fsdp_fail(FSDP_EINVAL, "event_elapsed: NULL argument");
  if (a->device != b->device) return fsdp_fail(FSDP_EINVAL, "event_elapsed: events on different devices");
  return a->device == FSDP_CUDA ? fsdp_cuda()->event_elapsed(a, b, seconds) : fsdp_cpu_event_elapsed(a, b, seconds);
}

int fsdp_event_destroy(fsdp_event *e) {
  if (!e) return FSDP_OK;
  return e->device == FSDP_CUDA ? fsdp_cuda()->event_destroy(e) : fsdp_cpu_event_destroy(e);
}

int fsdp_event_record(fsdp_event *e, fsdp_stream *s) {
  if (!e) return fsdp_fail(FSDP_EINVAL, "event_record: NULL event");
  if (s && s->device != e->device)
    return fsdp_fail(FSDP_EINVAL, "event_record: event and stream are on different devices");
  return e->device == FSDP_CUDA ? fsdp_cuda()->event_record(e, s) : fsdp_cpu_event_record(e, s);
}

int fsdp_event_query(fsdp_event *e) {
  if (!e) return fsdp_fail(FSDP_EINVAL, "event_query: NULL event");
  return e->device == FSDP_CUDA ? fsdp_cuda()->event_query(e) : fsdp_cpu_event_query(e);
}

int fsdp_event_synchronize(fsdp_event *e) {
  if (!e) return fsdp_fail(FSDP_EINVAL, "event_synchronize: NULL event");
  return e->device == FSDP_CUDA ? fsdp_cuda()->event_synchronize(e) : fsdp_cpu_event_synchronize(e);
}

struct copy_args {
  void *dst;
  const void *src;
  size_t bytes;
  int value;
  int is_set;
};

static int copy_task(void *arg) {
  struct copy_args *a = arg;
  if (a->is_set)
    memset(a->dst, a->value, a->bytes);
  else
    memmove(a->dst, a->src, a->bytes);
  return FSDP_OK;
}

static int host_copy(void *dst, const void *src, int value, size_t bytes, int is_set, fsdp_stream *s) {
  struct copy_args a = {dst, src, bytes, value, is_set};
  if (!s) return copy_task(&a);
  struct copy_args *h = malloc(sizeof *h);
  if (!h) return fsdp_fail(FSDP_ENOMEM, "memcpy: out of memory");
  *h = a;
  return fsdp_cpu_stream_enqueue(s, copy_task, h, free);
}

int fsdp_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s) {
  if (!bytes) return FSDP_OK;
  if (!dst || !src) return fsdp_fail(FSDP_EINVAL, "memcpy: NULL buffer");
  int cuda = (s && s->device == FSDP_CUDA) ||
             (cuda_in_use() && (fsdp_cuda()->is_device_ptr(dst) || fsdp_cuda()->is_device_ptr(src)));
  if (cuda) return fsdp_cuda()->memcpy(dst, src, bytes, s);
  return host_copy(dst, src, 0, bytes, 0, s);
}

int fsdp_memset(void *dst, int value, size_t bytes, fsdp_stream *s) {
  if (!bytes) return FSDP_OK;
  if (!dst) return fsdp_fail(FSDP_EINVAL, "memset: NULL buffer");
  int cuda = (s && s->device == FSDP_CUDA) || (cuda_in_use() && fsdp_cuda()->is_device_ptr(dst));
  if (cuda) return fsdp_cuda()->memset(dst, value, bytes, s);
  return host_copy(dst, NULL, value, bytes, 1, s);
}
