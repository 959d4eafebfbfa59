/* fsdprun: starts N local ranks of a job as a PMIx server, forwards their
 * output with a rank prefix, and ends the whole job when one rank fails.
 * This file: options and the order of start-up and exit (--help's text:
 * fsdprun_help.c).
 * `fsdprun --help` is the user's documentation; docs/LAUNCH.md says more. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsdprun.h"

#ifndef FSDP_HOST_PATH
#define FSDP_HOST_PATH "fsdp"
#endif

#define MAX_RANKS 4096

static job J;

/* ---- options ---- */

/* Prints "fsdprun: <message>" and the usage line; returns the usage exit code. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fsdprun: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n%s(fsdprun --help for more)\n", fsdprun_synopsis);
  return 2;
}

static int parse_seconds(const char *flag, const char *s, double *out) {
  char *end;
  double v = s ? strtod(s, &end) : -1;
  if (!s) return usage_error("%s expects seconds", flag);
  if (end == s || *end || !(v >= 0) || v > 1e7)
    return usage_error("%s expects seconds (a number >= 0), got '%s'", flag, s);
  *out = v;
  return 0;
}

/* PROGRAM as given, or found in PATH, like a shell would. */
static char *find_program(const char *name) {
  if (strchr(name, '/')) return access(name, X_OK) == 0 ? strdup(name) : NULL;
  const char *path = getenv("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *p = path;; p++) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    char *full;
    if (asprintf(&full, "%.*s%s%s", (int)len, p, len ? "/" : "", name) < 0) return NULL;
    struct stat st;
    if (access(full, X_OK) == 0 && stat(full, &st) == 0 && S_ISREG(st.st_mode)) return full;
    free(full);
    if (!colon) return NULL;
    p = colon;
  }
}

/* Splits "--opt=value"; otherwise the value is the next argument. */
static const char *option_value(char **argv, int argc, int *i, char *name, size_t cap) {
  const char *a = argv[*i], *eq = strchr(a, '=');
  if (a[1] == '-' && eq) {
    snprintf(name, cap, "%.*s", (int)(eq - a), a);
    return eq + 1;
  }
  snprintf(name, cap, "%s", a);
  if (!strcmp(a, "-n") || !strcmp(a, "--np") || !strcmp(a, "--host") || !strcmp(a, "--grace") ||
      !strcmp(a, "--timeout") || !strcmp(a, "--slots") || !strcmp(a, "--max-restarts") ||
      !strcmp(a, "--heartbeat-timeout") || !strcmp(a, "--ranks-per-gpu"))
    return ++*i < argc ? argv[*i] : NULL;
  if (!strncmp(a, "-n", 2) && a[2]) { /* -n4 */
    snprintf(name, cap, "-n");
    return a + 2;
  }
  return NULL;
}

/* GPUs this host shows: CUDA_VISIBLE_DEVICES when set, else /dev/nvidiaN. */
static int count_gpus(void) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis) {
    int n = 0;
    for (const char *p = vis; *p; p++)
      if (*p != ',' && (p == vis || p[-1] == ',')) n++;
    return n;
  }
  int n = 0;
  DIR *d = opendir("/dev");
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (!strncmp(e->d_name, "nvidia", 6) && e->d_name[6] >= '0' && e->d_name[6] <= '9') n++;
  if (d) closedir(d);
  return n;
}

/* Like mpirun: no more ranks than slots unless asked, so a typo in -n does
 * not start ranks until the memory is gone. */
static int check_slots(void) {
  char why[64] = "--slots";
  int slots = J.slots;
  if (J.ranks_per_gpu) {
    int gpus = count_gpus();
    if (gpus == 0)
      return usage_error("--ranks-per-gpu %d: this host shows no GPU (CUDA_VISIBLE_DEVICES, /dev/nvidiaN); the mode "
                         "puts several GPU ranks on each GPU there is",
                         J.ranks_per_gpu);
    if (!slots) {
      slots = gpus * J.ranks_per_gpu;
      snprintf(why, sizeof why, "%d GPU%s x --ranks-per-gpu %d", gpus, gpus == 1 ? "" : "s", J.ranks_per_gpu);
    }
  }
  if (!slots) {
    int gpus = count_gpus();
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    slots = gpus > 0 ? gpus : cores > 0 ? cores : 1;
    snprintf(why, sizeof why, gpus > 0 ? "its GPUs" : "its cores");
  }
  if (J.n <= slots || J.oversubscribe) return 0;
  usage_error("%d ranks, but this host has %d slot%s (%s). Give --oversubscribe to start more ranks than "
              "slots (or --slots N)",
              J.n, slots, slots == 1 ? "" : "s", why);
  return 1;
}

/* The fsdp rank host: where the build put it, else beside this fsdprun
 * (a build carried to another machine, an install moved elsewhere). */
