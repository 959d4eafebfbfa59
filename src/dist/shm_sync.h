/* shm_sync.h: a barrier for processes that share memory. Waiters spin briefly
 * and then sleep on a futex, so ranks that outnumber the cores do not steal
 * each other's time; while asleep they wake every few ms to notice a dead
 * peer, a failed group, or the deadline. */
#ifndef FSDP_DIST_SHM_SYNC_H
#define FSDP_DIST_SHM_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct shm_barrier {
  _Atomic uint32_t count; /* arrivals in the current generation */
  _Atomic uint32_t gen;   /* futex word: bumped by the last arrival */
} shm_barrier;

typedef struct shm_watch {
  _Atomic int32_t *pids;  /* per member, 0 = not known yet */
  _Atomic uint64_t *arrived; /* per member: barriers passed (for messages) */
  _Atomic int32_t *failed;   /* group-wide failure flag (set by any member) */
  int n, me;
  int spin;                  /* busy-wait iterations before sleeping */
  double deadline;           /* monotonic seconds */
} shm_watch;

typedef enum { SHM_WAIT_OK = 0, SHM_WAIT_DEAD = 1, SHM_WAIT_FAILED = 2, SHM_WAIT_TIMEOUT = 3 } shm_wait_result;

/* Returns SHM_WAIT_OK, or why not (the caller reports it and calls
 * shm_fail_wake so that the others stop waiting); *culprit is the dead member's index or,
 * for a timeout, the first member that had not arrived. */
shm_wait_result shm_barrier_wait(shm_barrier *b, const shm_watch *w, int *culprit);
/* Marks the group failed (after the message is written) and wakes waiters. */
void shm_fail_wake(shm_barrier *b, _Atomic int32_t *failed);
double shm_now(void);
int shm_pid_alive(int32_t pid);

#endif
