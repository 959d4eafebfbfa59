/* fsdprun_procs.c: starting the ranks, reaping them, signalling them.
 *
 * All ranks share one process group led by rank 0, so one kill() reaches
 * whatever they started too. Rank 0 is reaped last (waitid with WNOWAIT
 * reads its status without reaping): while its zombie exists the group's
 * id cannot be reused, so signalling the group is always safe.
 *
 * A descendant can leave the group (setsid, a daemon). fsdprun is a child
 * subreaper, so such a process becomes fsdprun's child when its parent
 * dies; those "strays" are found in /proc and signalled and reaped like
 * the ranks.
 *
 * Which rank ended first: a thread waits on the ranks' pidfds (epoll) and
 * stamps each rank's end as it happens, so the order is known even when
 * several ended before the main loop looked. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsdprun.h"

extern char **environ;

static void *watch_ends(void *arg); /* the thread that stamps the ranks' ends */

/* The launcher's own PMIx variables (from an outer launcher, or our server's
 * settings other than PMIX_MCA_*) must not leak into a rank: setup_fork
 * provides the right ones. */
static int inherited(const char *kv) {
  if (!strncmp(kv, "FSDPRUN=", 8) || !strncmp(kv, "FSDPRUN_TTY=", 12) || !strncmp(kv, "FSDPRUN_RANKS_PER_GPU=", 22) ||
      !strncmp(kv, FSDP_HEARTBEAT_ENV "=", sizeof FSDP_HEARTBEAT_ENV))
    return 0;
  return strncmp(kv, "PMIX_", 5) || !strncmp(kv, "PMIX_MCA_", 9);
}

/* NCCL settings the --ranks-per-gpu mode gives each rank when the user's
 * environment has none: sockets on the loopback, no InfiniBand, no
 * multi-node NVLink (one GPU is no fabric). NCCL_HOSTID is always the
 * mode's own: it is what makes NCCL take each rank for a host of its own
 * (two ranks with one host id on one GPU: "Duplicate GPU detected"). */
static const char *const emulated_nccl_env[] = {"NCCL_SOCKET_IFNAME=lo", "NCCL_IB_DISABLE=1", "NCCL_MNNVL_ENABLE=0",
                                                "NCCL_NET=Socket"};

static int in_environ(const char *kv) {
  size_t n = (size_t)(strchr(kv, '=') - kv) + 1;
  for (char **e = environ; *e; e++)
    if (!strncmp(*e, kv, n)) return 1;
  return 0;
}

/* environ (filtered) + the rank's PMIx variables + FSDPRUN=1 +
 * FSDPRUN_TTY=1 when fsdprun's stdout is a terminal (the ranks' is a pipe:
 * this tells rank 0 it may draw a progress bar), built before
 * fork: after fork only async-signal-safe calls are allowed (the PMIx
 * progress thread may hold the malloc lock). Pointers are borrowed (the
 * static buffers hold one rank's values until its fork). */
static char **rank_envp(const job *j, int rank, char **pmix_env) {
  static char break_at[48], per_gpu[48], host_id[64];
  size_t n = 0, k = 0;
  for (char **e = environ; *e; e++) n++;
  for (char **e = pmix_env; *e; e++) n++;
  size_t extra = sizeof emulated_nccl_env / sizeof *emulated_nccl_env;
  char **envp = calloc(n + 8 + extra, sizeof *envp);
  if (!envp) return NULL;
  for (char **e = environ; *e; e++)
    if (inherited(*e) && !(j->ranks_per_gpu && !strncmp(*e, "NCCL_HOSTID=", 12))) envp[k++] = *e;
  for (char **e = pmix_env; *e; e++) envp[k++] = *e;
  envp[k++] = "FSDPRUN=1";
  if (isatty(1)) envp[k++] = "FSDPRUN_TTY=1";
  if (j->heartbeat) envp[k++] = (char *)j->heartbeat_env;
  if (j->ranks_per_gpu) { /* the trainer reads FSDPRUN_RANKS_PER_GPU: ranks sharing a GPU are meant */
    snprintf(per_gpu, sizeof per_gpu, "FSDPRUN_RANKS_PER_GPU=%d", j->ranks_per_gpu);
    snprintf(host_id, sizeof host_id, "NCCL_HOSTID=fsdprun-%ld-rank%d", j->job_id, rank);
    envp[k++] = per_gpu;
    envp[k++] = host_id;
    for (size_t i = 0; i < extra; i++)
      if (!in_environ(emulated_nccl_env[i])) envp[k++] = (char *)emulated_nccl_env[i];
  }
  if (j->repl) { /* the trainer's prompt (lua/fsdp/repl.lua) */
    envp[k++] = "FSDP_REPL=1";
    if (j->break_at >= 0) {
      snprintf(break_at, sizeof break_at, "FSDP_BREAK_AT=%ld", j->break_at);
      envp[k++] = break_at;
    }
  }
  envp[k] = NULL;
  return envp;
}

