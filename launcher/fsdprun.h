/* fsdprun.h: what the launcher's files share. One job per process: the state
 * is a single struct, owned by fsdprun.c and passed to the others.
 *
 *   fsdprun.c        options, --help, the order of start-up and exit
 *   fsdprun_pmix.c   the PMIx server: namespace, clients, module callbacks
 *   fsdprun_procs.c  fork/exec of the ranks, reaping, signalling
 *   fsdprun_io.c     the ranks' output, line by line, with a rank prefix
 *   fsdprun_job.c    the supervising loop: failures, signals, timeout, stop
 *   fsdprun_restart.c  --max-restarts: the job started again after a failure
 *   fsdprun_shm.c    removing the job's /dev/shm segments when it ends
 *   fsdprun_heartbeat.c  --heartbeat-timeout: the ranks' beats, and who went silent */
#ifndef FSDPRUN_H
#define FSDPRUN_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../src/base/heartbeat.h"

/* One of a rank's output pipes and its unfinished last line. */
typedef struct out_stream {
  int fd; /* read end; -1 once closed */
  char *buf;
  size_t len;
} out_stream;

typedef struct rank_proc {
  pid_t pid;          /* 0 until forked */
  int pidfd;          /* -1: none */
  _Atomic int64_t ended_ns; /* when it ended (monotonic ns), stamped by the watcher thread; 0: not yet */
  int exited;         /* seen by waitid */
  int code, sig;      /* exit status, or the signal that killed it (sig > 0) */
  _Atomic int joined, finalized; /* PMIx_Init, PMIx_Finalize seen (the server's thread sets them) */
  int never_joined;   /* exited 0 without PMIx_Init while joined ranks ran: a failure */
  out_stream out, err;
} rank_proc;

typedef struct job {
  /* options */
  int n;
  char **argv;        /* what each rank execs; argv[0] is a path */
  int prefix, rank0_only;
  int repl;           /* --repl: rank 0's stdout passes through as it comes (prompts) */
  long break_at;      /* --break-at STEP, -1: none */
  double grace, timeout;
  int max_restarts;   /* --max-restarts N: restarts after a rank failed */
  int recipe;         /* the ranks run FSDP_HOST_PATH FILE.lua (no --host): a restart adds train.resume=auto */
  int slots;          /* --slots, else 0: the host's GPUs, or its cores */
  double heartbeat_timeout; /* --heartbeat-timeout SECONDS, 0: not watched */
  int oversubscribe;  /* --oversubscribe or FSDPRUN_OVERSUBSCRIBE=1: more ranks than slots */
  int ranks_per_gpu;  /* --ranks-per-gpu N (a test mode): N ranks on each GPU, each its own NCCL host; 0: off */
  long job_id;        /* fsdprun's pid: tells this job's NCCL host ids from another's */
  /* state */
  double start;       /* monotonic seconds when fsdprun started: --timeout counts from here */
  int spawned;        /* ranks started so far (fewer than n when --timeout or a signal came first) */
  int epoll_fd;       /* the ranks' pidfds, watched by a thread that stamps when each rank ends */
  char tmpdir[4096];  /* PMIx server temp directory, removed on every exit path */
  char nspace[256];   /* PMIX_MAX_NSLEN + 1: the library reads the whole array */
  rank_proc *ranks;
  pid_t pgid;         /* the ranks' process group: rank 0's pid */
  int wake_fd[2];     /* PMIx callbacks wake the loop through this pipe */
  int signal_fd;      /* signalfd for the stop signals and SIGCHLD */
  int stdin_fwd;      /* --repl from a terminal: our stdin goes to rank 0 through this pipe; -1 */
  int attempt;        /* 0: the first start; k: the k-th restart (--max-restarts) */
  int failed_rank;    /* the rank whose failure stopped the job; -1: none */
  char failure[160];  /* how it failed ("was killed by signal 9 (Killed)") */
  int failed_sig;     /* the signal it ended by (or exited 128 + it); 0: none */
  int stop_signal;    /* a signal to fsdprun stopped the job (never restarted); 0: none */
  fsdp_heartbeat_slot *heartbeat; /* one slot per rank, shared with them; NULL: not watched */
  char heartbeat_env[4200];       /* "FSDPRUN_HEARTBEAT=<tmpdir>/heartbeat" for the ranks */
} job;

