/* fsdprun_job.c: supervising a running job. One loop on the main thread
 * forwards output, reaps ranks, and reacts to the first bad event (a rank
 * failing, PMIx_Abort, a signal to fsdprun, --timeout): every rank gets
 * SIGTERM, then SIGKILL after the grace period. Ranks cannot be relied on
 * to notice a dead peer themselves, so ending the job is fsdprun's duty. */
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

/* After SIGKILL, how long to wait for pipes held open by a process that
 * left the ranks' group before giving up on its output. */
#define DRAIN_AFTER_KILL 1.0
#define ABORT_SLACK 0.05
/* After a rank failed, the others cannot finish a step (it needs every
 * rank) nor save: at most this long before SIGKILL, whatever --grace says. */
#define FAILED_GRACE 5.0

static double now(void) { return fsdprun_now(); }

/* An abort that came while a rank that had ended before it was not reaped
 * yet waits for that reap (the rank's status), at most this long. */
#define ABORT_HOLD 1.0

/* A rank's PMIx_Abort, taken from the library, not acted on yet. */
typedef struct abort_note {
  int pending, rank, status;
  double at;
  char msg[FSDPRUN_ABORT_MSG];
} abort_note;

typedef struct sup {
  job *j;
  abort_note ab;
  int code;       /* fsdprun's exit code, set by the first bad event */
  int stopping;   /* SIGTERM sent */
  int killed;     /* SIGKILL sent */
  double kill_at; /* when SIGTERM turns into SIGKILL */
  int signals;    /* signals received */
  int running;
} sup;

static const char *others(int n, char *buf, size_t cap) {
  if (n == 0) return "";
  if (n == 1) return "; stopping the other rank";
  snprintf(buf, cap, "; stopping the other %d ranks", n);
  return buf;
}

/* The exit code never reads as success, and fits in 8 bits. */
static int failure_code(int status) { return status & 0xff ? status & 0xff : 1; }

/* sig: what the ranks get: the stop signal fsdprun itself got (a rank
 * says which stopped it: Ctrl-C is SIGINT), else SIGTERM */
static void stop(sup *s, int code, int sig) {
  s->code = code;
  s->stopping = 1;
  s->kill_at = now() + s->j->grace;
  procs_signal(s->j, sig);
}

/* A rank failed (how: `what`; by_sig: the signal it ended by, or exited
 * 128 + it, else 0); the job may be restarted (fsdprun_restart.c). */
static void stop_failed(sup *s, int code, int rank, const char *what, int by_sig) {
  job *j = s->j;
  j->failed_rank = rank;
  j->failed_sig = by_sig;
  snprintf(j->failure, sizeof j->failure, "%s", what);
  stop(s, code, SIGTERM);
  if (j->grace > FAILED_GRACE) s->kill_at = now() + FAILED_GRACE;
}

static void kill_now(sup *s) {
  s->killed = 1;
  s->kill_at = now();
  procs_signal(s->j, SIGKILL);
}

static void on_rank_failed(sup *s, int r) {
  rank_proc *rp = &s->j->ranks[r];
  char what[128], tail[64];
  describe_end(rp, what, sizeof what);
  fprintf(stderr, "fsdprun: rank %d %s%s\n", r, what, others(s->running, tail, sizeof tail));
  stop_failed(s, rp->sig ? 128 + rp->sig : failure_code(rp->code), r, what,
              rp->sig ? rp->sig : rp->code > 128 ? rp->code - 128 : 0);
}

static void on_abort(sup *s, int r, int status, const char *msg) {
  char tail[64];
  /* the whole message, once: an fsdp rank under fsdprun leaves it to us
   * (src/dist/boot.c); its first line on ours, the rest (a traceback)
   * below it, indented */
  int len = (int)strcspn(msg, "\n");
  fprintf(stderr, "fsdprun: rank %d called PMIx_Abort with status %d%s%.*s%s\n", r, status, msg[0] ? ": " : "", len, msg,
          others(s->running - 1, tail, sizeof tail));
  for (const char *line = msg + len; *line;) {
    line++; /* past the newline */
    int n = (int)strcspn(line, "\n");
    if (n || line[n]) fprintf(stderr, "  %.*s\n", n, line);
    line += n;
  }
  char what[64];
  snprintf(what, sizeof what, "called PMIx_Abort with status %d", status);
  stop_failed(s, failure_code(status), r, what, 0);
}

