/* fsdp_base.h: the base layer's API (src/base/): status codes and the
 * thread-local last error, dtypes and their conversions, logging, clocks,
 * stop signals, the counter-based RNG, CPU threads. Every other public
 * header builds on it. Part of the public API: included by fsdp.h, read by
 * ffi.lua, FFI-clean like it. */
#ifndef FSDP_BASE_API_H
#define FSDP_BASE_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------- */
enum {
  FSDP_OK = 0,
  FSDP_EINVAL = -1,      /* a bad argument from the caller */
  FSDP_ENOMEM = -2,      /* host or device allocation failed */
  FSDP_EIO = -3,         /* file or OS error */
  FSDP_ECOMM = -4,       /* a collective failed or ranks disagree */
  FSDP_ETIMEOUT = -5,    /* a bounded wait ran out */
  FSDP_EPEER = -6,       /* a peer rank died */
  FSDP_EUNSUPPORTED = -7,/* not built in, or no such device */
  FSDP_EDEVICE = -8,     /* the device runtime reported an error */
  FSDP_ESTATE = -9,      /* call out of order (e.g. before fsdp_init) */
  FSDP_ELAUNCH = -10,    /* the launcher (PMIx) failed */
  FSDP_ECORRUPT = -11,   /* a file's contents are malformed or damaged */
  FSDP_EBUSY = -12       /* held by another process (a directory's lock) */
};

/* ---- dtypes, devices, reductions ------------------------------------- */
/* int32: token ids and targets (not for reductions) */
typedef enum { FSDP_FP32 = 0, FSDP_BF16 = 1, FSDP_FP16 = 2, FSDP_FP64 = 3, FSDP_INT32 = 4 } fsdp_dtype;
typedef enum { FSDP_CPU = 0, FSDP_CUDA = 1 } fsdp_device;
typedef enum { FSDP_SUM = 0, FSDP_AVG = 1 } fsdp_redop;
typedef enum { FSDP_LOG_ERROR = 0, FSDP_LOG_WARN = 1, FSDP_LOG_INFO = 2, FSDP_LOG_DEBUG = 3 } fsdp_log_level;

/* ---- base ------------------------------------------------------------ */
const char *fsdp_version(void);
const char *fsdp_last_error(void);
const char *fsdp_status_name(int status);
void fsdp_clear_error(void);
double fsdp_time_now(void);                /* monotonic seconds */
/* The clock this core runs at, measured now (Hz; 0 where it cannot be):
 * the MFU's CPU peak where cpuinfo gives only the nominal clock
 * (src/base/core_clock.c). Takes about 10 ms. */
double fsdp_core_clock_hz(void);
/* The clock two timed chains agree on (register adds, 64-bit multiplies;
 * Hz), the faster of the two; 0 when they differ by more than 10% or one
 * reads above 7 GHz: then one of them is no clock on this core. */
double fsdp_core_clock_pick(double by_add, double by_mul);
/* The vector instructions this CPU and its OS run (1 or 0 each): AVX,
 * AVX2 with FMA, AVX-512 F/BW/DQ/VL; CPUID and XGETBV, never vendor or
 * model (src/base/cpu_features.c). All 0 off x86-64. */
void fsdp_cpu_vector_features(int *avx, int *avx2_fma, int *avx512);
/* fp32 FLOP/s of one core's fused multiply-adds on vectors of `bits` (512
 * or 256), timed now: the fastest of 7
 * runs of about 1 ms. 0 where the CPU or OS cannot run them
 * (src/base/fma_rate.c). */
double fsdp_core_fma_flops(int bits);
/* The stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1) recorded instead of
 * acted on while watched (on = 1; on = 0 restores the previous handlers);
 * a second one acts at once; on = 2 (the stop is saved, the process is
 * ending) ignores them. fsdp_stop_signal: the first one received since
 * watching began, 0 if none (src/base/stop_signal.c). */
