/* fsdprun: starts N local ranks of a job as a PMIx server, forwards their
 * output with a rank prefix, and ends the whole job when one rank fails.
 * `fsdprun --help` is the user's documentation (docs/LAUNCH.md repeats it). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fsdprun.h"

#ifndef FSDP_HOST_PATH
#define FSDP_HOST_PATH "fsdp"
#endif

static const char *usage_text =
    "usage: fsdprun -n N [options] FILE.lua [args...]\n"
    "       fsdprun -n N [options] --host PROGRAM [args...]\n"
    "\n"
    "Starts N ranks of `fsdp FILE.lua args...` on this machine and serves them\n"
    "as a PMIx server: each rank learns its rank, the job size, its local rank\n"
    "and local size, and can exchange keys with the others (fsdp_init).\n"
    "\n"
    "Options:\n"
    "  -n, --np N          number of ranks to start (required, >= 1)\n"
    "  --host PROGRAM      run PROGRAM [args...] as each rank instead of the fsdp\n"
    "                      rank host (any PMIx client works: test binaries, tools);\n"
    "                      it comes last: what follows is PROGRAM's arguments.\n"
    "                      FSDPRUN_HOST in the environment sets PROGRAM too\n"
    "  --no-prefix         do not prefix output lines with \"[rank] \"\n"
    "  --rank0-only        show only rank 0's standard output; every rank's standard\n"
    "                      error is still shown (errors are never hidden)\n"
    "  --grace SECONDS     after a failure, time between SIGTERM and SIGKILL to the\n"
    "                      other ranks (default 5)\n"
    "  --timeout SECONDS   end the job (exit 124) if it runs longer (default 0: never)\n"
    "  -h, --help          this text;  --version  the version\n"
    "\n"
    "Output: each rank's stdout goes to fsdprun's stdout and its stderr to\n"
    "fsdprun's stderr, line by line, as \"[3] text\".\n"
    "\n"
    "Failures: when a rank exits non-zero, is killed by a signal, or calls\n"
    "PMIx_Abort (fsdp.abort), fsdprun names it, sends SIGTERM to every other rank,\n"
    "SIGKILL after the grace period, and exits with the rank's status (128 + the\n"
    "signal number for a signal). SIGINT and SIGTERM to fsdprun do the same and it\n"
    "exits 128 + that signal. No rank outlives fsdprun, and its temporary PMIx\n"
    "directory is removed on every path.\n"
    "\n"
    "Exit status: 0 when every rank exited 0; the first failed rank's status;\n"
    "124 on --timeout; 2 for a usage error; 1 when the job could not start.\n"
    "\n"
    "More than one machine: ranks use only the PMIx client API, so on a cluster\n"
    "the same fsdp binary is started by the cluster's own PMIx server:\n"
    "  Slurm:  srun --mpi=pmix -N 4 --ntasks-per-node=8 fsdp FILE.lua [args...]\n"
    "          (`srun --mpi=list` shows whether your Slurm has PMIx)\n"
    "  PRRTE:  prterun -n 32 --map-by ppr:8:node fsdp FILE.lua [args...]\n"
    "          (PRRTE refuses root unless given --allow-run-as-root)\n"
    "A rank started with no launcher at all (`fsdp FILE.lua`) runs alone as a\n"
    "singleton: rank 0 of 1.\n"
    "\n"
    "Environment: FSDPRUN_HOST (as --host); the ranks get FSDPRUN=1 and the PMIx\n"
    "variables; FSDP_LOG, FSDP_COMM_TIMEOUT and the rest pass through.\n";

static job J;
static volatile sig_atomic_t got_signal, signal_count;

void fsdprun_wake(job *j) {
  char c = 1;
  ssize_t w = write(j->signal_pipe[1], &c, 1);
  (void)w;
}

static void on_signal(int sig) {
  if (sig == SIGINT || sig == SIGTERM) {
    got_signal = sig;
    signal_count++;
  }
  fsdprun_wake(&J);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  remove(path);
  return 0;
}

void rm_tree(const char *dir) {
  if (dir[0]) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "fsdprun: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(fsdprun --help for usage)\n");
  return 2;
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || v < 0) return -1;
  *out = v;
  return 0;
}

static int parse_args(int argc, char **argv) {
  const char *host = getenv("FSDPRUN_HOST");
  int host_given = host != NULL, i = 1;
  J.prefix = 1;
  J.grace = 5;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--")) {
      i++;
      break;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage_text, stdout);
      exit(0);
    } else if (!strcmp(a, "--version")) {
      puts("fsdprun 0.1.0");
      exit(0);
    } else if (!strcmp(a, "-n") || !strcmp(a, "--np")) {
      if (!val) return usage_error("%s expects a number of ranks", a);
      char *end;
      long n = strtol(val, &end, 10);
      if (end == val || *end || n < 1 || n > 4096)
        return usage_error("-n expects a positive integer (at most 4096), got '%s'", val);
      J.n = (int)n;
      i++;
    } else if (!strcmp(a, "--host")) {
      if (!val) return usage_error("%s expects a program", a);
      host = val;
      host_given = 1;
      i += 2; /* everything after PROGRAM is its own arguments */
      break;
    } else if (!strcmp(a, "--no-prefix")) {
      J.prefix = 0;
    } else if (!strcmp(a, "--rank0-only")) {
      J.rank0_only = 1;
    } else if (!strcmp(a, "--grace") || !strcmp(a, "--timeout")) {
      if (!val || parse_seconds(val, !strcmp(a, "--grace") ? &J.grace : &J.timeout) < 0)
        return usage_error("--grace and --timeout expect seconds (a number >= 0), got '%s'", val ? val : "nothing");
      i++;
    } else {
      return usage_error("unknown option '%s'", a);
    }
  }
  if (!J.n) return usage_error("%s", "how many ranks? give -n N");
  if (!host_given) {
    if (i >= argc) return usage_error("%s", "no job file: fsdprun -n N FILE.lua [args...]");
    if (access(argv[i], R_OK) < 0) {
      fprintf(stderr, "fsdprun: %s: %s\n", argv[i], strerror(errno));
      return 2;
    }
    host = FSDP_HOST_PATH;
  }
  int nargs = argc - i;
  J.argv = calloc((size_t)nargs + 2, sizeof(char *));
  if (!J.argv) return 1;
  J.argv[0] = (char *)host;
  for (int k = 0; k < nargs; k++) J.argv[k + 1] = argv[i + k];
  return 0;
}

