/* boot.c: a rank's identity and the key/value exchange, through the PMIx
 * client API only, so the same binary runs under fsdprun, Slurm
 * (srun --mpi=pmix), PRRTE, or alone as a singleton. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../base/parallel.h"
#include "../base/log.h"
#include "../device/cuda_backend.h"
#include "../device/device_impl.h"
#include "../fsdp_dist.h"
#include "arrival.h"
#include "comm_impl.h"

static struct {
  int initialized;
  pmix_proc_t me;
  fsdp_proc_info info;
  uint32_t fences; /* fences called: each publishes its number */
} boot;

static int pmix_fail(int status, pmix_status_t rc, const char *what) {
  return fsdp_fail(status, "%s: %s (PMIx status %d)", what, PMIx_Error_string(rc), (int)rc);
}

/* Reads an unsigned integer key of proc (any PMIx integer type). */
static int get_uint(const pmix_proc_t *proc, const char *key, long *out) {
  pmix_value_t *v = NULL;
  pmix_status_t rc = PMIx_Get(proc, key, NULL, 0, &v);
  if (rc != PMIX_SUCCESS || !v) return -1;
  int ok = 0;
  switch (v->type) {
    case PMIX_UINT32: *out = (long)v->data.uint32; break;
    case PMIX_UINT16: *out = (long)v->data.uint16; break;
    case PMIX_UINT8: *out = (long)v->data.uint8; break;
    case PMIX_INT: *out = (long)v->data.integer; break;
    case PMIX_UINT: *out = (long)v->data.uint; break;
    case PMIX_PROC_RANK: *out = (long)v->data.rank; break;
    case PMIX_UINT64: *out = (long)v->data.uint64; break;
    case PMIX_SIZE: *out = (long)v->data.size; break;
    default: ok = -1; break;
  }
  PMIX_VALUE_RELEASE(v);
  return ok;
}

static void read_identity(int singleton) {
  fsdp_proc_info *in = &boot.info;
  pmix_proc_t job = boot.me;
  job.rank = PMIX_RANK_WILDCARD;
  long v;
  in->rank = (int32_t)boot.me.rank;
  in->size = get_uint(&job, PMIX_JOB_SIZE, &v) == 0 ? (int32_t)v : 1;
  in->local_rank = get_uint(&boot.me, PMIX_LOCAL_RANK, &v) == 0 ? (int32_t)v : 0;
  in->local_size = get_uint(&job, PMIX_LOCAL_SIZE, &v) == 0 ? (int32_t)v : in->size;
  in->singleton = singleton;
  snprintf(in->nspace, sizeof in->nspace, "%s", boot.me.nspace);
}

int fsdp_init(fsdp_proc_info *info) {
  if (boot.initialized) {
    if (info) *info = boot.info;
    return FSDP_OK;
  }
  memset(&boot, 0, sizeof boot);
  pmix_status_t rc = PMIx_Init(&boot.me, NULL, 0);
  int singleton = 0;
  if (rc == PMIX_ERR_UNREACH) {
    /* No server: PMIx still gives a usable singleton (rank 0 of 1). Under
     * fsdprun that would mean the handshake failed, so say so. */
    if (getenv("FSDPRUN"))
      return pmix_fail(FSDP_ELAUNCH, rc, "fsdp_init: started by fsdprun but cannot reach its PMIx server");
    singleton = 1;
    int st = fsdp_launcher_check_singleton();
    if (st < 0) {
      PMIx_Finalize(NULL, 0);
      return st;
    }
  } else if (rc != PMIX_SUCCESS) {
    return pmix_fail(FSDP_ELAUNCH, rc, "fsdp_init: PMIx_Init failed");
  }
  read_identity(singleton);
  if (singleton) {
    boot.info.rank = 0;
    boot.info.size = 1;
    boot.info.local_size = 1;
  } else {
    fsdp_arrival_announce();
  }
  int node, nodes, st = fsdp_hosts_load(boot.me.nspace, boot.info.size, boot.info.rank, &node, &nodes);
  if (st < 0) {
    PMIx_Finalize(NULL, 0);
    return st;
  }
  boot.info.node_rank = node;
  boot.info.num_nodes = nodes;
  if (!singleton) fsdp_peer_events_register();
  boot.initialized = 1;
  fsdp_heartbeat_attach(boot.info.rank); /* fsdprun --heartbeat-timeout watches from here on */
  fsdp_cpu_threads_share(boot.info.local_size);
  /* One GPU per local rank, the usual mapping, chosen when the CUDA backend
   * opens: a CPU job never starts CUDA (cuda_backend.h). */
  fsdp_cuda_note_local_rank(boot.info.local_rank);
  boot.info.device_count = fsdp_cuda_loaded() ? fsdp_device_count(FSDP_CUDA) : -1;
  fsdp_clear_error();
  fsdp_log(FSDP_LOG_DEBUG, "rank %d of %d (local %d of %d)%s", boot.info.rank, boot.info.size,
           boot.info.local_rank, boot.info.local_size, singleton ? ", singleton" : "");
  if (info) *info = boot.info;
  return FSDP_OK;
}

