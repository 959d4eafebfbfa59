/* cuda_backend.h: the CUDA backend as the rest of the engine sees it.
 *
 * Everything that needs the CUDA runtime, cuBLASLt, NCCL or cuDNN lives in
 * a second library, libfsdp_cuda.so (src/device/cuda.c, src/dist/
 * comm_nccl.c, kernels/), opened by cuda_loader.c the first time a CUDA
 * device is asked for. A CPU job never opens it, so its ranks do not map
 * ~150 MB of CUDA libraries. The engine reaches the backend only through
 * this table (one layer, one door): the device layer's dispatch and the few
 * kernels the units run between collectives. A layer above with its own
 * part in the library (the NCCL transport, src/dist/comm_nccl.c) looks it
 * up by name (fsdp_cuda_symbol), so this table names nothing above the
 * device layer. */
#ifndef FSDP_DEVICE_CUDA_BACKEND_H
#define FSDP_DEVICE_CUDA_BACKEND_H

#include "../fsdp_device.h"

typedef struct fsdp_cuda_backend {
  /* devices, memory, streams, events (src/device/cuda.c) */
  int (*available)(void); /* 1 when a GPU can be used; else 0 and the reason in the last error */
  int (*device_count)(void);
  int (*set_device)(int index);
  int (*alloc)(size_t bytes, void **out);
  int (*free)(void *ptr);
  int (*mem_info)(int64_t *free_bytes, int64_t *total);
  int (*device_name)(char *buf, size_t size); /* the current GPU's, NUL-terminated, cut to fit */
  int (*alloc_host_pinned)(size_t bytes, void **out);
  int (*free_host_pinned)(void *ptr);
  int (*is_pinned_ptr)(const void *ptr); /* 1: host memory from alloc_host_pinned */
  int (*is_device_ptr)(const void *ptr);
  int (*stream_create)(fsdp_stream **out);
  int (*stream_destroy)(fsdp_stream *s);
  int (*stream_synchronize)(fsdp_stream *s);
  int (*stream_wait_event)(fsdp_stream *s, fsdp_event *e);
  int (*stream_delay)(fsdp_stream *s, int64_t microseconds);
  void *(*stream_handle)(fsdp_stream *s); /* the cudaStream_t */
  int (*event_create)(fsdp_event **out);
  int (*event_destroy)(fsdp_event *e);
  int (*event_record)(fsdp_event *e, fsdp_stream *s);
  int (*event_query)(fsdp_event *e);
  int (*event_synchronize)(fsdp_event *e);
  int (*event_create_timed)(fsdp_event **out);
  int (*event_elapsed)(fsdp_event *a, fsdp_event *b, double *seconds);
  int (*memcpy)(void *dst, const void *src, size_t bytes, fsdp_stream *s); /* s NULL: synchronous */
  int (*memset)(void *dst, int value, size_t bytes, fsdp_stream *s);
  /* what the units run on their streams (kernels/): dst (fp32) = or +=
   * src (dtype), dst (dtype) = src (fp32), the optimizer steps, the grad
   * sum of squares; each returns FSDP_OK or a status with the message */
  int (*cast_to_f32)(float *dst, const void *src, fsdp_dtype dtype, size_t n, fsdp_stream *s);
  int (*accumulate_f32)(float *dst, const void *src, fsdp_dtype dtype, size_t n, fsdp_stream *s);
  int (*cast_from_f32)(void *dst, fsdp_dtype dtype, const float *src, size_t n, fsdp_stream *s);
  int (*adamw_step)(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                    fsdp_dtype grad_dtype, float *m, float *v, int64_t n, int64_t step, const fsdp_adamw_config *cfg, float grad_scale, fsdp_stream *s);
  int (*sgd_step)(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                  fsdp_dtype grad_dtype, float *momentum,
                  int64_t n, int64_t step, float lr, float mu, float weight_decay, float grad_scale, fsdp_stream *s);
  int (*sum_squares)(const void *x, fsdp_dtype dtype, int64_t n, double *sum, int64_t *nonfinite, fsdp_stream *s);
} fsdp_cuda_backend;

/* The backend, opened on first call. Never NULL: where it cannot be opened
 * (a build without CUDA, or libfsdp_cuda.so or a library it needs missing)
 * every entry fails with that reason and available() is 0. */
const fsdp_cuda_backend *fsdp_cuda(void);
/* 1 when the backend is open already (asking does not open it): without
 * it, no memory in this process is CUDA memory */
int fsdp_cuda_loaded(void);
/* A function of the backend by name (opening it if needed), NULL where
 * there is none (the reason in the last error). */
void *fsdp_cuda_symbol(const char *name);
/* The rank's index on its node (from fsdp_init): when the backend opens it
 * selects GPU local_rank % count, the usual one-GPU-per-rank mapping. */
void fsdp_cuda_note_local_rank(int local_rank);

/* In libfsdp_cuda.so: its table (src/device/cuda_backend.c). */
const fsdp_cuda_backend *fsdp_cuda_backend_table(void);

#endif