static void describe_status(int status, char *buf, size_t cap) {
  if (WIFEXITED(status))
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, cap, "ended with wait status %d", status);
}

static int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/* The event loop: forward output, reap, and on the first failure stop the
 * others (TERM, then KILL after the grace period). Returns the exit code. */
static int run(void) {
  int failed = -1, code = 0, stopping = 0;
  double start = now(), kill_at = 0;
  struct pollfd *fds = calloc((size_t)J.n * 2 + 1, sizeof *fds);
  rank_proc **owner = calloc((size_t)J.n * 2 + 1, sizeof *owner);
  if (!fds || !owner) return 1;
  for (;;) {
    int running = procs_reap(&J, &failed);
    int ab_rank, ab_status;
    char ab_msg[512];
    if (!stopping && pmix_take_abort(&ab_rank, &ab_status, ab_msg, sizeof ab_msg)) {
      fprintf(stderr, "fsdprun: rank %d called abort (status %d%s%s); stopping the other %d ranks\n", ab_rank,
              ab_status, ab_msg[0] ? ": " : "", ab_msg, J.n - 1);
      code = ab_status ? ab_status : 1;
      stopping = 1;
    }
    if (!stopping && failed >= 0) {
      char what[128];
      describe_status(J.ranks[failed].status, what, sizeof what);
      if (running)
        fprintf(stderr, "fsdprun: rank %d %s; stopping the other %d ranks\n", failed, what, running);
      else
        fprintf(stderr, "fsdprun: rank %d %s\n", failed, what);
      code = exit_code_of(J.ranks[failed].status);
      stopping = 1;
    }
    if (!stopping && got_signal) {
      fprintf(stderr, "fsdprun: got %s; stopping %d ranks\n", strsignal(got_signal), running);
      code = 128 + got_signal;
      stopping = 1;
    }
    if (!stopping && J.timeout > 0 && now() - start > J.timeout) {
      fprintf(stderr, "fsdprun: the job ran past --timeout %g s; stopping %d ranks\n", J.timeout, running);
      code = 124;
      stopping = 1;
    }
    if (stopping == 1) {
      procs_signal(&J, SIGTERM);
      kill_at = now() + J.grace;
      stopping = 2;
    }
    if (stopping == 2 && running && now() >= kill_at) {
      procs_signal(&J, SIGKILL);
      stopping = 3;
    }
    /* done when every rank is reaped and its output drained (or, after a
     * failure, when the ranks are gone: a straggling grandchild holding a
     * pipe does not keep us here) */
    int nfd = 0;
    fds[nfd].fd = J.signal_pipe[0];
    fds[nfd++].events = POLLIN;
    for (int r = 0; r < J.n; r++) {
      rank_proc *rp = &J.ranks[r];
      if (rp->out_fd >= 0) {
        owner[nfd] = rp;
        fds[nfd].fd = rp->out_fd;
        fds[nfd++].events = POLLIN;
      }
      if (rp->err_fd >= 0) {
        owner[nfd] = rp;
        fds[nfd].fd = rp->err_fd;
        fds[nfd++].events = POLLIN;
      }
    }
    if (!running && (nfd == 1 || stopping)) break;
    int rc = poll(fds, (nfds_t)nfd, 100);
    if (rc < 0 && errno != EINTR) break;
    if (rc <= 0) continue;
    if (fds[0].revents) {
      char sink[64];
      while (read(J.signal_pipe[0], sink, sizeof sink) > 0) {
      }
      if (signal_count > 1 && stopping < 3) { /* asked twice: no more grace */
        procs_signal(&J, SIGKILL);
        stopping = 3;
      }
    }
    for (int k = 1; k < nfd; k++)
      if (fds[k].revents) procs_forward(&J, owner[k], fds[k].fd == owner[k]->err_fd);
  }
  for (int r = 0; r < J.n; r++) procs_flush(&J, &J.ranks[r]);
  free(fds);
  free(owner);
  return code;
}