int fsdp_initialized(void) { return boot.initialized; }

int fsdp_finalize(void) {
  if (!boot.initialized) return FSDP_OK;
  boot.initialized = 0;
  pmix_status_t rc = PMIx_Finalize(NULL, 0);
  if (rc != PMIX_SUCCESS && rc != PMIX_ERR_UNREACH) return pmix_fail(FSDP_ELAUNCH, rc, "fsdp_finalize");
  return FSDP_OK;
}

static int need_init(const char *what) {
  if (!boot.initialized) return fsdp_fail(FSDP_ESTATE, "%s: call fsdp_init first", what);
  return FSDP_OK;
}

static int check_key(const char *key, const char *what) {
  if (!key || !key[0]) return fsdp_fail(FSDP_EINVAL, "%s: empty key", what);
  if (strlen(key) >= PMIX_MAX_KEYLEN)
    return fsdp_fail(FSDP_EINVAL, "%s: key '%.40s...' is longer than %d bytes", what, key, PMIX_MAX_KEYLEN - 1);
  return FSDP_OK;
}

int fsdp_kv_put(const char *key, const void *data, size_t len) {
  FSDP_CHECK(need_init("kv_put"));
  FSDP_CHECK(check_key(key, "kv_put"));
  if (len && !data) return fsdp_fail(FSDP_EINVAL, "kv_put '%s': NULL data", key);
  pmix_value_t v;
  memset(&v, 0, sizeof v);
  v.type = PMIX_BYTE_OBJECT;
  v.data.bo.bytes = (char *)data; /* PMIx copies it */
  v.data.bo.size = len;
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
  if (rc != PMIX_SUCCESS) return pmix_fail(FSDP_ELAUNCH, rc, "kv_put");
  return FSDP_OK;
}