static void put(const char *s) {
  ssize_t w = write(2, s, strlen(s));
  (void)w;
}

/* In the child: only async-signal-safe calls from here to exec. */
static void child_exec(job *j, int rank, char **envp, int in_fd, int out_w, int err_w, pid_t parent) {
  setpgid(0, rank == 0 ? 0 : j->pgid); /* the parent does it too: whichever runs first */
  /* If fsdprun dies without cleaning up (SIGKILL), the rank goes too. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
  /* Ignored signals and the signal mask survive exec: give the rank the
   * defaults (fsdprun ignores SIGPIPE and blocks the signals it reads). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGPIPE, &dfl, NULL);
  /* the stop signals too: fsdprun passes the one it got on (a background
   * job's shell had SIGINT ignored, which would leave a rank deaf to it) */
  sigaction(SIGINT, &dfl, NULL);
  sigaction(SIGTERM, &dfl, NULL);
  sigaction(SIGHUP, &dfl, NULL);
  sigaction(SIGUSR1, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (dup2(in_fd, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(127);
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC); /* nothing of the server's leaks into the rank */
  execve(j->argv[0], j->argv, envp);
  put("fsdprun: cannot start ");
  put(j->argv[0]);
  put(": ");
  const char *why = strerrordesc_np(errno); /* unlike strerror, no locale lookup */
  put(why ? why : "error");
  put("\n");
  _exit(127);
}

static int spawn_one(job *j, int r, int null_fd, fsdprun_rank_env_fn rank_env) {
  rank_proc *rp = &j->ranks[r];
  char **pmix_env = NULL, **envp = NULL;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, rc = -1;
  if (rank_env(j, r, &pmix_env) < 0) goto done;
  if (!(envp = rank_envp(j, r, pmix_env))) goto done;
  if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
    fprintf(stderr, "fsdprun: cannot make pipes for rank %d: %s%s\n", r, strerror(errno),
            errno == EMFILE ? " (too many ranks for `ulimit -n`?)" : "");
    goto done;
  }
  /* Rank 0 reads fsdprun's stdin, unless that is a terminal: a rank in its
   * own process group reading the terminal would be stopped (SIGTTIN). */
  int in_fd = r == 0 && !isatty(0) ? 0 : null_fd;
  int fwd[2] = {-1, -1};
  if (r == 0 && j->repl && isatty(0)) { /* --repl at a terminal: we read it and pass it on */
    if (pipe2(fwd, O_CLOEXEC) < 0) {
      fprintf(stderr, "fsdprun: cannot make rank 0's input pipe: %s\n", strerror(errno));
      goto done;
    }
    in_fd = fwd[0];
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "fsdprun: cannot fork rank %d: %s\n", r, strerror(errno));
    if (fwd[0] >= 0) close(fwd[0]), close(fwd[1]);
    goto done;
  }
  if (pid == 0) child_exec(j, r, envp, in_fd, out[1], err[1], parent);
  if (fwd[0] >= 0) {
    close(fwd[0]);
    j->stdin_fwd = fwd[1];
  }
  if (r == 0) j->pgid = pid;
  setpgid(pid, j->pgid);
  rp->pid = pid;
  rp->pidfd = (int)syscall(SYS_pidfd_open, pid, 0); /* -1 (old kernel): reaped in rank order */
  if (rp->pidfd >= 0) {
    fcntl(rp->pidfd, F_SETFD, FD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)r};
    if (j->epoll_fd < 0 || epoll_ctl(j->epoll_fd, EPOLL_CTL_ADD, rp->pidfd, &ev) < 0) {
      close(rp->pidfd);
      rp->pidfd = -1;
    }
  }
  rp->out.fd = out[0];
  rp->err.fd = err[0];
  out[0] = err[0] = -1;
  fcntl(rp->out.fd, F_SETFL, O_NONBLOCK);
  fcntl(rp->err.fd, F_SETFL, O_NONBLOCK);
  rc = 0;
done:
  for (int k = 0; k < 2; k++) {
    if (out[k] >= 0) close(out[k]);
    if (err[k] >= 0) close(err[k]);
  }
  if (pmix_env) {
    for (char **e = pmix_env; *e; e++) free(*e);
    free(pmix_env);
  }
  free(envp);
  return rc;
}

