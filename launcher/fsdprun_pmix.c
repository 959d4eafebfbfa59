/* fsdprun_pmix.c: the PMIx server side of the launcher: one namespace whose
 * ranks are all on this node. The library's quirks this file works around
 * (blocking calls returning PMIX_OPERATION_SUCCEEDED, NULL callbacks, the
 * malloc'ed environment array, the hash data store) are written up in the
 * project's PMIx notes; docs/LAUNCH.md has the user's view. */
#include <pmix.h>
#include <pmix_server.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fsdprun.h"

static job *the_job;

/* Written on the library's thread, read on the main one. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int pending, taken, rank, status;
  double at; /* when it came: compared with the ranks' ends */
  char msg[FSDPRUN_ABORT_MSG];
} aborted;

static int ok(pmix_status_t rc) { return rc == PMIX_SUCCESS || rc == PMIX_OPERATION_SUCCEEDED; }

/* ---- module callbacks: they run on the library's progress thread, so they
 * only record, wake the main loop and return; never block. ---- */

/* rank proc of this job, or NULL */
static rank_proc *rank_of(const pmix_proc_t *proc) {
  if (!the_job || !proc || strncmp(proc->nspace, the_job->nspace, PMIX_MAX_NSLEN) || proc->rank >= (pmix_rank_t)the_job->n)
    return NULL;
  return &the_job->ranks[proc->rank];
}

static pmix_status_t on_connected(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)obj;
  rank_proc *rp = rank_of(proc);
  if (rp) {
    atomic_store(&rp->joined, 1);
    fsdprun_wake(the_job); /* a rank that ended without joining may now leave this one waiting */
  }
  if (cb) cb(PMIX_SUCCESS, cbdata); /* 4.2.2 passes a NULL callback here */
  return PMIX_SUCCESS;
}

static pmix_status_t on_finalized(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)obj;
  rank_proc *rp = rank_of(proc);
  if (rp) atomic_store(&rp->finalized, 1);
  if (cb) cb(PMIX_SUCCESS, cbdata);
  return PMIX_SUCCESS;
}

/* The whole job ends, whichever procs the caller named. */
static pmix_status_t on_abort(const pmix_proc_t *proc, void *obj, int status, const char msg[], pmix_proc_t procs[],
                              size_t nprocs, pmix_op_cbfunc_t cb, void *cbdata) {
  (void)obj, (void)procs, (void)nprocs;
  /* a peer whose death made this rank abort has ended before now: its end
   * is stamped first, however late the watcher thread would be */
  if (the_job) procs_stamp_ended(the_job);
  pthread_mutex_lock(&mu);
  if (!aborted.pending && !aborted.taken) {
    aborted.pending = 1;
    aborted.rank = (int)proc->rank;
    aborted.status = status;
    aborted.at = fsdprun_now();
    snprintf(aborted.msg, sizeof aborted.msg, "%s", msg ? msg : "");
  }
  pthread_mutex_unlock(&mu);
  if (the_job) fsdprun_wake(the_job);
  if (cb) cb(PMIX_SUCCESS, cbdata);
  return PMIX_SUCCESS;
}

/* With every rank local the library completes fences itself and never calls
 * this; a host spanning nodes would exchange `data` with the other servers.
 * Here this node's contribution is the whole answer. The data belongs to
 * the library, so it gets back a copy and a way to release it. */
static void release_copy(void *cbdata) { free(cbdata); }

static pmix_status_t on_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                              char *data, size_t ndata, pmix_modex_cbfunc_t cb, void *cbdata) {
  (void)procs, (void)nprocs, (void)info, (void)ninfo;
  char *copy = malloc(ndata ? ndata : 1);
  if (!copy) return PMIX_ERR_NOMEM;
  if (ndata) memcpy(copy, data, ndata);
  cb(PMIX_SUCCESS, copy, ndata, cbdata, release_copy, copy);
  return PMIX_SUCCESS;
}

static pmix_server_module_t module = {
    .client_connected = on_connected,
    .client_finalized = on_finalized,
    .abort = on_abort,
    .fence_nb = on_fence,
};

int pmix_take_abort(int *rank, int *status, char *msg, size_t cap, double *at) {
  pthread_mutex_lock(&mu);
  int got = aborted.pending;
  if (got) {
    aborted.pending = 0;
    aborted.taken = 1;
    *rank = aborted.rank;
    *status = aborted.status;
    *at = aborted.at;
    snprintf(msg, cap, "%s", aborted.msg);
  }
  pthread_mutex_unlock(&mu);
  return got;
}

int pmix_all_finalized(void) {
  if (!the_job) return 0;
  for (int r = 0; r < the_job->n; r++)
    if (!atomic_load(&the_job->ranks[r].finalized)) return 0;
  return 1;
}

/* ---- server life ---- */

