// linear.cu: the CUDA twin of linear.c: GEMMs through cuBLASLt, fp32 or
// bf16 inputs with fp32 accumulation; the forward's bias rides in the
// GEMM's epilogue (no extra pass), dW accumulates through beta = 1.
// Row-major [n, in] is column-major [in, n], so each product is written
// with the roles cuBLAS's column-major view needs (see each call).
#include <cublasLt.h>
#include <pthread.h>

#include "common.cuh"

using namespace fsdpk;

enum { WORKSPACE = 32 << 20 };

// one handle and workspace per device, made on first use
struct lt_state {
  cublasLtHandle_t h;
  void *ws;
};
static lt_state g_lt[64];
static pthread_mutex_t g_lt_lock = PTHREAD_MUTEX_INITIALIZER;

// The heuristic's choice per GEMM shape and device: asking cuBLASLt costs
// tens of microseconds of host time, and a training step repeats a few
// dozen shapes hundreds of times. A full table just asks again.
struct algo_key {
  int dev, ta, tb, bias, accumulate;
  uint32_t align_a, align_b, align_c;
  int32_t dtype;
  int64_t m, n, k, lda, ldb, ldc;
};
struct algo_entry {
  algo_key key;
  cublasLtMatmulAlgo_t algo;
  bool used;
};
enum { ALGO_CACHE = 256 };
static algo_entry g_algos[ALGO_CACHE];
static pthread_mutex_t g_algo_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_key(const algo_key &a, const algo_key &b) {
  return a.dev == b.dev && a.ta == b.ta && a.tb == b.tb && a.bias == b.bias && a.accumulate == b.accumulate &&
         a.align_a == b.align_a && a.align_b == b.align_b && a.align_c == b.align_c && a.dtype == b.dtype && a.m == b.m && a.n == b.n && a.k == b.k && a.lda == b.lda && a.ldb == b.ldb && a.ldc == b.ldc;
}

static size_t key_slot(const algo_key &k) {
  uint64_t h = 1469598103934665603ull;
  const int64_t v[] = {k.dev, k.ta, k.tb, k.bias, k.accumulate, k.align_a, k.align_b, k.align_c,
                       k.dtype, k.m, k.n, k.k, k.lda, k.ldb, k.ldc};
  for (int64_t x : v) h = (h ^ (uint64_t)x) * 1099511628211ull;
  return (size_t)(h % ALGO_CACHE);
}

// A pointer's alignment in bytes, up to 256. cuBLASLt's heuristic assumes
// 256-byte-aligned matrices unless told otherwise, and a parameter's view
// inside a unit's flat buffer is only 16 elements aligned.
static uint32_t alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 1;
  while (al < 256 && (a & al) == 0) al <<= 1;
  return al;
}

static bool algo_find(const algo_key &k, cublasLtMatmulAlgo_t *out) {
  pthread_mutex_lock(&g_algo_lock);
  bool hit = false;
  for (size_t i = key_slot(k), probes = 0; probes < ALGO_CACHE && g_algos[i].used; i = (i + 1) % ALGO_CACHE, probes++)
    if (same_key(g_algos[i].key, k)) {
      *out = g_algos[i].algo;
      hit = true;
      break;
    }
  pthread_mutex_unlock(&g_algo_lock);
  return hit;
}

static void algo_store(const algo_key &k, const cublasLtMatmulAlgo_t &algo) {
  pthread_mutex_lock(&g_algo_lock);
  for (size_t i = key_slot(k), probes = 0; probes < ALGO_CACHE; i = (i + 1) % ALGO_CACHE, probes++) {
    if (g_algos[i].used && !same_key(g_algos[i].key, k)) continue;
    g_algos[i] = algo_entry{k, algo, true};
    break;
  }
  pthread_mutex_unlock(&g_algo_lock);
}

static int lt_get(lt_state **out) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return fsdp_fail(FSDP_EDEVICE, "cuda linear: no current device");
  pthread_mutex_lock(&g_lt_lock);
  int rc = FSDP_OK;
  if (!g_lt[dev].h) {
    if (cublasLtCreate(&g_lt[dev].h) != CUBLAS_STATUS_SUCCESS) rc = fsdp_fail(FSDP_EDEVICE, "cuda linear: cublasLtCreate failed");
    else if (cudaMalloc(&g_lt[dev].ws, WORKSPACE) != cudaSuccess)
      rc = fsdp_fail(FSDP_ENOMEM, "cuda linear: the %d MiB cuBLASLt workspace", WORKSPACE >> 20);
  }
  pthread_mutex_unlock(&g_lt_lock);
  *out = &g_lt[dev];
  return rc;
}

