/* fsdprun_restart.c: --max-restarts. When a rank's failure ended the job
 * and restarts are left, fsdprun, having torn the job down as always, waits
 * a back-off and execs itself again, with train.resume=auto added to a
 * recipe's arguments. A fresh process is a fresh PMIx server, namespace and
 * set of ranks: nothing of the failed attempt carries over except what the
 * environment passes on (the attempt, the first start's time for
 * --timeout). The stop signals stay blocked across exec, so one that comes
 * in between is still pending for the new process: it is not lost. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "fsdprun.h"

#define STATE_ENV "FSDPRUN_RESTART_STATE" /* "ATTEMPT START": fsdprun to itself */
#define BACKOFF_CAP 30.0
#define RESUME_ARG "train.resume=auto"
#define REFUSED 78 /* a rank refused the job for its configuration (sysexits' EX_CONFIG; lua/fsdp/train.lua) */

static char **first_argv; /* fsdprun's own arguments, to exec again */

int restart_setup(job *j, char **argv) {
  first_argv = argv;
  const char *state = getenv(STATE_ENV);
  if (state) {
    int attempt;
    double start;
    if (sscanf(state, "%d %lf", &attempt, &start) == 2 && attempt > 0) {
      j->attempt = attempt;
      j->start = start;
    }
    unsetenv(STATE_ENV); /* not for the ranks */
  }
  /* this job's id, the same across restarts (a checkpoint directory's lock
   * record names it: a restart finds its own previous attempt there), new
   * at the first start whatever the environment says */
  if (j->attempt == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char id[64];
    snprintf(id, sizeof id, "%lx.%llx", (unsigned long)getpid(),
             (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000);
    if (setenv("FSDPRUN_JOB_ID", id, 1) < 0) return -1;
  }
  if (j->max_restarts == 0 && j->attempt == 0) return 0;
  /* the ranks inherit fsdprun's environment */
  char v[32];
  snprintf(v, sizeof v, "%d", j->attempt);
  if (setenv("FSDP_RESTART_ATTEMPT", v, 1) < 0) return -1;
  snprintf(v, sizeof v, "%d", j->max_restarts);
  return setenv("FSDP_MAX_RESTARTS", v, 1);
}

/* A rank that ended by a stop signal, or exited as a training run stopped by
 * one does (128 + it), was stopped on purpose (a scheduler signalling the
 * ranks themselves): that is not a failure to recover from. */
static int stopped_on_purpose(const job *j) {
  sigset_t stops;
  fsdprun_stop_signals(&stops);
  return j->failed_sig > 0 && j->failed_sig < NSIG && sigismember(&stops, j->failed_sig);
}

/* The back-off before restart k (1, 2, ...): base, doubling, capped. */
static double backoff(int k) {
  const char *env = getenv("FSDPRUN_RESTART_BACKOFF");
  char *end;
  double base = env ? strtod(env, &end) : 1.0;
  if (!env || end == env || *end || !(base >= 0) || base > BACKOFF_CAP) base = 1.0;
  double wait = base;
  for (int i = 1; i < k && wait < BACKOFF_CAP; i++) wait *= 2;
  return wait < BACKOFF_CAP ? wait : BACKOFF_CAP;
}

/* Waits `seconds`; a stop signal meanwhile: returns it (0: none came). */
static int wait_watching(job *j, double seconds) {
  double until = fsdprun_now() + seconds;
  for (;;) {
    double left = until - fsdprun_now();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = j->signal_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR) {
      usleep((useconds_t)(left * 1e6));
      return 0;
    }
    struct signalfd_siginfo si;
    while (read(j->signal_fd, &si, sizeof si) == (ssize_t)sizeof si)
      if (si.ssi_signo != SIGCHLD) return (int)si.ssi_signo;
  }
}

void restart_if_due(job *j, int code) {
  if (code == 0 || j->failed_rank < 0 || j->stop_signal || j->attempt >= j->max_restarts || stopped_on_purpose(j))
    return;
  if (code == REFUSED) { /* the job's configuration: the same again, or worse, another run's history resumed */
    fprintf(stderr, "fsdprun: rank %d refused the job (status %d: its recipe, arguments or checkpoint.dir); not restarting\n",
            j->failed_rank, REFUSED);
    return;
  }
  int k = j->attempt + 1;
  double wait = backoff(k);
  fprintf(stderr, "fsdprun: restart %d of %d in %g s (rank %d %s)%s\n", k, j->max_restarts, wait, j->failed_rank,
          j->failure, j->recipe && j->attempt == 0 ? " with " RESUME_ARG : "");
  fflush(stderr);
  int sig = wait_watching(j, wait);
  if (sig) {
    fprintf(stderr, "fsdprun: got signal %d (%s) before restarting; not restarting\n", sig, strsignal(sig));
    _exit(128 + sig);
  }
  if (fsdprun_past_timeout(j)) {
    fprintf(stderr, "fsdprun: --timeout %g s ran out before restart %d\n", j->timeout, k);
    _exit(124);
  }
  int argc = 0;
  while (first_argv[argc]) argc++;
  char **argv = calloc((size_t)argc + 2, sizeof *argv);
  char state[64];
  snprintf(state, sizeof state, "%d %.9f", k, j->start);
  if (!argv || setenv(STATE_ENV, state, 1) < 0) {
    fprintf(stderr, "fsdprun: cannot restart: %s\n", strerror(errno));
    return;
  }
  memcpy(argv, first_argv, (size_t)argc * sizeof *argv);
  if (j->recipe && j->attempt == 0) argv[argc++] = RESUME_ARG; /* later attempts have it already */
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC); /* the PMIx server's sockets too */
  execv("/proc/self/exe", argv);
  fprintf(stderr, "fsdprun: cannot restart: exec /proc/self/exe: %s\n", strerror(errno));
  free(argv);
}
