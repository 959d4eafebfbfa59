/* fsdp_device.h: the device layer's API (src/device/): devices, memory
 * and its caching pools, tensors, streams and events, copies. Part of the
 * public API: included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_DEVICE_API_H
#define FSDP_DEVICE_API_H

#include "fsdp_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory, streams, events ---------------------------------- */
typedef struct fsdp_stream fsdp_stream;
typedef struct fsdp_event fsdp_event;

int fsdp_device_available(int device);     /* 1 when usable here */
int fsdp_device_count(int device);
/* The CUDA backend (libfsdp_cuda.so: CUDA runtime, cuBLASLt, NCCL, cuDNN)
 * is opened the first time a CUDA device is asked for, never by CPU jobs.
 * Its path, opening it if needed; NULL where there is none (the reason in
 * fsdp_last_error()). Its public fsdp_cuda_* entry points (fsdp_ops.h) are
 * then found by name in the process (it is opened RTLD_GLOBAL). */
const char *fsdp_cuda_library(void);
int fsdp_device_set(int device, int index);/* CUDA: select the GPU */

int fsdp_alloc(int device, size_t bytes, void **out);   /* 256-byte aligned */
int fsdp_alloc_host_pinned(size_t bytes, void **out);
int fsdp_free(int device, void *ptr);
int fsdp_free_host_pinned(void *ptr);
/* fsdp_alloc serves each device from a caching pool (freed blocks are kept
 * and reused; see src/device/caching_allocator.c). allocated: bytes handed
 * out and not freed, as requested; peak: its high-water mark; reserved:
 * bytes the pool holds from the device (in use, rounded to the block size:
 * a size class up to 8 MiB, whole 2 MiB granules above; plus cached);
 * cached: the free part of that. */
typedef struct fsdp_memory_stats {
  int64_t allocated, peak, allocs, frees;
  int64_t reserved, peak_reserved, cached, cache_hits;
} fsdp_memory_stats;
int fsdp_memory_get_stats(int device, fsdp_memory_stats *out);
int fsdp_memory_reset_peak(int device);      /* both peaks := current */
int fsdp_memory_empty_cache(int device);     /* cached blocks back to the device */
/* The block a request of `bytes` takes from the pool (either device): what
 * it really holds. Negative bytes: 0. */
int64_t fsdp_memory_block_bytes(int64_t bytes);
/* What the device has: CPU: MemAvailable and MemTotal of /proc/meminfo
 * (the whole machine, shared by its ranks); CUDA: cudaMemGetInfo. The
 * pool's cached bytes are free to this process but not counted here. */
int fsdp_device_memory_info(int device, int64_t *free_bytes, int64_t *total);
/* The device's name into buf (size bytes, NUL-terminated, cut to fit):
 * CUDA: the current GPU's (cudaGetDeviceProperties: "NVIDIA H100 80GB
 * HBM3"), the key of the MFU's table of peaks; CPU: "cpu" (the trainer reads
 * /proc/cpuinfo for the CPU's own). */
int fsdp_device_name(int device, char *buf, int64_t size);

/* A contiguous tensor of one dtype on one device, 1 to 4-D; it owns its
 * memory (tensor_alloc) or views part of another (tensor_view). */
typedef struct fsdp_tensor {
  void *data;
  int32_t dtype, device, ndim, owns;
  int64_t shape[4]; /* unused dimensions are 1 */
} fsdp_tensor;
int fsdp_tensor_alloc(fsdp_tensor *t, int device, fsdp_dtype dtype, int ndim, const int64_t *shape);
/* t = elements [offset, offset + numel(shape)) of base, reshaped; no copy. */
int fsdp_tensor_view(fsdp_tensor *t, const fsdp_tensor *base, int64_t offset, int ndim, const int64_t *shape);
int fsdp_tensor_free(fsdp_tensor *t); /* idempotent; a view frees nothing */
int64_t fsdp_tensor_numel(const fsdp_tensor *t);
size_t fsdp_tensor_nbytes(const fsdp_tensor *t);

/* A stream runs enqueued work in order. CPU: a worker thread. */
int fsdp_stream_create(int device, fsdp_stream **out);
int fsdp_stream_destroy(fsdp_stream *s);   /* waits for pending work */
int fsdp_stream_device(const fsdp_stream *s);
/* Wait for everything enqueued; reports the first asynchronous error. */
int fsdp_stream_synchronize(fsdp_stream *s);
/* The stream waits (without blocking the caller) for the event's last record.
 * s == NULL: the calling thread blocks instead. */
int fsdp_stream_wait_event(fsdp_stream *s, fsdp_event *e);
/* Enqueue a pause (testing aid for ordering and overlap). */
int fsdp_stream_delay(fsdp_stream *s, int64_t microseconds);

int fsdp_event_create(int device, fsdp_event **out);
int fsdp_event_destroy(fsdp_event *e);
/* Marks the point in s; s == NULL: completes now (host). */
int fsdp_event_record(fsdp_event *e, fsdp_stream *s);
int fsdp_event_query(fsdp_event *e);       /* 1 done, 0 pending, <0 error */
int fsdp_event_synchronize(fsdp_event *e);
/* An event whose completion time can be read, for timelines (lua/fsdp/
 * profile.lua): on GPUs the stream's clock when it reached the record, on
 * CPUs the host's when the record completed. */
int fsdp_event_create_timed(int device, fsdp_event **out);
/* Seconds from a's last completed record to b's (negative when b came
 * first): both timed, completed, on one device. */
int fsdp_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds);

/* Copies and fills; s == NULL: synchronous. */
int fsdp_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s);
int fsdp_memset(void *dst, int value, size_t bytes, fsdp_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* FSDP_DEVICE_API_H */