int procs_spawn(job *j, fsdprun_rank_env_fn rank_env) {
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    fprintf(stderr, "fsdprun: /dev/null: %s\n", strerror(errno));
    return -1;
  }
  fflush(NULL); /* nothing buffered gets written twice */
  j->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  pthread_t watcher; /* runs until fsdprun exits: it only reads the ranks' pidfds */
  if (j->epoll_fd >= 0 && pthread_create(&watcher, NULL, watch_ends, j) == 0)
    pthread_detach(watcher);
  else if (j->epoll_fd >= 0)
    close(j->epoll_fd), j->epoll_fd = -1;
  sigset_t stop_sigs, pending;
  fsdprun_stop_signals(&stop_sigs);
  /* tests: each fork made slow, as on a host short of memory */
  const char *slow = getenv("FSDPRUN_TEST_SLOW_FORK_MS");
  long slow_ms = slow ? strtol(slow, NULL, 10) : 0;
  int rc = 0;
  for (int r = 0; r < j->n && rc == 0; r++) {
    /* --timeout or a stop request while starting: the supervisor reports it */
    sigpending(&pending);
    sigandset(&pending, &pending, &stop_sigs);
    if (fsdprun_past_timeout(j) || !sigisemptyset(&pending)) {
      rc = 1;
      break;
    }
    if (slow_ms > 0) usleep((useconds_t)slow_ms * 1000);
    rc = spawn_one(j, r, null_fd, rank_env);
    if (rc == 0) j->spawned = r + 1;
  }
  close(null_fd);
  return rc;
}

/* A pid that is one of our ranks and not yet reaped (else it may be reused). */
static int is_rank(job *j, pid_t pid) {
  for (int r = 0; r < j->n; r++)
    if (j->ranks[r].pid == pid && (!j->ranks[r].exited || r == 0)) return 1;
  return 0;
}

/* fsdprun's children that are not ranks; up to cap of them. Orphans are
 * adopted by some thread of ours, so every thread's list is read. */
static int strays(job *j, pid_t *out, int cap) {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < cap) {
    if (e->d_name[0] == '.') continue;
    char path[300];
    snprintf(path, sizeof path, "/proc/self/task/%s/children", e->d_name);
    FILE *f = fopen(path, "re");
    if (!f) continue;
    long pid;
    while (n < cap && fscanf(f, "%ld", &pid) == 1)
      if (!is_rank(j, (pid_t)pid)) out[n++] = (pid_t)pid;
    fclose(f);
  }
  closedir(d);
  return n;
}

void procs_become_subreaper(void) { prctl(PR_SET_CHILD_SUBREAPER, 1); }

static int64_t now_ns(void) { return (int64_t)(fsdprun_now() * 1e9) + 1; /* never 0 */ }

/* The first stamp wins: the watcher's, or the reaper's if it looked first. */
static void stamp_end(rank_proc *rp) {
  int64_t none = 0;
  atomic_compare_exchange_strong(&rp->ended_ns, &none, now_ns());
}

/* Stamps the ranks whose pidfd is ready, in the order they became ready
 * (epoll's ready list keeps it), and stops watching them. Under a lock, so
 * that the watcher and the reaper never stamp out of that order. */
static pthread_mutex_t stamping = PTHREAD_MUTEX_INITIALIZER;
static int stamp_ready(job *j) {
  struct epoll_event ev[64];
  int got, total = 0;
  pthread_mutex_lock(&stamping);
  while (j->epoll_fd >= 0 && (got = epoll_wait(j->epoll_fd, ev, 64, 0)) > 0) {
    for (int k = 0; k < got; k++) {
      rank_proc *rp = &j->ranks[ev[k].data.u32];
      stamp_end(rp);
      epoll_ctl(j->epoll_fd, EPOLL_CTL_DEL, rp->pidfd, NULL);
    }
    total += got;
  }
  pthread_mutex_unlock(&stamping);
  return total;
}

/* A process whose threads are still exiting shows as a zombie (what a peer
 * watching it goes by: src/dist/shm_sync.c) before its pidfd is ready. */
