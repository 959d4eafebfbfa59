/* device_impl.h: what the device layer's backends share. fsdp_stream and
 * fsdp_event start with their device kind; device.c dispatches on it. */
#ifndef FSDP_DEVICE_IMPL_H
#define FSDP_DEVICE_IMPL_H

#include "../fsdp.h"

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

/* ---- CUDA backend (cuda.c; cuda_none.c when built without CUDA) ---- */
int fsdp_cuda_available(void);
int fsdp_cuda_device_count(void);
int fsdp_cuda_set_device(int index);
int fsdp_cuda_alloc(size_t bytes, void **out);
int fsdp_cuda_free(void *ptr);
int fsdp_cuda_mem_info(int64_t *free_bytes, int64_t *total);
int fsdp_cuda_alloc_host_pinned(size_t bytes, void **out);
int fsdp_cuda_free_host_pinned(void *ptr);
int fsdp_cuda_stream_create(fsdp_stream **out);
int fsdp_cuda_stream_destroy(fsdp_stream *s);
int fsdp_cuda_stream_synchronize(fsdp_stream *s);
int fsdp_cuda_stream_wait_event(fsdp_stream *s, fsdp_event *e);
int fsdp_cuda_stream_delay(fsdp_stream *s, int64_t microseconds);
/* The cudaStream_t behind a CUDA fsdp_stream (void * keeps CUDA headers out). */
void *fsdp_cuda_stream_handle(fsdp_stream *s);
int fsdp_cuda_event_create(fsdp_event **out);
int fsdp_cuda_event_destroy(fsdp_event *e);
int fsdp_cuda_event_record(fsdp_event *e, fsdp_stream *s);
int fsdp_cuda_event_query(fsdp_event *e);
int fsdp_cuda_event_synchronize(fsdp_event *e);
/* s may be NULL (synchronous). Any direction; CUDA works out which from UVA. */
int fsdp_cuda_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s);
int fsdp_cuda_memset(void *dst, int value, size_t bytes, fsdp_stream *s);
/* 1 when ptr is device memory. */
int fsdp_cuda_is_device_ptr(const void *ptr);

#endif
