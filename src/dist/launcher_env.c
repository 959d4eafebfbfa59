/* launcher_env.c: what the launcher and the environment tell a rank beyond
 * its identity, and the refusals that follow from it:
 *   - a singleton whose environment shows a job of several tasks was
 *     started by a launcher without a PMIx server (srun --mpi=pmi2 or none,
 *     MPICH's hydra): every task would train alone as rank 0 of 1;
 *   - the host of every rank (PMIX_HOSTNAME), so the engine keeps a dense
 *     node index and the CPU transport refuses members on several hosts;
 *   - which rank left the job, when PMIx says so (an event), so a fence
 *     cut short by a dead peer can name it. */
#include <pmix.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"

/* ---- several tasks, no PMIx ---- */

typedef struct task_var {
  const char *name;
  int any_value; /* refuse when set at all; else when its number is > 1 */
  const char *launcher;
} task_var;

static const task_var task_vars[] = {
    {"SLURM_STEP_NUM_TASKS", 0, "Slurm"},
    {"SLURM_NTASKS", 0, "Slurm"},
    {"PMI_SIZE", 0, "a PMI-1/PMI-2 launcher"},
    {"PMI_RANK", 1, "a PMI-1/PMI-2 launcher"},
    {"PMI_FD", 1, "a PMI-1/PMI-2 launcher"},
    {"OMPI_COMM_WORLD_SIZE", 0, "Open MPI"},
    {"MV2_COMM_WORLD_SIZE", 0, "MVAPICH"},
};

int fsdp_launcher_check_singleton(void) {
  const char *ok = getenv("FSDP_SINGLETON");
  if (ok && !strcmp(ok, "1")) return FSDP_OK;
  for (size_t i = 0; i < sizeof task_vars / sizeof task_vars[0]; i++) {
    const task_var *t = &task_vars[i];
    const char *v = getenv(t->name);
    if (!v || (!t->any_value && strtol(v, NULL, 10) <= 1)) continue;
    int slurm = !strncmp(t->name, "SLURM_", 6);
    return fsdp_fail(FSDP_ELAUNCH,
                     "fsdp_init: no PMIx server, but %s=%s says %s started several tasks: each would run alone as "
                     "rank 0 of 1 and write the same files. %s (to run one rank alone on purpose, set "
                     "FSDP_SINGLETON=1)",
                     t->name, v, t->launcher,
                     slurm ? "Start the ranks with `srun --mpi=pmix` (`srun --mpi=list` shows whether this Slurm "
                             "has PMIx), or with fsdprun on one host"
                           : "Start the ranks under a PMIx launcher: fsdprun (one host), mpirun (Open MPI), "
                             "prterun, or `srun --mpi=pmix`");
  }
  return FSDP_OK;
}

/* ---- host names and the dense node index ---- */

static struct {
  int size;
  char **names; /* per rank; NULL: not known */
} hosts;

static void hosts_free(void) {
  for (int r = 0; r < hosts.size && hosts.names; r++) free(hosts.names[r]);
  free(hosts.names);
  hosts.names = NULL;
  hosts.size = 0;
}

static char *pmix_host_of(const char *nspace, int rank) {
  pmix_proc_t p;
  PMIX_PROC_LOAD(&p, nspace, (pmix_rank_t)rank);
  pmix_value_t *v = NULL;
  char *name = NULL;
  if (PMIx_Get(&p, PMIX_HOSTNAME, NULL, 0, &v) == PMIX_SUCCESS && v) {
    if (v->type == PMIX_STRING && v->data.string) name = strdup(v->data.string);
    PMIX_VALUE_RELEASE(v);
  }
  return name;
}

/* FSDP_TEST_HOSTS (testing only): "a,a,b,b", the host name of each rank in
 * rank order, in place of PMIX_HOSTNAME: lets one machine play several. */
