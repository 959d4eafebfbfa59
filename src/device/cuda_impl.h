/* cuda_impl.h: the CUDA device backend's functions (cuda.c), inside
 * libfsdp_cuda.so. The rest of the engine reaches them through the table of
 * cuda_backend.h, never by name: libfsdp.so does not link CUDA. */
#ifndef FSDP_DEVICE_CUDA_IMPL_H
#define FSDP_DEVICE_CUDA_IMPL_H

#include "device_impl.h"

int fsdp_cuda_available(void);
int fsdp_cuda_device_count(void);
int fsdp_cuda_set_device(int index);
int fsdp_cuda_alloc(size_t bytes, void **out);
int fsdp_cuda_free(void *ptr);
int fsdp_cuda_mem_info(int64_t *free_bytes, int64_t *total);
int fsdp_cuda_device_name(char *buf, size_t size);
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
/* guard(what, seconds waited): asked while a stream or event wait polls;
 * nonzero (a status, its message set) ends the wait with it. NULL: waits
 * block (the default). The NCCL transport installs one while it has
 * communicators (comm_nccl.c). */
void fsdp_cuda_set_wait_guard(int (*guard)(const char *what, double waited_s));
int fsdp_cuda_event_create_timed(fsdp_event **out);
int fsdp_cuda_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds);
/* s may be NULL (synchronous). Any direction; CUDA works out which from UVA. */
int fsdp_cuda_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s);
int fsdp_cuda_memset(void *dst, int value, size_t bytes, fsdp_stream *s);
/* 1 when ptr is device memory. */
int fsdp_cuda_is_device_ptr(const void *ptr);

/* 1 when ptr is host memory from fsdp_cuda_alloc_host_pinned. */
int fsdp_cuda_is_pinned_ptr(const void *ptr);

#endif