int fsdp_stop_signals_watch(int on);
int fsdp_stop_signal(void);
const char *fsdp_signal_name(int sig);     /* "SIGTERM", ...; "a signal" for others */
/* Tells fsdprun this rank is alive and at `step` (< 0: the step is not
 * known); a no-op when fsdprun does not watch (src/base/heartbeat.h). */
int fsdp_heartbeat(int64_t step);
void fsdp_log_set_level(int level);
int fsdp_log_get_level(void);

size_t fsdp_dtype_size(fsdp_dtype dtype);         /* 0 for an unknown dtype */
const char *fsdp_dtype_name(fsdp_dtype dtype);    /* "?" for an unknown dtype */
int fsdp_dtype_from_name(const char *name); /* dtype, or FSDP_EINVAL */
float fsdp_bf16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_bf16(float f);        /* round to nearest even; NaN kept */
float fsdp_fp16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_fp16(float f);
/* Element-wise conversion between any two dtypes (CPU memory). */
int fsdp_convert(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype, size_t n);
/* dst[i] += src[i], any two dtypes, one rounding to dst's dtype (CPU memory). */
int fsdp_accumulate(void *dst, fsdp_dtype dst_dtype, const void *src, fsdp_dtype src_dtype, size_t n);
/* The index of the first NaN or infinity among x[0, n) (CPU memory), or -1:
 * one vectorised pass (src/base/scan.c). */
int64_t fsdp_find_nonfinite(const float *x, int64_t n);

/* ---- counter-based RNG (Philox-4x32-10) ------------------------------ */
typedef enum { FSDP_RNG_UNIFORM = 0, FSDP_RNG_NORMAL = 1 } fsdp_rng_dist;
void fsdp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
/* A stream id for a name (FNV-1a), e.g. a parameter's. */
uint32_t fsdp_rng_stream_id(const char *name);
/* dst[i] = draw(seed, stream, first_index + i) for i < n (CPU memory);
 * uniform on (a, b), or normal with mean a and std b. See philox.c. */
int fsdp_rng_fill(void *dst, fsdp_dtype dtype, int64_t n, uint64_t seed, uint32_t stream, int64_t first_index, int dist,
                  double a, double b);

/* ---- positive results: neither FSDP_OK nor an error ------------------- */
/* What a call returns when it did its job but the answer is "not now" or
 * "not there"; no message is set. Distinct values, so that code which
 * forwards them cannot mistake one for the other. */
typedef enum {
  FSDP_DEFERRED = 1, /* the work was not started: a pool at its bound, an offloaded step
                        still running (fsdp_unit_unshard, fsdp_unit_prefetch) */
  FSDP_ABSENT = 2    /* what was looked for is not there (fsdp_fs_stat,
                        fsdp_safetensors_find, fsdp_ckpt_meta_*) */
} fsdp_result;

/* ---- CPU threads for elementwise host loops (src/base/parallel.c) ----- */
/* CPU threads the optimizer steps (and other elementwise host loops) use:
 * FSDP_CPU_THREADS, else the rank's cores (fsdp_rank_cores). */
int fsdp_cpu_threads(void);
int fsdp_cpu_threads_set(int n);
/* The CPU cores this rank may use, and whether they are its own: where the
 * launcher bound the rank to part of what the launcher itself was given
 * (mpirun binds each rank to a core by default, srun --cpu-bind), every
 * core of its affinity, *bound = 1; else (fsdprun, a container's cpuset
 * shared by all ranks) its affinity's cores divided among the machine's
 * ranks (fsdp_init says how many), *bound = 0. At least 1. */
int fsdp_rank_cores(int *bound);

/* ---- the optimizer's hyperparameters ----------------------------------
 * Here because every layer that runs a step reads them: the CPU step
 * (src/shard/adamw.c), the CUDA kernel (kernels/adamw.cu) and the CUDA
 * backend's table (src/device/cuda_backend.h); the element formula is
 * src/base/adamw_math.h. */
typedef struct fsdp_adamw_config {
  float lr, beta1, beta2, eps, weight_decay;
} fsdp_adamw_config;

#ifdef __cplusplus
}
#endif
#endif /* FSDP_BASE_API_H */
