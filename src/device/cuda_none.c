/* cuda_none.c: the CUDA backend's entry points in a build without CUDA.
 * Each says so instead of failing obscurely; fsdp_cuda_available() is 0. */
#include "../base/error.h"
#include "device_impl.h"
#include "../dist/comm_impl.h"

#define NO_CUDA() fsdp_fail(FSDP_EUNSUPPORTED, "this fsdp was built without CUDA (configure with FSDP_CUDA=ON)")

int fsdp_cuda_available(void) { NO_CUDA(); return 0; }
int fsdp_cuda_device_count(void) { return 0; }
int fsdp_cuda_set_device(int index) { return NO_CUDA(); }
int fsdp_cuda_alloc(size_t bytes, void **out) { return NO_CUDA(); }
int fsdp_cuda_free(void *ptr) { return NO_CUDA(); }
int fsdp_cuda_alloc_host_pinned(size_t bytes, void **out) { return NO_CUDA(); }
int fsdp_cuda_free_host_pinned(void *ptr) { return NO_CUDA(); }
int fsdp_cuda_stream_create(fsdp_stream **out) { return NO_CUDA(); }
int fsdp_cuda_stream_destroy(fsdp_stream *s) { return NO_CUDA(); }
int fsdp_cuda_stream_synchronize(fsdp_stream *s) { return NO_CUDA(); }
int fsdp_cuda_stream_wait_event(fsdp_stream *s, fsdp_event *e) { return NO_CUDA(); }
int fsdp_cuda_stream_delay(fsdp_stream *s, int64_t microseconds) { return NO_CUDA(); }
void *fsdp_cuda_stream_handle(fsdp_stream *s) { return NULL; }
int fsdp_cuda_event_create(fsdp_event **out) { return NO_CUDA(); }
int fsdp_cuda_event_destroy(fsdp_event *e) { return NO_CUDA(); }
int fsdp_cuda_event_record(fsdp_event *e, fsdp_stream *s) { return NO_CUDA(); }
int fsdp_cuda_event_query(fsdp_event *e) { return NO_CUDA(); }
int fsdp_cuda_event_synchronize(fsdp_event *e) { return NO_CUDA(); }
int fsdp_cuda_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s) { return NO_CUDA(); }
int fsdp_cuda_memset(void *dst, int value, size_t bytes, fsdp_stream *s) { return NO_CUDA(); }
int fsdp_cuda_is_device_ptr(const void *ptr) { return 0; }
int fsdp_cuda_mem_info(int64_t *free_bytes, int64_t *total) { return NO_CUDA(); }
int fsdp_comm_nccl_create(const comm_group_spec *spec, fsdp_comm **out) { return NO_CUDA(); }
