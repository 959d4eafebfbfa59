/* device_impl.h: what the device layer's backends share. fsdp_stream and
 * fsdp_event start with their device kind; device.c dispatches on it. */
#ifndef FSDP_DEVICE_IMPL_H
#define FSDP_DEVICE_IMPL_H

#include "../fsdp_device.h"

struct fsdp_stream {
  int device;
};

struct fsdp_event {
  int device;
};

/* ---- raw host memory, 256-byte aligned (host_memory.c) ---- */
int fsdp_host_alloc(size_t bytes, void **out);
void fsdp_host_free(void *ptr);

/* ---- the per-device caching pools behind fsdp_alloc (caching_allocator.c) ---- */
int fsdp_cache_alloc(int device, size_t bytes, void **out);
int fsdp_cache_free(int device, void *ptr);

/* ---- CPU backend (cpu_stream.c) ---- */
/* A task runs on the stream's worker thread; returning < 0 marks the stream
 * failed with the worker's last error. free_arg (may be NULL) runs after fn,
 * or instead of it when the stream has already failed. */
typedef int (*fsdp_task_fn)(void *arg);
int fsdp_cpu_stream_create(fsdp_stream **out);
int fsdp_cpu_stream_destroy(fsdp_stream *s);
int fsdp_cpu_stream_enqueue(fsdp_stream *s, fsdp_task_fn fn, void *arg, void (*free_arg)(void *));
int fsdp_cpu_stream_synchronize(fsdp_stream *s);
int fsdp_cpu_stream_wait_event(fsdp_stream *s, fsdp_event *e);
int fsdp_cpu_event_create(fsdp_event **out);
int fsdp_cpu_event_destroy(fsdp_event *e);
int fsdp_cpu_event_record(fsdp_event *e, fsdp_stream *s);
int fsdp_cpu_event_query(fsdp_event *e);
int fsdp_cpu_event_synchronize(fsdp_event *e);
int fsdp_cpu_event_create_timed(fsdp_event **out);
int fsdp_cpu_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds);

/* ---- CUDA backend: libfsdp_cuda.so, reached through cuda_backend.h ---- */

#endif