static int is_zombie(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

void procs_stamp_ended(job *j) {
  stamp_ready(j);
  for (int r = 0; r < j->n; r++)
    if (j->ranks[r].pid > 0 && !atomic_load(&j->ranks[r].ended_ns) && is_zombie(j->ranks[r].pid)) stamp_end(&j->ranks[r]);
}

int procs_ended_before(const job *j, double t) {
  for (int r = 0; r < j->n; r++) {
    int64_t ns = atomic_load(&j->ranks[r].ended_ns);
    if (ns && !j->ranks[r].exited && (double)(ns - 1) * 1e-9 <= t) return 1;
  }
  return 0;
}

/* The watcher thread: stamps each rank's end as it happens, wakes the main loop. */
static void *watch_ends(void *arg) {
  job *j = arg;
  for (;;) {
    struct pollfd pfd = {.fd = j->epoll_fd, .events = POLLIN};
    if (poll(&pfd, 1, -1) < 0 && errno != EINTR) return NULL;
    if (stamp_ready(j)) fsdprun_wake(j);
  }
}

/* Reaps rank r if it ended (rank 0: only reads its status); 1 if it did. */
static int reap_one(job *j, int r) {
  rank_proc *rp = &j->ranks[r];
  if (rp->pid <= 0 || rp->exited) return 0;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int flags = WEXITED | WNOHANG | (r == 0 ? WNOWAIT : 0);
  if (waitid(P_PID, (id_t)rp->pid, &si, flags) < 0) {
    if (errno != ECHILD) return 0; /* EINTR: look again next time */
    si.si_code = CLD_EXITED;        /* already reaped by someone else: status unknown */
    si.si_status = 255;
  } else if (si.si_pid == 0) {
    return 0;
  }
  rp->exited = 1;
  stamp_end(rp); /* no pidfd, or the watcher has not run yet */
  if (si.si_code == CLD_EXITED)
    rp->code = si.si_status;
  else
    rp->sig = si.si_status;
  return 1;
}

int procs_running(const job *j) {
  int running = 0;
  for (int r = 0; r < j->n; r++) running += j->ranks[r].pid > 0 && !j->ranks[r].exited;
  return running;
}

/* A rank that ended with status 0 without ever calling PMIx_Init (a
 * recipe that called os.exit before fsdp_init) while ranks that did are
 * still running: they will wait for it at their first fence until the
 * comm timeout. It fails the job now instead. (Not a rank that joined and
 * left: its peers' fence fails at once, naming it.) */
static int left_others_waiting(const job *j, int r) {
  if (atomic_load(&j->ranks[r].joined)) return 0;
  for (int o = 0; o < j->n; o++)
    if (o != r && j->ranks[o].pid > 0 && !j->ranks[o].exited && atomic_load(&j->ranks[o].joined) &&
        !atomic_load(&j->ranks[o].finalized))
      return 1;
  return 0;
}

int procs_reap(job *j, int *newly_failed, double *failed_at) {
  pid_t stray[64];
  for (int k = 0, ns = strays(j, stray, 64); k < ns; k++) waitpid(stray[k], NULL, WNOHANG);
  stamp_ready(j); /* ends the watcher has not stamped yet, in their order */
  int running = 0;
  int64_t first = 0;
  for (int r = 0; r < j->n; r++) {
    rank_proc *rp = &j->ranks[r];
    int ended = reap_one(j, r);
    /* (a rank that ended before any other joined fails once one has) */
    if (rp->exited && !rp->code && !rp->sig && !rp->never_joined && left_others_waiting(j, r))
      rp->never_joined = ended = 1;
    if (ended && (rp->code || rp->sig || rp->never_joined)) {
      int64_t t = atomic_load(&rp->ended_ns);
      if (*newly_failed < 0 || t < first) *newly_failed = r, first = t;
    }
    if (rp->pid > 0 && !rp->exited) running++;
  }
  if (*newly_failed >= 0) *failed_at = (double)(first - 1) * 1e-9;
  return running;
}

void procs_signal(job *j, int sig) {
  if (j->pgid > 0) kill(-j->pgid, sig);
  /* a rank that left the group still gets it, but only once: a second
   * SIGTERM ends a rank at once instead of letting it save (stop_signal.c) */
  for (int r = 0; r < j->n; r++)
    if (j->ranks[r].pid > 0 && !j->ranks[r].exited && (j->pgid <= 0 || getpgid(j->ranks[r].pid) != j->pgid))
      kill(j->ranks[r].pid, sig);
  pid_t stray[64];
  for (int k = 0, ns = strays(j, stray, 64); k < ns; k++) kill(stray[k], sig);
}

static void procs_sweep(job *j) {
  pid_t stray[64];
  /* killing one may orphan its own children onto us: look again */
  for (int round = 0, ns; round < 100 && (ns = strays(j, stray, 64)) > 0; round++)
    for (int k = 0; k < ns; k++) {
      kill(stray[k], SIGKILL);
      waitpid(stray[k], NULL, 0);
    }
}

void procs_release_leader(job *j) {
  procs_sweep(j);
  rank_proc *r0 = &j->ranks[0];
  if (r0->pid > 0 && r0->exited) waitpid(r0->pid, NULL, 0);
}