static const char *rank_host(void) {
  static char beside[4096];
  if (access(FSDP_HOST_PATH, X_OK) == 0) return FSDP_HOST_PATH;
  ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 8);
  if (n <= 0) return FSDP_HOST_PATH;
  beside[n] = 0;
  char *slash = strrchr(beside, '/');
  if (!slash) return FSDP_HOST_PATH;
  strcpy(slash + 1, "fsdp");
  return access(beside, X_OK) == 0 ? beside : FSDP_HOST_PATH;
}

static int parse_args(int argc, char **argv) {
  const char *host = getenv("FSDPRUN_HOST");
  if (host && !host[0]) host = NULL;
  J.prefix = 1;
  J.grace = 60; /* a synchronous save of a large model takes a while */
  J.heartbeat_timeout = 300;
  J.break_at = -1;
  J.stdin_fwd = -1;
  J.epoll_fd = -1;
  int i = 1;
  for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
    char name[64];
    const char *val = option_value(argv, argc, &i, name, sizeof name);
    if (!strcmp(name, "--")) {
      i++;
      break;
    } else if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
      printf("%s%s", fsdprun_synopsis, fsdprun_help_text);
      exit(0);
    } else if (!strcmp(name, "--version")) {
      puts("fsdprun 0.1.0");
      exit(0);
    } else if (!strcmp(name, "-n") || !strcmp(name, "--np")) {
      char *end;
      if (!val) return usage_error("%s expects a number of ranks", name);
      long n = strtol(val, &end, 10);
      if (end == val || *end || n < 1) return usage_error("-n expects a positive integer, got '%s'", val);
      if (n > MAX_RANKS) return usage_error("-n: at most 4096 ranks, got '%s'", val);
      J.n = (int)n;
    } else if (!strcmp(name, "--host")) {
      if (!val || !val[0]) return usage_error("%s expects a program", name);
      host = val;
      i++; /* everything after PROGRAM is its own arguments */
      break;
    } else if (!strcmp(name, "--slots")) {
      char *end;
      long n = val ? strtol(val, &end, 10) : 0;
      if (!val || end == val || *end || n < 1 || n > MAX_RANKS)
        return usage_error("--slots expects a number of ranks from 1 to 4096, got '%s'", val ? val : "");
      J.slots = (int)n;
    } else if (!strcmp(name, "--max-restarts")) {
      char *end;
      long n = val ? strtol(val, &end, 10) : -1;
      if (!val || end == val || *end || n < 0 || n > 1000)
        return usage_error("--max-restarts expects a number from 0 to 1000, got '%s'", val ? val : "");
      J.max_restarts = (int)n;
    } else if (!strcmp(name, "--ranks-per-gpu")) {
      char *end;
      long n = val ? strtol(val, &end, 10) : 0;
      if (!val || end == val || *end || n < 1 || n > 64)
        return usage_error("--ranks-per-gpu expects a number of ranks per GPU from 1 to 64, got '%s'", val ? val : "");
      J.ranks_per_gpu = (int)n;
    } else if (!strcmp(name, "--oversubscribe") && !val) {
      J.oversubscribe = 1;
    } else if (!strcmp(name, "--no-prefix") && !val) {
      J.prefix = 0;
    } else if (!strcmp(name, "--rank0-only") && !val) {
      J.rank0_only = 1;
    } else if (!strcmp(name, "--repl") && !val) {
      J.repl = 1;
    } else if (!strcmp(name, "--break-at")) {
      char *end;
      if (!val) return usage_error("%s expects a step number", name);
      long b = strtol(val, &end, 10);
      if (end == val || *end || b < 0) return usage_error("--break-at expects a step number >= 0, got '%s'", val);
      J.break_at = b;
    } else if (!strcmp(name, "--grace")) {
      if (parse_seconds(name, val, &J.grace)) return 2;
    } else if (!strcmp(name, "--timeout")) {
      if (parse_seconds(name, val, &J.timeout)) return 2;
    } else if (!strcmp(name, "--heartbeat-timeout")) {
      if (parse_seconds(name, val, &J.heartbeat_timeout)) return 2;
    } else {
      return usage_error("unknown option '%s'", argv[i]);
    }
  }
  if (!J.n) return usage_error("how many ranks? give -n N");
  const char *over = getenv("FSDPRUN_OVERSUBSCRIBE");
  if (over && !strcmp(over, "1")) J.oversubscribe = 1;
  if (check_slots()) return 2;
  if (J.break_at >= 0 && !J.repl) return usage_error("--break-at needs --repl");
  if (!host) { /* the fsdp rank host runs FILE.lua */
    if (i >= argc) return usage_error("no job file: fsdprun -n N FILE.lua [args...]");
    if (access(argv[i], R_OK) < 0) {
      fprintf(stderr, "fsdprun: %s %s\n", argv[i], errno == ENOENT ? "not found" : strerror(errno));
      return 2;
    }
    host = rank_host();
    J.recipe = 1;
  }
  char *path = find_program(host);
  if (!path) {
    fprintf(stderr, "fsdprun: cannot run the rank program %s: %s\n", host,
            strchr(host, '/') ? strerror(errno) : "not found in PATH");
    return 2;
  }
  J.argv = calloc((size_t)(argc - i) + 2, sizeof(char *));
  if (!J.argv) return 1;
  J.argv[0] = path;
  for (int k = i; k < argc; k++) J.argv[k - i + 1] = argv[k];
  return 0;
}

