/* fsdprun_pmix.c: the PMIx server side of the launcher: one namespace, all
 * ranks local. See ../shared/notes/PMIX.md for the library's quirks this
 * code works around (blocking registration codes, malloc'ed env arrays,
 * NULL callbacks, the hash data store). */
#include <pmix.h>
#include <pmix_server.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsdprun.h"

static job *the_job;
static pthread_mutex_t abort_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int pending, taken, rank, status;
  char msg[512];
} aborted;

static int ok(pmix_status_t rc) { return rc == PMIX_SUCCESS || rc == PMIX_OPERATION_SUCCEEDED; }

static pmix_status_t on_connected(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cb, void *cbdata) {
  if (cb) cb(PMIX_SUCCESS, cbdata); /* 4.2.2 passes NULL here */
  return PMIX_SUCCESS;
}

static pmix_status_t on_finalized(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cb, void *cbdata) {
  if (cb) cb(PMIX_SUCCESS, cbdata);
  return PMIX_SUCCESS;
}

/* Runs on the library's thread: record, wake the main loop, never block. */
static pmix_status_t on_abort(const pmix_proc_t *proc, void *obj, int status, const char msg[], pmix_proc_t procs[],
                              size_t nprocs, pmix_op_cbfunc_t cb, void *cbdata) {
  pthread_mutex_lock(&abort_mu);
  if (!aborted.pending && !aborted.taken) {
    aborted.pending = 1;
    aborted.rank = (int)proc->rank;
    aborted.status = status;
    snprintf(aborted.msg, sizeof aborted.msg, "%s", msg ? msg : "");
  }
  pthread_mutex_unlock(&abort_mu);
  if (the_job) fsdprun_wake(the_job);
  if (cb) cb(PMIX_SUCCESS, cbdata);
  return PMIX_SUCCESS;
}

int pmix_take_abort(int *rank, int *status, char *msg, size_t cap) {
  pthread_mutex_lock(&abort_mu);
  int got = aborted.pending;
  if (got) {
    aborted.pending = 0;
    aborted.taken = 1;
    *rank = aborted.rank;
    *status = aborted.status;
    snprintf(msg, cap, "%s", aborted.msg);
  }
  pthread_mutex_unlock(&abort_mu);
  return got;
}

/* With every rank local the library completes fences itself; a multi-node
 * host would exchange `data` with its peers. The data is the library's, so
 * hand back a copy it can release. */
static void release_copy(void *cbdata) { free(cbdata); }

static pmix_status_t on_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                              char *data, size_t ndata, pmix_modex_cbfunc_t cb, void *cbdata) {
  char *copy = malloc(ndata ? ndata : 1);
  if (!copy) return PMIX_ERR_NOMEM;
  if (ndata) memcpy(copy, data, ndata);
  cb(PMIX_SUCCESS, copy, ndata, cbdata, release_copy, copy);
  return PMIX_SUCCESS;
}

static pmix_server_module_t module = {
    .client_connected = on_connected, .client_finalized = on_finalized, .abort = on_abort, .fence_nb = on_fence};

int pmix_server_start(job *j) {
  the_job = j;
  setenv("PMIX_MCA_gds", "hash", 1); /* in-process store: no files, no shared locks */
  pmix_info_t info[2];
  PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, j->tmpdir, PMIX_STRING);
  PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, j->tmpdir, PMIX_STRING);
  pmix_status_t rc = PMIx_server_init(&module, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  if (rc != PMIX_SUCCESS) {
    fprintf(stderr, "fsdprun: cannot start the PMIx server: %s\n", PMIx_Error_string(rc));
    return -1;
  }
  return 0;
}

