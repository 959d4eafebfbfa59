/* fsdprun.h: what the launcher's files share. One job, one process: the
 * state is a single struct owned by fsdprun.c. */
#ifndef FSDPRUN_H
#define FSDPRUN_H

#include <stddef.h>
#include <sys/types.h>

typedef struct rank_proc {
  pid_t pid;
  int out_fd, err_fd;      /* read ends of the rank's stdout/stderr pipes; -1 when closed */
  char *out_buf, *err_buf; /* partial lines */
  size_t out_len, err_len;
  int exited, status;      /* waitpid status once exited */
} rank_proc;

typedef struct job {
  int n;                   /* ranks */
  char **argv;             /* what each rank execs */
  char tmpdir[256];        /* PMIx server temp directory, removed at exit */
  char nspace[256];       /* PMIX_MAX_NSLEN + 1: the library reads the whole array */
  int prefix, rank0_only;
  double grace, timeout;
  rank_proc *ranks;
  pid_t pgid;              /* all ranks share one process group */
  int signal_pipe[2];      /* signal handlers and PMIx callbacks wake the loop */
} job;

/* fsdprun_pmix.c */
int pmix_server_start(job *j);
int pmix_job_register(job *j);
int pmix_rank_env(job *j, int rank, char ***env); /* malloc'ed, argv-style */
void pmix_server_stop(job *j);
/* A rank called PMIx_Abort: returns 1 and fills (rank, status, msg) once. */
int pmix_take_abort(int *rank, int *status, char *msg, size_t cap);

/* fsdprun_procs.c */
int procs_spawn(job *j);
void procs_forward(job *j, rank_proc *r, int is_err);
void procs_flush(job *j, rank_proc *r);
void procs_signal(job *j, int sig);
int procs_reap(job *j, int *first_failed); /* returns ranks still running */

void fsdprun_wake(job *j); /* async-signal-safe */
void rm_tree(const char *dir);

#endif