int fsdp_kv_fence(int timeout_ms) {
  FSDP_CHECK(need_init("kv_fence"));
  uint32_t nth = ++boot.fences;
  if (!boot.info.singleton) FSDP_CHECK(fsdp_fence_mark(nth));
  pmix_status_t rc = PMIx_Commit();
  if (rc != PMIX_SUCCESS) return pmix_fail(FSDP_ELAUNCH, rc, "kv_fence: commit");
  if (timeout_ms <= 0) timeout_ms = (int)(fsdp_comm_default_timeout() * 1000.0);
  pmix_info_t info[2];
  bool collect = true;
  int secs = (timeout_ms + 999) / 1000;
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
  rc = PMIx_Fence(NULL, 0, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  if (rc == PMIX_ERR_TIMEOUT) {
    char missing[256];
    if (!fsdp_arrival_missing(&boot.me, boot.info.rank, boot.info.size, missing, sizeof missing))
      return fsdp_fail(FSDP_ETIMEOUT, "kv_fence: not every rank arrived within %d s (a rank died, or ranks "
                       "disagree on the order of collective calls)", secs);
    if (missing[0])
      return fsdp_fail(FSDP_ETIMEOUT, "kv_fence: not every rank arrived within %d s: %s %s never reached fsdp_init (stuck "
                       "or failed before it, or never started)", secs, strpbrk(missing, ",-") ? "ranks" : "rank", missing);
    return fsdp_fail(FSDP_ETIMEOUT, "kv_fence: not every rank arrived within %d s; every rank reached fsdp_init, so one "
                     "died since, or the ranks disagree on the order of collective calls", secs);
  }
  if (rc == PMIX_ERR_PARTIAL_SUCCESS || rc == PMIX_ERR_LOST_CONNECTION || rc == PMIX_ERR_PROC_TERM_WO_SYNC) {
    char who[96];
    int n = fsdp_fence_missing(boot.me.nspace, boot.info.size, boot.info.rank, nth, who, sizeof who);
    if (n == 0 && fsdp_peer_left() >= 0) n = 1, snprintf(who, sizeof who, "%d", fsdp_peer_left());
    if (n > 0)
      return fsdp_fail(FSDP_EPEER, "kv_fence: rank%s %s left the job during the fence (PMIx status %d)",
                       n > 1 ? "s" : "", who, (int)rc);
    return fsdp_fail(FSDP_EPEER, "kv_fence: a rank left the job during the fence (PMIx status %d; PMIx did not "
                     "say which: see the launcher's messages)", (int)rc);
  }
  if (rc != PMIX_SUCCESS) return pmix_fail(FSDP_ELAUNCH, rc, "kv_fence");
  return FSDP_OK;
}

int fsdp_kv_get(int rank, const char *key, void *data, size_t cap, size_t *len) {
  FSDP_CHECK(need_init("kv_get"));
  FSDP_CHECK(check_key(key, "kv_get"));
  if (rank < 0 || rank >= boot.info.size)
    return fsdp_fail(FSDP_EINVAL, "kv_get '%s': rank %d out of range [0, %d)", key, rank, boot.info.size);
  pmix_proc_t p = boot.me;
  p.rank = (pmix_rank_t)rank;
  pmix_value_t *v = NULL;
  pmix_status_t rc = PMIx_Get(&p, key, NULL, 0, &v);
  if (rc == PMIX_ERR_NOT_FOUND || (rc == PMIX_SUCCESS && !v))
    return fsdp_fail(FSDP_EINVAL, "kv_get: rank %d published no key '%s' (before the last fence)", rank, key);
  if (rc != PMIX_SUCCESS) return pmix_fail(FSDP_ELAUNCH, rc, "kv_get");
  int st = FSDP_OK;
  if (v->type != PMIX_BYTE_OBJECT) {
    st = fsdp_fail(FSDP_EINVAL, "kv_get '%s': not published by fsdp_kv_put", key);
  } else {
    if (len) *len = v->data.bo.size;
    if (v->data.bo.size > cap)
      st = fsdp_fail(FSDP_EINVAL, "kv_get '%s': value has %zu bytes, buffer %zu", key, v->data.bo.size, cap);
    else if (v->data.bo.size)
      memcpy(data, v->data.bo.bytes, v->data.bo.size);
  }
  PMIX_VALUE_RELEASE(v);
  return st;
}

int fsdp_abort(int status, const char *message) {
  const char *msg = message ? message : "fsdp_abort";
  if (boot.initialized && !boot.info.singleton) {
    /* said here: mpirun, srun and prterun do not print PMIx_Abort's
     * message; fsdprun does (all of it), and once is enough */
    if (!getenv("FSDPRUN")) {
      fprintf(stderr, "fsdp: rank %d of %d aborts the job (status %d): %s\n", boot.info.rank, boot.info.size, status,
              msg);
      fflush(stderr);
    }
    pmix_status_t rc = PMIx_Abort(status, msg, NULL, 0);
    if (rc == PMIX_SUCCESS && getenv("FSDPRUN")) {
      /* fsdprun prints the message of the first abort it takes, then ends
       * every rank. Exiting now could end this rank before another rank's
       * abort is taken, and fsdprun would then name this rank's exit, with
       * no message at all (this rank printed none): wait to be ended
       * (SIGTERM, at its default action), at most 10 s. */
      fsdp_stop_signals_watch(0);
      for (int i = 0; i < 1000; i++) usleep(10000);
    }
    if (rc == PMIX_SUCCESS) return FSDP_OK; /* the launcher tears the job down */
  }
  /* Alone, the job is this process: the caller asked for the end. */
  fsdp_log(FSDP_LOG_ERROR, "abort: %s", msg);
  _exit(status ? status : 1);
}