/* ---- the temporary directory ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* With the job's /dev/shm segments: every exit path comes here, ranks gone. */
static void rm_tmpdir(void) {
  job_shm_sweep(&J);
  if (J.tmpdir[0]) nftw(J.tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  J.tmpdir[0] = 0;
}

static int make_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  snprintf(J.tmpdir, sizeof J.tmpdir, "%s/fsdprun.XXXXXX", base);
  if (!mkdtemp(J.tmpdir)) {
    fprintf(stderr, "fsdprun: cannot create a temporary directory under %s: %s\n", base, strerror(errno));
    J.tmpdir[0] = 0;
    return -1;
  }
  return 0;
}

/* ---- start-up and exit ---- */


/* Signals are read from a signalfd by the main loop, never handled
 * asynchronously. They are blocked before PMIx starts its thread so that
 * thread inherits the mask and never takes them. */
static int setup_signals(void) {
  signal(SIGPIPE, SIG_IGN); /* a rank dying mid-handshake: the library writes to a dead socket */
  signal(SIGCHLD, SIG_DFL); /* an inherited SIG_IGN would reap the ranks behind our back */
  sigset_t set;
  fsdprun_stop_signals(&set);
  sigaddset(&set, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &set, NULL) < 0) return -1;
  J.signal_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  return J.signal_fd < 0 ? -1 : 0;
}

/* After a failure the library's teardown can hang on dead connections, so
 * it is skipped: the process ends here, without exit handlers. */
static void quick_exit_code(int code) {
  fflush(stdout);
  fflush(stderr);
  rm_tmpdir();
  restart_if_due(&J, code);
  _exit(code);
}

/* Started with stdin, stdout or stderr closed, fsdprun's own pipes would get
 * those numbers and the ranks' output would go astray. */
static void open_std_fds(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd ? O_WRONLY : O_RDONLY) != fd) _exit(1);
}

int main(int argc, char **argv) {
  J.start = fsdprun_now();
  open_std_fds();
  int rc = parse_args(argc, argv);
  if (rc) return rc;
  if (restart_setup(&J, argv) < 0) return 1;
  if (J.ranks_per_gpu && J.attempt == 0)
    fprintf(stderr,
            "fsdprun: test mode --ranks-per-gpu %d: %d ranks share the GPUs, each rank its own NCCL host (NCCL_HOSTID), "
            "NCCL's traffic over sockets on the loopback: for checking multi-rank GPU code on few GPUs, far slower than "
            "real GPU ranks (docs/LAUNCH.md)\n",
            J.ranks_per_gpu, J.n);
  J.ranks = calloc((size_t)J.n, sizeof *J.ranks);
  if (!J.ranks || pipe2(J.wake_fd, O_CLOEXEC | O_NONBLOCK) < 0 || setup_signals() < 0) {
    fprintf(stderr, "fsdprun: cannot set up: %s\n", strerror(errno));
    return 1;
  }
  J.failed_rank = -1;
  for (int r = 0; r < J.n; r++) J.ranks[r].out.fd = J.ranks[r].err.fd = J.ranks[r].pidfd = -1;
  snprintf(J.nspace, sizeof J.nspace, "fsdprun-%d", (int)getpid());
  J.job_id = (long)getpid();
  procs_become_subreaper(); /* descendants that leave the ranks' group stay ours */
  if (make_tmpdir() < 0) return 1;
  if (heartbeat_open(&J) < 0) quick_exit_code(1);
  if (pmix_start(&J) < 0) quick_exit_code(1);
  /* procs_spawn stopping early (--timeout, a signal) is the supervisor's to report */
  if (pmix_register_job(&J) < 0 || procs_spawn(&J, pmix_rank_env) < 0) {
    procs_signal(&J, SIGKILL); /* the ranks already started */
    int ignored = -1;
    double when;
    while (procs_reap(&J, &ignored, &when)) usleep(10000);
    procs_release_leader(&J);
    quick_exit_code(1);
  }
  int code = job_supervise(&J);
  if (code != 0 || !pmix_all_finalized()) quick_exit_code(code);
  /* A clean run: every rank finalized, so the library's teardown is safe;
   * it still gets a deadline. */
  if (pmix_stop(&J, 10) < 0) {
    fprintf(stderr, "fsdprun: the PMIx server did not shut down within 10 s; leaving anyway\n");
    quick_exit_code(0);
  }
  rm_tmpdir();
  for (int r = 0; r < J.n; r++) J.ranks[r].pid = 0;
  free(J.argv[0]);
  free(J.argv);
  free(J.ranks);
  return 0;
}