/* fsdprun_pmix.c */
int pmix_start(job *j);
int pmix_register_job(job *j);
int pmix_rank_env(job *j, int rank, char ***env); /* malloc'ed, argv-style */
int pmix_all_finalized(void);
/* Tears the server down; gives up after `seconds` (returns -1). */
int pmix_stop(job *j, double seconds);
/* A rank called PMIx_Abort: returns 1 and fills (rank, status, msg, when), once. */
/* A rank's PMIx_Abort message, kept whole: a refusal names a recipe field,
 * two paths and what would do instead (512 bytes cut one mid-sentence). */
#define FSDPRUN_ABORT_MSG 4096
int pmix_take_abort(int *rank, int *status, char *msg, size_t cap, double *at);

/* fsdprun_procs.c */
/* Starts the ranks; stops early (returns 1, j->spawned < n) when --timeout
 * runs out or fsdprun is asked to stop meanwhile. rank_env gives a rank's
 * environment from the PMIx server (pmix_rank_env, handed in by main so
 * that procs and pmix do not call each other). */
typedef int (*fsdprun_rank_env_fn)(job *j, int rank, char ***env);
int procs_spawn(job *j, fsdprun_rank_env_fn rank_env);
/* Returns how many still run; *newly_failed: of the ranks that failed since
 * the last call, the first to end (by time), and *failed_at when it ended. */
int procs_reap(job *j, int *newly_failed, double *failed_at);
/* Stamps the ranks that have ended by now (any thread) */
void procs_stamp_ended(job *j);
/* Whether a rank ended at or before monotonic time t but is not reaped yet. */
int procs_ended_before(const job *j, double t);
int procs_running(const job *j);            /* started and not seen to end */
void procs_signal(job *j, int sig);        /* to the group and every live rank */
void procs_release_leader(job *j);         /* kill strays; reap rank 0, kept as a zombie to hold the group */
void procs_become_subreaper(void);

/* fsdprun_io.c */
void io_read(job *j, int rank, int is_err);  /* forward whatever is ready */
int io_open_streams(job *j);                 /* how many pipes are still open */
void io_finish(job *j);                      /* flush partial lines, close pipes */

/* fsdprun_job.c */
int job_supervise(job *j); /* returns fsdprun's exit code */

/* fsdprun_restart.c */
/* After the options: takes over the state a restarted fsdprun was given
 * (the attempt, the first start's time) and tells the ranks the attempt. */
int restart_setup(job *j, char **argv);
/* On the way out with `code`: if a rank's failure ended the job and restarts
 * are left, waits the back-off and execs fsdprun again (returns only when it
 * does not restart, or exits 128+K on signal K during the back-off). */
void restart_if_due(job *j, int code);

/* fsdprun_shm.c: once no rank runs (every exit path, before a restart too) */
void job_shm_sweep(const job *j);

/* fsdprun_heartbeat.c */
int heartbeat_open(job *j); /* after the temporary directory exists; nothing when the timeout is 0 */
double heartbeat_check_every(const job *j);
/* The running rank silent longest, if past the timeout: 1 and its rank, the
 * silence (s) and the last step it reported (-1: none). */
int heartbeat_stale(const job *j, int *rank, double *silent, long long *step);

/* fsdprun_util.c: the helpers every launcher file calls (a leaf) */
double fsdprun_now(void);  /* monotonic seconds */
/* The signals that stop the job (the ranks finish their step and save):
 * SIGINT, SIGTERM, SIGHUP, SIGUSR1. */
void fsdprun_stop_signals(sigset_t *set);
int fsdprun_past_timeout(const job *j);
void fsdprun_wake(job *j); /* safe from any thread */
void describe_end(const rank_proc *r, char *buf, size_t cap);

/* fsdprun_help.c: the usage line and the --help text */
extern const char *const fsdprun_synopsis;
extern const char *const fsdprun_help_text;

#endif
