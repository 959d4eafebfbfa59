/* cuda_loader.c: opens libfsdp_cuda.so the first time the CUDA backend is
 * asked for (cuda_backend.h says why it is a library of its own).
 *
 * Where: FSDP_CUDA_LIB when set, else libfsdp_cuda.so in the folder of the
 * libfsdp.so this code is in, else the loader's search path. When it cannot
 * be opened (a build without CUDA, a CUDA library missing on this machine)
 * the table below answers instead: no device, and every call fails with the
 * reason, so `train.device = "cuda"` on such a machine says what is missing.
 * Thread-safe: the first caller opens it, the others wait. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/log.h"
#include "../fsdp_device.h"
#include "cuda_backend.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const fsdp_cuda_backend *table;
static int opened, local_rank = -1;
static char reason[1024], loaded_path[1024];

#define NO_CUDA() fsdp_fail(FSDP_EUNSUPPORTED, "no CUDA backend: %s", reason)

static void *lib; /* the dlopen handle */

static int none_available(void) {
  NO_CUDA();
  return 0;
}
static int none_count(void) { return 0; }
static int none_int(int i) { return NO_CUDA(); }
static int none_alloc(size_t bytes, void **out) { return NO_CUDA(); }
static int none_ptr(void *p) { return NO_CUDA(); }
static int none_is(const void *p) { return 0; }
static int none_mem(int64_t *free_bytes, int64_t *total) { return NO_CUDA(); }
static int none_name(char *buf, size_t size) { return NO_CUDA(); }
static int none_stream_out(fsdp_stream **out) { return NO_CUDA(); }
static int none_stream(fsdp_stream *s) { return NO_CUDA(); }
static int none_wait(fsdp_stream *s, fsdp_event *e) { return NO_CUDA(); }
static int none_delay(fsdp_stream *s, int64_t us) { return NO_CUDA(); }
static void *none_handle(fsdp_stream *s) { return NULL; }
static int none_event_out(fsdp_event **out) { return NO_CUDA(); }
static int none_event(fsdp_event *e) { return NO_CUDA(); }
static int none_record(fsdp_event *e, fsdp_stream *s) { return NO_CUDA(); }
static int none_elapsed(fsdp_event *a, fsdp_event *b, double *seconds) { return NO_CUDA(); }
static int none_copy(void *d, const void *s, size_t n, fsdp_stream *st) { return NO_CUDA(); }
static int none_set(void *d, int v, size_t n, fsdp_stream *st) { return NO_CUDA(); }
static int none_to_f32(float *d, const void *s, fsdp_dtype dt, size_t n, fsdp_stream *st) { return NO_CUDA(); }
static int none_from_f32(void *d, fsdp_dtype dt, const float *s, size_t n, fsdp_stream *st) { return NO_CUDA(); }
static int none_adamw(float *p, void *o, fsdp_dtype od, uint16_t *lo, const void *g, fsdp_dtype gd, float *m, float *v,
                      int64_t n, int64_t step, const fsdp_adamw_config *c, float gs, fsdp_stream *s) {
  return NO_CUDA();
}
static int none_sgd(float *p, void *o, fsdp_dtype od, uint16_t *lo, const void *g, fsdp_dtype gd, float *m, int64_t n,
                    int64_t step, float lr, float mu, float wd, float gs, fsdp_stream *s) {
  return NO_CUDA();
}
static int none_sumsq(const void *x, fsdp_dtype d, int64_t n, double *sum, int64_t *bad, fsdp_stream *s) { return NO_CUDA(); }

static const fsdp_cuda_backend none = {
    .available = none_available,
    .device_count = none_count,
    .set_device = none_int,
    .alloc = none_alloc,
    .free = none_ptr,
    .mem_info = none_mem,
    .device_name = none_name,
    .alloc_host_pinned = none_alloc,
    .free_host_pinned = none_ptr,
    .is_pinned_ptr = none_is,
    .is_device_ptr = none_is,
    .stream_create = none_stream_out,
    .stream_destroy = none_stream,
    .stream_synchronize = none_stream,
    .stream_wait_event = none_wait,
    .stream_delay = none_delay,
    .stream_handle = none_handle,
    .event_create = none_event_out,
    .event_destroy = none_event,
    .event_record = none_record,
    .event_query = none_event,
    .event_synchronize = none_event,
    .event_create_timed = none_event_out,
    .event_elapsed = none_elapsed,
    .memcpy = none_copy,
    .memset = none_set,
    .cast_to_f32 = none_to_f32,
    .accumulate_f32 = none_to_f32,
    .cast_from_f32 = none_from_f32,
    .adamw_step = none_adamw,
    .sgd_step = none_sgd,
    .sum_squares = none_sumsq,
};

