/* fsdprun_util.c: the small helpers every part of the launcher calls (the
 * clock, the job's timeout, waking the main loop, how a rank ended, the
 * stop signals). A leaf: it calls no other launcher file, so the files
 * form no call circle (main in fsdprun.c drives job, procs, pmix, io,
 * restart, heartbeat and shm; they call down to this file only). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fsdprun.h"

double fsdprun_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int fsdprun_past_timeout(const job *j) { return j->timeout > 0 && fsdprun_now() - j->start >= j->timeout; }

void fsdprun_wake(job *j) {
  char c = 1;
  ssize_t w = write(j->wake_fd[1], &c, 1); /* full pipe: a wake-up is pending anyway */
  (void)w;
}

void describe_end(const rank_proc *r, char *buf, size_t cap) {
  if (r->sig)
    snprintf(buf, cap, "was killed by signal %d (%s)", r->sig, strsignal(r->sig));
  else if (r->never_joined)
    snprintf(buf, cap, "exited with status 0 before it joined the job (it never reached fsdp_init, where the others "
             "wait for it)");
  else
    snprintf(buf, cap, "exited with status %d", r->code);
}

/* The signals that stop the job: the ranks finish their step and save. */
void fsdprun_stop_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
  sigaddset(set, SIGUSR1); /* sbatch --signal=USR1@120: a time limit ahead */
}
