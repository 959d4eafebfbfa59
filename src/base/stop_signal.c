/* stop_signal.c: a training run's graceful stop. The signals a scheduler or
 * a user sends before ending a job (SIGTERM: Slurm's time limit and
 * preemption, SIGINT: Ctrl-C, SIGHUP: a closed terminal, SIGUSR1: sbatch
 * --signal=USR1@120) are only recorded while watched: the trainer reads
 * the record at the end of each step, agrees with the other ranks on it,
 * saves a checkpoint and stops. A second such signal ends the process at
 * once (the default action), as a user pressing Ctrl-C twice expects; but
 * once the stop is saved (watch mode 2, "finishing") later ones are
 * ignored: the launcher's own SIGTERM to the tasks still running (srun
 * --kill-on-bad-exit after the first task ended 138) must not turn a saved
 * stop into a kill (exit 143 instead of 138). */
#include <signal.h>
#include <string.h>

#include "error.h"
#include "../fsdp_base.h"

static const int watched[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
enum { NWATCHED = (int)(sizeof watched / sizeof watched[0]) };
static volatile sig_atomic_t pending;
static struct sigaction saved[NWATCHED];
static int watching;
static volatile sig_atomic_t finishing;

static void on_signal(int sig) {
  if (finishing) return;
  if (pending) { /* the second: what the signal would have done unwatched */
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  pending = sig;
}

int fsdp_stop_signals_watch(int on) {
  if (on < 0 || on > 2) return fsdp_fail(FSDP_EINVAL, "stop signals: watch mode %d (0, 1 or 2)", on);
  finishing = on == 2;
  if (on && !watching) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* collectives and file writes carry on */
    for (int i = 0; i < NWATCHED; i++)
      if (sigaction(watched[i], &sa, &saved[i]) != 0) return fsdp_fail(FSDP_EINVAL, "stop signals: sigaction failed");
    pending = 0;
    watching = 1;
  } else if (!on && watching) {
    for (int i = 0; i < NWATCHED; i++) sigaction(watched[i], &saved[i], NULL);
    watching = 0;
  }
  return FSDP_OK;
}

int fsdp_stop_signal(void) { return (int)pending; }

const char *fsdp_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
  }
}