int pmix_start(job *j) {
  the_job = j;
  /* The default store keeps job data in files guarded by process-shared
   * locks: a rank killed while holding one deadlocks the server and leaves
   * files behind. The in-process hash store has neither problem. */
  setenv("PMIX_MCA_gds", "hash", 1);
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

/* Per-rank data: an info array whose first element must be PMIX_RANK. */
static void load_proc_data(pmix_info_t *dst, int r, const char *host) {
  pmix_data_array_t *arr;
  PMIX_DATA_ARRAY_CREATE(arr, 5, PMIX_INFO);
  pmix_info_t *pi = arr->array;
  pmix_rank_t rank = (pmix_rank_t)r;
  uint16_t local = (uint16_t)r; /* one node: local rank = node rank = rank */
  PMIX_INFO_LOAD(&pi[0], PMIX_RANK, &rank, PMIX_PROC_RANK);
  PMIX_INFO_LOAD(&pi[1], PMIX_LOCAL_RANK, &local, PMIX_UINT16);
  PMIX_INFO_LOAD(&pi[2], PMIX_NODE_RANK, &local, PMIX_UINT16);
  PMIX_INFO_LOAD(&pi[3], PMIX_GLOBAL_RANK, &rank, PMIX_PROC_RANK);
  PMIX_INFO_LOAD(&pi[4], PMIX_HOSTNAME, host, PMIX_STRING);
  PMIX_INFO_LOAD(dst, PMIX_PROC_DATA, arr, PMIX_DATA_ARRAY); /* copies arr */
  PMIX_DATA_ARRAY_FREE(arr);
}

/* "0,1,...,n-1": the local peers, and the input of the process map. */
static char *rank_list(int n) {
  size_t cap = (size_t)n * 12 + 1;
  char *s = calloc(1, cap);
  if (!s) return NULL;
  for (int r = 0, at = 0; r < n; r++) at += snprintf(s + at, cap - (size_t)at, r ? ",%d" : "%d", r);
  return s;
}

static int register_nspace(job *j, const char *host, char *peers) {
  char *node_map = NULL, *proc_map = NULL;
  /* The maps are what clients derive sizes and local ranks from; the
   * library can only encode them once the server is up. */
  if (!ok(PMIx_generate_regex(host, &node_map)) || !ok(PMIx_generate_ppn(peers, &proc_map))) {
    fprintf(stderr, "fsdprun: PMIx could not encode the node and process maps\n");
    free(node_map);
    return -1;
  }
  uint32_t n = (uint32_t)j->n, one = 1, zero = 0;
  pmix_rank_t leader = 0;
  size_t cap = 11 + (size_t)j->n, k = 0;
  pmix_info_t *info;
  PMIX_INFO_CREATE(info, cap);
  PMIX_INFO_LOAD(&info[k++], PMIX_UNIV_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOB_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_MAX_PROCS, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_SIZE, &n, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_NUM_NODES, &one, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODEID, &zero, PMIX_UINT32);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_LOCALLDR, &leader, PMIX_PROC_RANK);
  PMIX_INFO_LOAD(&info[k++], PMIX_JOBID, j->nspace, PMIX_STRING);
  PMIX_INFO_LOAD(&info[k++], PMIX_NODE_MAP, node_map, PMIX_REGEX);
  PMIX_INFO_LOAD(&info[k++], PMIX_PROC_MAP, proc_map, PMIX_REGEX);
  for (int r = 0; r < j->n; r++) load_proc_data(&info[k++], r, host);
  pmix_status_t rc = PMIx_server_register_nspace(j->nspace, j->n, info, k, NULL, NULL);
  PMIX_INFO_FREE(info, cap);
  free(node_map);
  free(proc_map);
  if (!ok(rc)) {
    fprintf(stderr, "fsdprun: PMIx refused the job's namespace: %s\n", PMIx_Error_string(rc));
    return -1;
  }
  return 0;
}

int pmix_register_job(job *j) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  char *peers = rank_list(j->n);
  if (!peers) return -1;
  int rc = register_nspace(j, host, peers);
  free(peers);
  if (rc < 0) return -1;
  for (int r = 0; r < j->n; r++) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, j->nspace, (pmix_rank_t)r);
    /* the library checks a connecting client's credentials against these */
    pmix_status_t st = PMIx_server_register_client(&p, getuid(), getgid(), NULL, NULL, NULL);
    if (!ok(st)) {
      fprintf(stderr, "fsdprun: PMIx refused rank %d: %s\n", r, PMIx_Error_string(st));
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

/* Teardown runs on its own thread so that a library hang costs a bounded
 * wait, never the launcher. */
static void *stop_thread(void *arg) {
  job *j = arg;
  for (int r = 0; r < j->n; r++) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, j->nspace, (pmix_rank_t)r);
    PMIx_server_deregister_client(&p, NULL, NULL);
  }
  PMIx_server_deregister_nspace(j->nspace, NULL, NULL);
  PMIx_server_finalize();
  return NULL;
}

int pmix_stop(job *j, double seconds) {
  pthread_t t;
  if (pthread_create(&t, NULL, stop_thread, j)) return -1;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)seconds;
  if (pthread_timedjoin_np(t, NULL, &until)) {
    pthread_detach(t);
    return -1;
  }
  the_job = NULL;
  return 0;
}
