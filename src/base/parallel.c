/* parallel.c: a small pool of CPU threads for elementwise loops over large
 * flat buffers (the optimizer step over a shard: on an offloaded GPU job
 * this is where the time goes, and one core cannot keep up with the memory
 * bandwidth). Workers start on first use and wait on a condition variable
 * between jobs. One job at a time: a caller that finds the pool busy (a
 * second thread) runs its loop alone, which gives the same results (the
 * loops are elementwise) and never deadlocks.
 *
 * Threads: FSDP_CPU_THREADS, else the rank's cores (fsdp_rank_cores: its
 * own where a launcher bound it, else its share of the machine's), set by
 * fsdp_init, as OpenBLAS's are. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "error.h"
#include "parallel.h"
#include "../fsdp_base.h"

enum { MAX_THREADS = 64 };

/* one call's work, on the caller's stack; workers hold it through users */
typedef struct job {
  fsdp_range_fn fn;
  void *arg;
  int64_t n, chunk;
  int chunks, remaining, users;
  atomic_int next;
} job;

static struct {
  pthread_mutex_t lock, busy;
  pthread_cond_t work, done;
  pthread_t threads[MAX_THREADS];
  int started, wanted;
  unsigned long generation;
  job *current;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .busy = PTHREAD_MUTEX_INITIALIZER,
          .work = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static void run_chunks(job *j) {
  for (;;) {
    int k = atomic_fetch_add(&j->next, 1);
    if (k >= j->chunks) return;
    int64_t lo = (int64_t)k * j->chunk, hi = lo + j->chunk < j->n ? lo + j->chunk : j->n;
    j->fn(j->arg, lo, hi);
    pthread_mutex_lock(&pool.lock);
    if (--j->remaining == 0) pthread_cond_broadcast(&pool.done);
    pthread_mutex_unlock(&pool.lock);
  }
}

static void *worker(void *unused) {
  (void)unused;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&pool.lock);
    while (pool.generation == seen) pthread_cond_wait(&pool.work, &pool.lock);
    seen = pool.generation;
    job *j = pool.current; /* NULL when the job ended before this worker woke */
    if (j) j->users++;
    pthread_mutex_unlock(&pool.lock);
    if (!j) continue;
    run_chunks(j);
    pthread_mutex_lock(&pool.lock);
    if (--j->users == 0) pthread_cond_broadcast(&pool.done);
    pthread_mutex_unlock(&pool.lock);
  }
  return NULL;
}

static int default_threads(void) {
  const char *v = getenv("FSDP_CPU_THREADS");
  if (v && atoi(v) > 0) return atoi(v) < MAX_THREADS ? atoi(v) : MAX_THREADS;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 ? (int)(cpus < MAX_THREADS ? cpus : MAX_THREADS) : 1;
}

int fsdp_cpu_threads(void) {
  pthread_mutex_lock(&pool.lock);
  if (!pool.wanted) pool.wanted = default_threads();
  int n = pool.wanted;
  pthread_mutex_unlock(&pool.lock);
  return n;
}

int fsdp_cpu_threads_set(int n) {
  if (n < 1) return fsdp_fail(FSDP_EINVAL, "cpu_threads_set: %d threads; expected >= 1", n);
  pthread_mutex_lock(&pool.lock);
  pool.wanted = n < MAX_THREADS ? n : MAX_THREADS;
  pthread_mutex_unlock(&pool.lock);
  return FSDP_OK;
}

static _Atomic int host_ranks;

int fsdp_host_ranks(void) { return atomic_load(&host_ranks); }

/* Bound: the rank's affinity is a strict subset of its parent's (the
 * launcher's daemon or fsdprun: what the job was given). A container's
 * cpuset restricts parent and ranks alike, so it reads as shared. */
int fsdp_rank_cores(int *bound) {
  cpu_set_t self, parent, both;
  int is_bound = 0, n;
  if (sched_getaffinity(0, sizeof self, &self) == 0) {
    n = CPU_COUNT(&self);
    if (sched_getaffinity(getppid(), sizeof parent, &parent) == 0) {
      CPU_AND(&both, &self, &parent);
      is_bound = CPU_EQUAL(&both, &self) && n < CPU_COUNT(&parent);
    }
  } else {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    n = cpus > 0 ? (int)cpus : 1;
  }
  int ranks = atomic_load(&host_ranks);
  if (!is_bound && ranks > 1) n /= ranks;
  if (bound) *bound = is_bound;
  return n > 0 ? n : 1;
}

void fsdp_cpu_threads_share(int local_ranks) {
  atomic_store(&host_ranks, local_ranks);
  if (getenv("FSDP_CPU_THREADS")) return;
  fsdp_cpu_threads_set(fsdp_rank_cores(NULL));
}

void fsdp_parallel_for(int64_t n, int64_t grain, fsdp_range_fn fn, void *arg) {
  int threads = fsdp_cpu_threads();
  if (grain < 1) grain = 1;
  int64_t want = (n + grain - 1) / grain;
  if (threads <= 1 || want <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
    if (n > 0) fn(arg, 0, n);
    return;
  }
  if (want > threads) want = threads;
  pthread_mutex_lock(&pool.lock);
  while (pool.started < threads - 1 && pool.started < MAX_THREADS - 1) { /* the caller is one of them */
    if (pthread_create(&pool.threads[pool.started], NULL, worker, NULL) != 0) break;
    pthread_detach(pool.threads[pool.started]);
    pool.started++;
  }
  if (want > pool.started + 1) want = pool.started + 1;
  job j = {.fn = fn, .arg = arg, .n = n, .chunk = (n + want - 1) / want};
  j.chunks = (int)((n + j.chunk - 1) / j.chunk);
  j.remaining = j.chunks;
  atomic_init(&j.next, 0);
  pool.current = &j;
  pool.generation++;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.lock);
  run_chunks(&j);
  pthread_mutex_lock(&pool.lock);
  while (j.remaining > 0 || j.users > 0) pthread_cond_wait(&pool.done, &pool.lock);
  pool.current = NULL;
  pthread_mutex_unlock(&pool.lock);
  pthread_mutex_unlock(&pool.busy);
}
