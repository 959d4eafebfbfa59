/* cuda_backend.c: the table libfsdp_cuda.so hands to the engine
 * (cuda_backend.h): its device functions (cuda.c) and the kernels the units
 * run between collectives (kernels/), with the kernels' CUDA error codes
 * turned into the engine's statuses. */
#include "../../kernels/kernels.h"
#include "../base/error.h"
#include "../fsdp_device.h"
#include "../fsdp_kernels.h"
#include "cuda_backend.h"
#include "cuda_impl.h"

static int kernel_status(int err, const char *what) {
  return err ? fsdp_fail(FSDP_EDEVICE, "unit: %s kernel failed (CUDA error %d)", what, err) : FSDP_OK;
}

static int cast_to_f32(float *dst, const void *src, fsdp_dtype dtype, size_t n, fsdp_stream *s) {
  return kernel_status(fsdp_kernel_cast_to_f32(dst, src, dtype, n, fsdp_cuda_stream_handle(s)), "cast");
}

static int accumulate_f32(float *dst, const void *src, fsdp_dtype dtype, size_t n, fsdp_stream *s) {
  return kernel_status(fsdp_kernel_accumulate_f32(dst, src, dtype, n, fsdp_cuda_stream_handle(s)), "accumulate");
}

static int cast_from_f32(void *dst, fsdp_dtype dtype, const float *src, size_t n, fsdp_stream *s) {
  return kernel_status(fsdp_kernel_cast_from_f32(dst, dtype, src, n, fsdp_cuda_stream_handle(s)), "cast");
}

static const fsdp_cuda_backend table = {
    .available = fsdp_cuda_available,
    .device_count = fsdp_cuda_device_count,
    .set_device = fsdp_cuda_set_device,
    .alloc = fsdp_cuda_alloc,
    .free = fsdp_cuda_free,
    .mem_info = fsdp_cuda_mem_info,
    .device_name = fsdp_cuda_device_name,
    .alloc_host_pinned = fsdp_cuda_alloc_host_pinned,
    .free_host_pinned = fsdp_cuda_free_host_pinned,
    .is_pinned_ptr = fsdp_cuda_is_pinned_ptr,
    .is_device_ptr = fsdp_cuda_is_device_ptr,
    .stream_create = fsdp_cuda_stream_create,
    .stream_destroy = fsdp_cuda_stream_destroy,
    .stream_synchronize = fsdp_cuda_stream_synchronize,
    .stream_wait_event = fsdp_cuda_stream_wait_event,
    .stream_delay = fsdp_cuda_stream_delay,
    .stream_handle = fsdp_cuda_stream_handle,
    .event_create = fsdp_cuda_event_create,
    .event_destroy = fsdp_cuda_event_destroy,
    .event_record = fsdp_cuda_event_record,
    .event_query = fsdp_cuda_event_query,
    .event_synchronize = fsdp_cuda_event_synchronize,
    .event_create_timed = fsdp_cuda_event_create_timed,
    .event_elapsed = fsdp_cuda_event_elapsed,
    .memcpy = fsdp_cuda_memcpy,
    .memset = fsdp_cuda_memset,
    .cast_to_f32 = cast_to_f32,
    .accumulate_f32 = accumulate_f32,
    .cast_from_f32 = cast_from_f32,
    .adamw_step = fsdp_cuda_adamw_step,
    .sgd_step = fsdp_cuda_sgd_step,
    .sum_squares = fsdp_cuda_sum_squares,
};

const fsdp_cuda_backend *fsdp_cuda_backend_table(void) { return &table; }