int main(int argc, char **argv) {
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  J.ranks = calloc((size_t)J.n, sizeof *J.ranks);
  if (!J.ranks || pipe2(J.signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0) return 1;
  for (int r = 0; r < J.n; r++) J.ranks[r].out_fd = J.ranks[r].err_fd = -1;
  snprintf(J.nspace, sizeof J.nspace, "fsdprun-%d", (int)getpid());
  const char *tmp = getenv("TMPDIR");
  snprintf(J.tmpdir, sizeof J.tmpdir, "%s/fsdprun.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(J.tmpdir)) {
    fprintf(stderr, "fsdprun: cannot create a temporary directory under %s: %s\n", tmp ? tmp : "/tmp",
            strerror(errno));
    return 1;
  }
  /* A rank dying mid-handshake makes the library write to a dead socket. */
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);

  if (pmix_server_start(&J) < 0) {
    rm_tree(J.tmpdir);
    return 1;
  }
  if (pmix_job_register(&J) < 0 || procs_spawn(&J) < 0) {
    procs_signal(&J, SIGKILL);
    int ignored = -1;
    while (procs_reap(&J, &ignored)) usleep(10000);
    rm_tree(J.tmpdir);
    _exit(1);
  }
  int code = run();
  fflush(stdout);
  fflush(stderr);
  if (code == 0) {
    pmix_server_stop(&J);
    rm_tree(J.tmpdir);
    return 0;
  }
  /* After a failure skip the library's teardown (it can hang on dead
   * connections), but never leave the temp directory behind. */
  rm_tree(J.tmpdir);
  _exit(code);
}