static void on_signal(sup *s, int sig) {
  s->signals++;
  if (sig == SIGCHLD) return; /* only a wake-up: the loop reaps */
  s->j->stop_signal = sig;    /* asked to stop: no restart */
  if (!s->stopping) {
    s->running = procs_running(s->j); /* a signal while starting comes before the first reap */
    fprintf(stderr, "fsdprun: got signal %d (%s); stopping %d rank%s\n", sig, strsignal(sig), s->running,
            s->running == 1 ? "" : "s");
    stop(s, 128 + sig, sig);
  } else if (!s->killed) { /* asked again: no more grace */
    fprintf(stderr, "fsdprun: got signal %d again; killing the ranks\n", sig);
    kill_now(s);
  }
}

/* Everything that may have happened since the last look. */
static void check_events(sup *s) {
  job *j = s->j;
  int failed = -1;
  double failed_at = 0;
  abort_note *ab = &s->ab;
  /* The first by time: a rank killed by a signal before a survivor aborted
   * (its collective saw the dead peer) is the cause. An abort comes before
   * its own rank's exit: PMIx_Abort returns only after the library told us.
   * The abort is taken first: the ranks that had ended when it came were
   * stamped then (fsdprun_pmix.c), and the reap below finds them. */
  if (!ab->pending && !s->stopping)
    ab->pending = pmix_take_abort(&ab->rank, &ab->status, ab->msg, sizeof ab->msg, &ab->at);
  s->running = procs_reap(j, &failed, &failed_at);
  if (s->stopping) return;
  /* such a rank whose threads are still exiting: wait for its status */
  /* (the aborting rank's own end, if it came meanwhile, is the abort's) */
  if (ab->pending && (failed < 0 || failed == ab->rank) && procs_ended_before(j, ab->at) && now() < ab->at + ABORT_HOLD)
    return;
  /* A survivor aborts a few ms after a peer's death (the time to notice
   * it), and a busy fsdprun may stamp that death late by as much: an abort
   * less than ABORT_SLACK before another rank's failure counts as after. */
  if (ab->pending && (failed < 0 || ab->rank == failed || ab->at + ABORT_SLACK <= failed_at))
    on_abort(s, ab->rank, ab->status, ab->msg);
  else if (failed >= 0)
    on_rank_failed(s, failed);
  ab->pending = 0;
}

/* A rank silent past --heartbeat-timeout: stuck (stopped, or spinning
 * outside the engine). It cannot act on SIGTERM (a stopped one would not
 * even see it): it is killed now, the others stopped as after a failure. */
static void check_heartbeats(sup *s) {
  int r;
  double silent;
  long long step;
  if (s->stopping || !heartbeat_stale(s->j, &r, &silent, &step)) return;
  char last[64] = "no step reported yet", what[128];
  if (step >= 0) snprintf(last, sizeof last, "last at step %lld", step);
  snprintf(what, sizeof what, "sent no heartbeat for %.0f s (%s)", silent, last);
  fprintf(stderr, "fsdprun: rank %d %s; stopping the job\n", r, what);
  kill(s->j->ranks[r].pid, SIGKILL);
  stop_failed(s, 1, r, what, 0); /* a restart (--max-restarts) may get past it */
}

/* When to wake up next without an event: the timeout, the end of grace, or
 * the next look at the heartbeats. */