static int test_hosts(const char *list, int size) {
  const char *p = list;
  int r = 0;
  for (; *p && r < size; r++) {
    size_t len = strcspn(p, ",");
    if (!len) break;
    hosts.names[r] = strndup(p, len);
    p += len + (p[len] == ',');
  }
  if (r == size && !*p && p[-1] != ',') return FSDP_OK;
  return fsdp_fail(FSDP_EINVAL, "fsdp_init: FSDP_TEST_HOSTS='%s' must list %d non-empty host names", list, size);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int fsdp_hosts_load(const char *nspace, int size, int rank, int *node_index, int *num_nodes) {
  hosts_free();
  hosts.names = calloc((size_t)size, sizeof *hosts.names);
  if (!hosts.names) return fsdp_fail(FSDP_ENOMEM, "fsdp_init: out of memory");
  hosts.size = size;
  const char *fake = getenv("FSDP_TEST_HOSTS");
  if (fake && fake[0]) {
    FSDP_CHECK(test_hosts(fake, size));
  } else {
    for (int r = 0; r < size; r++) hosts.names[r] = size > 1 ? pmix_host_of(nspace, r) : NULL;
    if (!hosts.names[rank]) {
      char me[256] = "localhost";
      gethostname(me, sizeof me - 1);
      hosts.names[rank] = strdup(me);
    }
  }
  /* node index: position of this rank's host among the sorted distinct
   * names (PMIX_NODEID is an id, not always 0..N-1, and not always known) */
  char **sorted = malloc((size_t)size * sizeof *sorted);
  if (!sorted) return fsdp_fail(FSDP_ENOMEM, "fsdp_init: out of memory");
  int n = 0;
  for (int r = 0; r < size; r++)
    if (hosts.names[r]) sorted[n++] = hosts.names[r];
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  int distinct = 0, mine = 0;
  for (int k = 0; k < n; k++) {
    if (k && !strcmp(sorted[k], sorted[k - 1])) continue;
    if (hosts.names[rank] && !strcmp(sorted[k], hosts.names[rank])) mine = distinct;
    distinct++;
  }
  free(sorted);
  *node_index = mine;
  *num_nodes = distinct ? distinct : 1;
  return FSDP_OK;
}

/* FSDP_COMM_TIMEOUT: how long a collective or a fence waits for its peers
 * (here, not in comm.c, which calls boot.c's fences: boot.c reads it too) */
double fsdp_comm_default_timeout(void) {
  const char *v = getenv("FSDP_COMM_TIMEOUT");
  if (v) {
    char *end;
    double s = strtod(v, &end);
    if (end != v && s > 0) return s;
  }
  return 300.0;
}

const char *fsdp_host_of(int rank) {
  return rank >= 0 && rank < hosts.size && hosts.names[rank] ? hosts.names[rank] : NULL;
}

/* "ranks 0, 1 on a; rank 2 on b": each host with its members, in order. */
static void describe_hosts(const int *members, int n, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && at < cap; i++) {
    const char *h = fsdp_host_of(members[i]);
    int first = 1;
    for (int k = 0; k < i && first; k++) {
      const char *o = fsdp_host_of(members[k]);
      if (o && h && !strcmp(o, h)) first = 0;
    }
    if (!first || !h) continue;
    int count = 0;
    for (int k = i; k < n; k++)
      if (fsdp_host_of(members[k]) && !strcmp(fsdp_host_of(members[k]), h)) count++;
    at += (size_t)snprintf(buf + at, cap - at, "%s%s ", at ? "; " : "", count > 1 ? "ranks" : "rank");
    for (int k = i, c = 0; k < n && at < cap; k++)
      if (fsdp_host_of(members[k]) && !strcmp(fsdp_host_of(members[k]), h))
        at += (size_t)snprintf(buf + at, cap - at, "%s%d", c++ ? ", " : "", members[k]);
    if (at < cap) at += (size_t)snprintf(buf + at, cap - at, " on %s", h);
  }
}

int fsdp_hosts_check_one(const char *group, const int *members, int n) {
  const char *h0 = fsdp_host_of(members[0]);
  for (int i = 1; i < n; i++) {
    const char *h = fsdp_host_of(members[i]);
    if (!h0 || !h || !strcmp(h, h0)) continue; /* unknown: the segment's own checks still hold */
    char where[768];
    describe_hosts(members, n, where, sizeof where);
    return fsdp_fail(FSDP_EUNSUPPORTED,
                     "comm '%s': the CPU transport is one host only, and this group spans several (%s). Run CPU "
                     "ranks on one host, or give each host its own group (a mesh whose shard dimension stays "
                     "within a host)",
                     group, where);
  }
  return FSDP_OK;
}

/* ---- peers that left ---- */

/* Each fence carries this rank's count of fences; after a fence cut short
 * (PMIx: PARTIAL SUCCESS), a rank whose count did not arrive is one that
 * left. */
#define FENCE_KEY "fsdp.fence.n"

int fsdp_fence_mark(uint32_t n) {
  pmix_value_t v;
  memset(&v, 0, sizeof v);
  v.type = PMIX_UINT32;
  v.data.uint32 = n;
  return PMIx_Put(PMIX_GLOBAL, FENCE_KEY, &v) == PMIX_SUCCESS ? FSDP_OK : FSDP_ELAUNCH;
}

int fsdp_fence_missing(const char *nspace, int size, int me, uint32_t n, char *buf, size_t cap) {
  int missing = 0;
  size_t at = 0;
  buf[0] = '\0';
  pmix_info_t opt;
  bool yes = true;
  PMIX_INFO_LOAD(&opt, PMIX_IMMEDIATE, &yes, PMIX_BOOL);
  for (int r = 0; r < size; r++) {
    if (r == me) continue;
    pmix_proc_t p;
    PMIX_PROC_LOAD(&p, nspace, (pmix_rank_t)r);
    pmix_value_t *v = NULL;
    int arrived = PMIx_Get(&p, FENCE_KEY, &opt, 1, &v) == PMIX_SUCCESS && v && v->type == PMIX_UINT32 &&
                  v->data.uint32 == n;
    if (v) PMIX_VALUE_RELEASE(v);
    if (arrived) continue;
    if (missing < 8 && at < cap)
      at += (size_t)snprintf(buf + at, cap - at, "%s%d", missing ? ", " : "", r);
    else if (missing == 8 && at < cap)
      at += (size_t)snprintf(buf + at, cap - at, ", ...");
    missing++;
  }
  PMIX_INFO_DESTRUCT(&opt);
  return missing;
}

static _Atomic int left_rank = -1;

static void on_peer_left(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[],
                         size_t ninfo, pmix_info_t *results, size_t nresults,
                         pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
  (void)id, (void)status, (void)results, (void)nresults;
  int who = -1;
  for (size_t i = 0; i < ninfo; i++)
    if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC)
      who = (int)info[i].value.data.proc->rank;
  if (who < 0 && source && source->rank < PMIX_RANK_VALID) who = (int)source->rank;
  if (who >= 0) {
    int expect = -1;
    atomic_compare_exchange_strong(&left_rank, &expect, who);
  }
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

void fsdp_peer_events_register(void) {
  pmix_status_t codes[] = {PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_EVENT_PROC_TERMINATED, PMIX_ERR_PROC_ABORTED_BY_SIG};
  atomic_store(&left_rank, -1);
  PMIx_Register_event_handler(codes, sizeof codes / sizeof codes[0], NULL, 0, on_peer_left, NULL, NULL);
}

int fsdp_peer_left(void) { return atomic_load(&left_rank); }
