/* fsdprun_heartbeat.c: --heartbeat-timeout. A rank that is alive but stuck
 * (stopped, or spinning outside any collective) would hold the job until a
 * peer's collective timed out (FSDP_COMM_TIMEOUT), or for ever outside one.
 * fsdprun makes a file of one slot per rank (src/base/heartbeat.h) in its
 * temporary directory and names it to the ranks (FSDPRUN_HEARTBEAT); each
 * rank beats into its slot as it makes progress, peers waiting for it in a
 * collective included, so the stuck rank is the one that goes silent. A
 * rank that never beat (not yet through fsdp_init, or a program that is
 * not the fsdp engine) is not watched. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../src/base/heartbeat.h"
#include "fsdprun.h"

int heartbeat_open(job *j) {
  if (j->heartbeat_timeout <= 0 || j->repl) return 0; /* --repl: a prompt waits for its user, silent */
  size_t bytes = (size_t)j->n * sizeof(fsdp_heartbeat_slot);
  char path[sizeof j->tmpdir + 16];
  snprintf(path, sizeof path, "%s/heartbeat", j->tmpdir);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  void *p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0) /* zeros: no rank has beaten */
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "fsdprun: cannot make the heartbeat file %s: %s\n", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  j->heartbeat = p;
  snprintf(j->heartbeat_env, sizeof j->heartbeat_env, "%s=%s", FSDP_HEARTBEAT_ENV, path);
  return 0;
}

double heartbeat_check_every(const job *j) {
  double t = j->heartbeat_timeout / 10;
  return t < 0.1 ? 0.1 : t > 1 ? 1 : t;
}

int heartbeat_stale(const job *j, int *rank, double *silent, long long *step) {
  if (!j->heartbeat) return 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + 1;
  int found = 0;
  for (int r = 0; r < j->spawned; r++) {
    const rank_proc *rp = &j->ranks[r];
    int64_t beat = atomic_load(&j->heartbeat[r].beat_ns);
    if (rp->pid <= 0 || rp->exited || beat == 0) continue;
    double quiet = (double)(now - beat) * 1e-9;
    if (quiet >= j->heartbeat_timeout && (!found || quiet > *silent)) { /* the longest silent is the cause */
      found = 1;
      *rank = r;
      *silent = quiet;
      *step = (long long)atomic_load(&j->heartbeat[r].step);
    }
  }
  return found;
}
