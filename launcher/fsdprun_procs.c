/* fsdprun_procs.c: starting the ranks, forwarding their output line by line
 * with a rank prefix, reaping them, and signalling them. All ranks share one
 * process group, so a signal reaches whatever they started too. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsdprun.h"

extern char **environ;

static void child_exec(job *j, int rank, char **env, int out_w, int err_w) {
  setpgid(0, j->pgid); /* also done by the parent: whichever runs first */
  /* an ignored or blocked signal survives exec: give the rank the defaults */
  signal(SIGPIPE, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  dup2(out_w, 1);
  dup2(err_w, 2);
  for (char **e = env; *e; e++) putenv(*e);
  setenv("FSDPRUN", "1", 1);
  execvp(j->argv[0], j->argv);
  fprintf(stderr, "fsdprun: cannot start rank %d (%s): %s\n", rank, j->argv[0], strerror(errno));
  _exit(127);
}

int procs_spawn(job *j) {
  for (int r = 0; r < j->n; r++) {
    rank_proc *rp = &j->ranks[r];
    char **env = NULL;
    if (pmix_rank_env(j, r, &env) < 0) return -1;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
      fprintf(stderr, "fsdprun: pipe: %s\n", strerror(errno));
      return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "fsdprun: fork for rank %d: %s\n", r, strerror(errno));
      return -1;
    }
    if (pid == 0) child_exec(j, r, env, out[1], err[1]);
    if (j->pgid == 0) j->pgid = pid;
    setpgid(pid, j->pgid);
    for (char **e = env; *e; e++) free(*e);
    free(env);
    close(out[1]);
    close(err[1]);
    rp->pid = pid;
    rp->out_fd = out[0];
    rp->err_fd = err[0];
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
  }
  return 0;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return; /* our own stdout is gone: drop, keep running */
    p += w;
    n -= (size_t)w;
  }
}

/* One write per line, so lines from different ranks never interleave. */
static void emit(job *j, int rank, int is_err, const char *line, size_t len) {
  if (j->rank0_only && rank != 0 && !is_err) return;
  char stack[4096];
  char *buf = len + 32 <= sizeof stack ? stack : malloc(len + 32);
  if (!buf) return;
  size_t at = j->prefix ? (size_t)snprintf(buf, 32, "[%d] ", rank) : 0;
  memcpy(buf + at, line, len);
  at += len;
  if (!len || line[len - 1] != '\n') buf[at++] = '\n'; /* a partial last line */
  write_all(is_err ? 2 : 1, buf, at);
  if (buf != stack) free(buf);
}

void procs_forward(job *j, rank_proc *r, int is_err) {
  int rank = (int)(r - j->ranks);
  int *fd = is_err ? &r->err_fd : &r->out_fd;
  char **buf = is_err ? &r->err_buf : &r->out_buf;
  size_t *len = is_err ? &r->err_len : &r->out_len;
  char chunk[65536];
  for (;;) {
    ssize_t n = read(*fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) { /* EOF or error: flush what is left */
      if (*len) emit(j, rank, is_err, *buf, *len);
      free(*buf);
      *buf = NULL;
      *len = 0;
      close(*fd);
      *fd = -1;
      return;
    }
    char *grown = realloc(*buf, *len + (size_t)n);
    if (!grown) return;
    *buf = grown;
    memcpy(*buf + *len, chunk, (size_t)n);
    *len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < *len; i++)
      if ((*buf)[i] == '\n') {
        emit(j, rank, is_err, *buf + start, i + 1 - start);
        start = i + 1;
      }
    memmove(*buf, *buf + start, *len - start);
    *len -= start;
  }
}

void procs_flush(job *j, rank_proc *r) {
  if (r->out_fd >= 0) procs_forward(j, r, 0);
  if (r->err_fd >= 0) procs_forward(j, r, 1);
}

void procs_signal(job *j, int sig) {
  if (j->pgid > 0) kill(-j->pgid, sig);
  for (int r = 0; r < j->n; r++) /* a rank that left the group still gets it */
    if (j->ranks[r].pid > 0 && !j->ranks[r].exited) kill(j->ranks[r].pid, sig);
}

static int failed_status(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

int procs_reap(job *j, int *first_failed) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (int r = 0; r < j->n; r++)
      if (j->ranks[r].pid == pid) {
        j->ranks[r].exited = 1;
        j->ranks[r].status = status;
        if (failed_status(status) && *first_failed < 0) *first_failed = r;
      }
  }
  int running = 0;
  for (int r = 0; r < j->n; r++) running += j->ranks[r].pid > 0 && !j->ranks[r].exited;
  return running;
}