int pmix_job_register(job *j) {
  char host[256] = "localhost", *node_map = NULL, *proc_map = NULL;
  gethostname(host, sizeof host - 1);
  size_t plen = (size_t)j->n * 12 + 1;
  char *peers = calloc(1, plen);
  if (!peers) return -1;
  for (int r = 0, at = 0; r < j->n; r++) at += snprintf(peers + at, plen - (size_t)at, r ? ",%d" : "%d", r);
  if (!ok(PMIx_generate_regex(host, &node_map)) || !ok(PMIx_generate_ppn(peers, &proc_map))) {
    fprintf(stderr, "fsdprun: PMIx could not encode the node and process maps\n");
    free(peers);
    return -1;
  }
  uint32_t n = (uint32_t)j->n, one = 1, zero32 = 0;
  pmix_rank_t leader = 0;
  size_t ninfo = 10 + (size_t)j->n, k = 0;
  pmix_info_t *info = calloc(ninfo, sizeof *info);
  PMIX_INFO_LOAD(&info[k++], PMIX_UNIV_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOB_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_NUM_NODES, &one, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCALLDR, &leader, PMIX_PROC_RANK);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODE_MAP, node_map, PMIX_REGEX);
  PMIX_INFO_LOAD(&info[k++], PMIX_PROC_MAP, proc_map, PMIX_REGEX);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOBID, j->nspace, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODEID, &zero32, PMIX_UINT32);
  for (int r = 0; r < j->n; r++) {
    /* per-rank data: an info array whose first element is PMIX_RANK */
    pmix_data_array_t *arr;
    PMIX_DATA_ARRAY_CREATE(arr, 5, PMIX_INFO);
    pmix_info_t *pi = arr->array;
    pmix_rank_t rank = (pmix_rank_t)r;
    uint16_t lr = (uint16_t)r;
    PMIX_INFO_LOAD(&pi[0], PMIX_RANK, &rank, PMIX_PROC_RANK);
    PMIX_INFO_LOAD(&pi[1], PMIX_LOCAL_RANK, &lr, PMIX_UINT16);
    PMIX_INFO_LOAD(&pi[2], PMIX_NODE_RANK, &lr, PMIX_UINT16);
    PMIX_INFO_LOAD(&pi[3], PMIX_GLOBAL_RANK, &rank, PMIX_PROC_RANK);
    PMIX_INFO_LOAD(&pi[4], PMIX_HOSTNAME, host, PMIX_STRING);
    PMIX_INFO_LOAD(&info[k], PMIX_PROC_DATA, arr, PMIX_DATA_ARRAY);
    PMIX_DATA_ARRAY_FREE(arr); /* INFO_LOAD copied it */
    k++;
  }
  pmix_status_t rc = PMIx_server_register_nspace(j->nspace, j->n, info, k, NULL, NULL);
  PMIX_INFO_FREE(info, ninfo);
  free(node_map);
  free(proc_map);
  free(peers);
  if (!ok(rc)) {
    fprintf(stderr, "fsdprun: PMIx refused the job's namespace: %s\n", PMIx_Error_string(rc));
    return -1;
  }
  for (int r = 0; r < j->n; r++) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, j->nspace, (pmix_rank_t)r);
    rc = PMIx_server_register_client(&p, getuid(), getgid(), NULL, NULL, NULL);
    if (!ok(rc)) {
      fprintf(stderr, "fsdprun: PMIx refused rank %d: %s\n", r, PMIx_Error_string(rc));
      return -1;
    }
  }
  return 0;
}

int pmix_rank_env(job *j, int rank, char ***env) {
  *env = calloc(1, sizeof(char *)); /* the library reallocs it */
  if (!*env) return -1;
  pmix_proc_t p;
  PMIX_LOAD_PROCID(&p, j->nspace, (pmix_rank_t)rank);
  pmix_status_t rc = PMIx_server_setup_fork(&p, env);
  if (rc != PMIX_SUCCESS) {
    fprintf(stderr, "fsdprun: PMIx could not prepare rank %d: %s\n", rank, PMIx_Error_string(rc));
    return -1;
  }
  return 0;
}

/* Only after a clean run: after a failure the library's teardown can hang. */
void pmix_server_stop(job *j) {
  for (int r = 0; r < j->n; r++) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, j->nspace, (pmix_rank_t)r);
    PMIx_server_deregister_client(&p, NULL, NULL);
  }
  PMIx_server_deregister_nspace(j->nspace, NULL, NULL);
  PMIx_server_finalize();
}