// C[m, n] (column-major, ldc) = op(A) op(B) + beta C (+ bias[m] per column)
static int lt_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
                     int64_t ldb, void *C, int64_t ldc, float beta, const void *bias, int32_t dtype, cudaStream_t st_,
                     const char *what) {
  lt_state *lt = nullptr;
  FSDP_CHECK(lt_get(&lt));
  algo_key key{(int)(lt - g_lt), ta, tb, bias != nullptr, beta != 0.0f, alignment(A), alignment(B), alignment(C),
               dtype, m, n, k, lda, ldb, ldc};
  cudaDataType_t dt = dtype == FSDP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t e = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  if (e == CUBLAS_STATUS_SUCCESS && bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    e = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dt, sizeof dt);
  }
  if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatrixLayoutCreate(&la, dt, ta ? k : m, ta ? m : k, lda);
  if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatrixLayoutCreate(&lb, dt, tb ? n : k, tb ? k : n, ldb);
  if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatrixLayoutCreate(&lc, dt, m, n, ldc);
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  if (e == CUBLAS_STATUS_SUCCESS && algo_find(key, &heur.algo)) {
    found = 1;
  } else if (e == CUBLAS_STATUS_SUCCESS) { // ask, for this workspace and these alignments
    e = cublasLtMatmulPreferenceCreate(&pref);
    size_t wsb = WORKSPACE;
    if (e == CUBLAS_STATUS_SUCCESS)
      e = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    const struct {
      cublasLtMatmulPreferenceAttributes_t attr;
      uint32_t bytes;
    } aligns[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
                  {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
    for (const auto &al : aligns)
      if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulPreferenceSetAttribute(pref, al.attr, &al.bytes, sizeof al.bytes);
    if (e == CUBLAS_STATUS_SUCCESS) e = cublasLtMatmulAlgoGetHeuristic(lt->h, op, la, lb, lc, lc, pref, 1, &heur, &found);
    if (e == CUBLAS_STATUS_SUCCESS && found > 0) algo_store(key, heur.algo);
  }
  float alpha = 1.0f;
  if (e == CUBLAS_STATUS_SUCCESS && found > 0)
    e = cublasLtMatmul(lt->h, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &heur.algo, lt->ws, WORKSPACE, st_);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  if (e != CUBLAS_STATUS_SUCCESS)
    return fsdp_fail(FSDP_EDEVICE, "%s: cuBLASLt: %s (m %lld, n %lld, k %lld)", what, cublasLtGetStatusString(e), (long long)m,
                     (long long)n, (long long)k);
  if (found == 0)
    return fsdp_fail(FSDP_EDEVICE, "%s: cuBLASLt has no algorithm for m %lld, n %lld, k %lld", what, (long long)m, (long long)n,
                     (long long)k);
  return FSDP_OK;
}

template <typename T>
__global__ void column_sums(T *db, const T *dy, int64_t n, int64_t out) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= out) return;
  float acc = 0;
  for (int64_t i = 0; i < n; i++) acc += ld(dy, i * out + j);
  st(db, j, ld(db, j) + acc);
}

static int args_ok(int64_t n, int64_t in, int64_t out, int32_t dtype, const char *what) {
  if (n < 0 || in < 1 || out < 1)
    return fsdp_fail(FSDP_EINVAL, "%s: n = %lld, in = %lld, out = %lld", what, (long long)n, (long long)in, (long long)out);
  return check_dtype(dtype, what);
}

extern "C" int fsdp_cuda_linear_forward(void *y, const void *x, const void *w, const void *b, int64_t n, int64_t in,
                                        int64_t out, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, in, out, dtype, "cuda linear forward"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda linear forward", y, x, w); /* b: optional */
  // y^T [out, n] = W^T... : A = W (col-major [in, out], transposed), B = x^T ([in, n])
  return lt_matmul(true, false, out, n, in, w, in, x, in, y, out, 0.0f, b, dtype, stream_of(s), "cuda linear forward");
}

extern "C" int fsdp_cuda_linear_backward(void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int64_t n,
                                         int64_t in, int64_t out, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, in, out, dtype, "cuda linear backward"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda linear backward", dy); /* dx, dw, db: each optional */
  if (dx) FSDP_NEED_PTRS("cuda linear backward (dx)", w);
  if (dw) FSDP_NEED_PTRS("cuda linear backward (dw)", x);
  cudaStream_t st_ = stream_of(s);
  // dx^T [in, n] = W (col-major [in, out]) dy^T ([out, n])
  if (dx) FSDP_CHECK(lt_matmul(false, false, in, n, out, w, in, dy, out, dx, in, 0.0f, nullptr, dtype, st_, "cuda linear dx"));
  // dW^T [in, out] += x^T ([in, n]) dy ([out, n] transposed)
  if (dw) FSDP_CHECK(lt_matmul(false, true, in, out, n, x, in, dy, out, dw, in, 1.0f, nullptr, dtype, st_, "cuda linear dW"));
  if (db) {
    FSDP_DISPATCH(dtype, T, column_sums<T><<<(unsigned)((out + 255) / 256), 256, 0, st_>>>((T *)db, (const T *)dy, n, out));
    return launched("cuda linear db");
  }
  return FSDP_OK;
}