static int poll_ms(sup *s) {
  double start = s->j->start;
  double t = -1, left;
  if (!s->stopping && s->j->timeout > 0) t = start + s->j->timeout;
  if (s->ab.pending && !s->stopping && (t < 0 || s->ab.at + ABORT_HOLD < t)) t = s->ab.at + ABORT_HOLD;
  if (!s->stopping && s->j->heartbeat) {
    double next = now() + heartbeat_check_every(s->j);
    if (t < 0 || next < t) t = next;
  }
  if (s->stopping && !s->killed) t = s->kill_at;
  if (s->killed && !s->running) t = s->kill_at + DRAIN_AFTER_KILL;
  if (t < 0) return -1;
  left = t - now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

static void drain_wakeups(job *j, sup *s) {
  char sink[64];
  while (read(j->wake_fd[0], sink, sizeof sink) > 0) {
  }
  struct signalfd_siginfo si;
  while (read(j->signal_fd, &si, sizeof si) == (ssize_t)sizeof si) on_signal(s, (int)si.ssi_signo);
}

/* Our terminal's input to rank 0 (--repl); end of input closes its pipe. */
static void forward_stdin(job *j) {
  char buf[4096];
  ssize_t n = read(0, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(j->stdin_fwd, p, (size_t)n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break; /* rank 0 is gone */
    p += w;
    n -= w;
  }
  if (n != 0 || p == buf) { /* end of input, or nobody reads: close */
    close(j->stdin_fwd);
    j->stdin_fwd = -1;
  }
}

int job_supervise(job *j) {
  sup s = {.j = j};
  size_t cap = (size_t)j->n * 2 + 3;
  struct pollfd *fds = calloc(cap, sizeof *fds);
  int *who = calloc(cap, sizeof *who); /* rank * 2 + is_err, per pollfd */
  if (!fds || !who) {
    free(fds);
    free(who);
    stop(&s, 1, SIGTERM);
    kill_now(&s);
    return 1;
  }
  drain_wakeups(j, &s); /* a signal that stopped the start of the ranks */
  for (;;) {
    check_events(&s);
    check_heartbeats(&s);
    if (!s.stopping && fsdprun_past_timeout(j)) {
      char starting[96] = "";
      if (j->spawned < j->n)
        snprintf(starting, sizeof starting, " while starting the ranks (%d of %d started)", j->spawned, j->n);
      fprintf(stderr, "fsdprun: the job ran past --timeout %g s%s; stopping %d rank%s\n", j->timeout, starting,
              s.running, s.running == 1 ? "" : "s");
      stop(&s, 124, SIGTERM);
    }
    if (s.running == 0 && !s.stopping) {
      /* The ranks are done. Anything still in their group is an orphan
       * (it may hold the pipes open): end it like a failed rank, but the
       * job's exit code stays 0. */
      stop(&s, 0, SIGTERM);
    }
    if (s.stopping && !s.killed && now() >= s.kill_at) kill_now(&s);
    int open_pipes = io_open_streams(j);
    if (s.running == 0 && (open_pipes == 0 || (s.killed && now() >= s.kill_at + DRAIN_AFTER_KILL))) break;

    nfds_t nfd = 0;
    fds[nfd++] = (struct pollfd){.fd = j->signal_fd, .events = POLLIN};
    fds[nfd++] = (struct pollfd){.fd = j->wake_fd[0], .events = POLLIN};
    nfds_t in_at = 0; /* --repl at a terminal: our stdin, passed to rank 0 */
    if (j->stdin_fwd >= 0 && !s.stopping) {
      in_at = nfd;
      who[nfd] = -1;
      fds[nfd++] = (struct pollfd){.fd = 0, .events = POLLIN};
    }
    for (int r = 0; r < j->n; r++) {
      if (j->ranks[r].out.fd >= 0) {
        who[nfd] = r * 2;
        fds[nfd++] = (struct pollfd){.fd = j->ranks[r].out.fd, .events = POLLIN};
      }
      if (j->ranks[r].err.fd >= 0) {
        who[nfd] = r * 2 + 1;
        fds[nfd++] = (struct pollfd){.fd = j->ranks[r].err.fd, .events = POLLIN};
      }
    }
    int rc = poll(fds, nfd, poll_ms(&s));
    if (rc < 0 && errno != EINTR) { /* cannot watch the job: end it, then wait without poll */
      fprintf(stderr, "fsdprun: poll: %s\n", strerror(errno));
      if (!s.stopping) stop(&s, 1, SIGTERM);
      if (!s.killed) kill_now(&s);
      usleep(100000);
      continue;
    }
    if (rc <= 0) continue;
    if (fds[0].revents || fds[1].revents) drain_wakeups(j, &s);
    if (in_at && fds[in_at].revents) forward_stdin(j);
    for (nfds_t k = 2; k < nfd; k++)
      if (fds[k].revents && who[k] >= 0) io_read(j, who[k] / 2, who[k] % 2);
  }
  free(fds);
  free(who);
  /* Whatever escaped the pipes' watch (an orphan that closed them) goes too;
   * the group still exists while rank 0's zombie does. */
  procs_signal(j, SIGKILL);
  procs_release_leader(j);
  io_finish(j);
  return s.code;
}
