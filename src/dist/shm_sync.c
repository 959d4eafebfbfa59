/* shm_sync.c: futex-based barrier across processes (see shm_sync.h). */
#include "shm_sync.h"
#include "../fsdp_dist.h"

#include "../base/heartbeat.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

double shm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A zombie (exited, not yet reaped by its parent) counts as dead. */
int shm_pid_alive(int32_t pid) {
  if (pid <= 0) return 1;
  if (kill(pid, 0) < 0 && errno == ESRCH) return 0;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 1; /* no /proc: trust kill() */
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = '\0';
  const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}


static void futex_wait(_Atomic uint32_t *word, uint32_t expect, long timeout_ns) {
  struct timespec ts = {0, timeout_ns};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

shm_wait_result shm_barrier_wait(shm_barrier *b, const shm_watch *w, int *culprit) {
  uint32_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
  atomic_fetch_add_explicit(&w->arrived[w->me], 1, memory_order_relaxed);
  if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == (uint32_t)w->n - 1) {
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    atomic_store_explicit(&b->gen, gen + 1, memory_order_release);
    futex_wake_all(&b->gen);
    return SHM_WAIT_OK;
  }
  for (int i = 0; i < w->spin; i++) {
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return SHM_WAIT_OK;
    cpu_relax();
  }
  uint64_t mine = atomic_load_explicit(&w->arrived[w->me], memory_order_relaxed);
  for (;;) {
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return SHM_WAIT_OK;
    futex_wait(&b->gen, gen, 5 * 1000 * 1000); /* 5 ms: bounds how late a death is seen */
    fsdp_heartbeat_pulse(); /* waiting for a peer is not being stuck: the stuck one goes silent */
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen) return SHM_WAIT_OK;
    if (atomic_load_explicit(w->failed, memory_order_acquire)) return SHM_WAIT_FAILED;
    for (int j = 0; j < w->n; j++) {
      if (j == w->me) continue;
      /* a member that already arrived may have exited legitimately since */
      if (atomic_load_explicit(&w->arrived[j], memory_order_relaxed) >= mine) continue;
      if (!shm_pid_alive(atomic_load_explicit(&w->pids[j], memory_order_relaxed))) {
        *culprit = j;
        return SHM_WAIT_DEAD;
      }
    }
    if (shm_now() > w->deadline) {
      *culprit = -1;
      for (int j = 0; j < w->n; j++)
        if (atomic_load_explicit(&w->arrived[j], memory_order_relaxed) < mine) {
          *culprit = j;
          break;
        }
      return SHM_WAIT_TIMEOUT;
    }
  }
}

void shm_fail_wake(shm_barrier *b, _Atomic int32_t *failed) {
  atomic_store_explicit(failed, 1, memory_order_release);
  futex_wake_all(&b->gen);
}