#ifdef FSDP_HAVE_CUDA
/* libfsdp_cuda.so beside this library, when it is there */
static void beside_this_library(char *out, size_t cap) {
  Dl_info info;
  out[0] = 0;
  if (!dladdr((void *)&fsdp_cuda, &info) || !info.dli_fname) return;
  const char *slash = strrchr(info.dli_fname, '/');
  if (slash) snprintf(out, cap, "%.*s/libfsdp_cuda.so", (int)(slash - info.dli_fname), info.dli_fname);
}
#endif

static void open_backend(void) {
  table = &none;
#ifndef FSDP_HAVE_CUDA
  snprintf(reason, sizeof reason, "this fsdp was built without CUDA (configure with FSDP_CUDA=ON)");
  return;
#else
  char path[1024];
  const char *env = getenv("FSDP_CUDA_LIB");
  if (env && *env) snprintf(path, sizeof path, "%s", env);
  else beside_this_library(path, sizeof path);
  /* RTLD_GLOBAL: the FFI and tests look up its public fsdp_cuda_* ops by name */
  void *h = path[0] ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
  if (!h && !(env && *env)) {
    snprintf(path, sizeof path, "libfsdp_cuda.so");
    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  }
  if (!h) {
    const char *e = dlerror();
    snprintf(reason, sizeof reason, "cannot open the CUDA backend %s: %s", path, e ? e : "unknown error");
    return;
  }
  const fsdp_cuda_backend *(*get)(void) = (const fsdp_cuda_backend *(*)(void))dlsym(h, "fsdp_cuda_backend_table");
  if (!get) {
    snprintf(reason, sizeof reason, "%s has no fsdp_cuda_backend_table: not an fsdp CUDA backend", path);
    return;
  }
  table = get();
  lib = h;
  snprintf(loaded_path, sizeof loaded_path, "%s", path);
  opened = 1;
  /* one GPU per local rank, the usual mapping; CPU-only hosts skip this */
  int n = table->available() ? table->device_count() : 0;
  fsdp_clear_error();
  if (n > 0 && local_rank >= 0 && table->set_device(local_rank % n) < 0) {
    fsdp_log(FSDP_LOG_WARN, "cannot select GPU %d: %s", local_rank % n, fsdp_last_error());
    fsdp_clear_error();
  }
#endif
}

const fsdp_cuda_backend *fsdp_cuda(void) {
  pthread_once(&once, open_backend);
  return table;
}

int fsdp_cuda_loaded(void) {
  const fsdp_cuda_backend *t = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
  return t && opened;
}

void fsdp_cuda_note_local_rank(int rank) {
  local_rank = rank;
  /* CUDA was used before fsdp_init (a script's fsdp.tensor(..., "cuda") first):
   * the backend opened without a local rank and stayed on GPU 0, which NCCL
   * then refuses as a duplicate on every rank but one. Said, not changed:
   * buffers may already live on GPU 0 */
  if (!opened) return;
  int n = table->available() ? table->device_count() : 0;
  fsdp_clear_error(); /* (a CPU-only host's probe sets one) */
  if (n > 0 && rank >= 0 && rank % n != 0)
    fsdp_log(FSDP_LOG_WARN, "CUDA was used before fsdp.init(): local rank %d stays on GPU 0, not GPU %d (call fsdp.init() "
             "before any CUDA work)", rank, rank % n);
}

void *fsdp_cuda_symbol(const char *name) {
  fsdp_cuda();
  if (!opened) {
    NO_CUDA();
    return NULL;
  }
  void *f = dlsym(lib, name);
  if (!f) fsdp_fail(FSDP_EUNSUPPORTED, "the CUDA backend %s has no %s", loaded_path, name);
  return f;
}

const char *fsdp_cuda_library(void) {
  fsdp_cuda();
  if (opened) return loaded_path;
  fsdp_fail(FSDP_EUNSUPPORTED, "no CUDA backend: %s", reason);
  return NULL;
}
