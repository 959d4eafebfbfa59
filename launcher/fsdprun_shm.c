/* fsdprun_shm.c: removing the job's shared-memory segments when it ends.
 *
 * The ranks' CPU groups live in /dev/shm segments named
 * "fsdp.<namespace>.<pid>.<tag>" (src/dist/shm_segment.c). A group removes
 * its name once every member has mapped it, but a rank killed while a group
 * was being created (a peer that died first, a fence that timed out, our
 * own SIGTERM) leaves its segment: 16 MiB each. Once no rank runs, every
 * segment under this job's namespace is stale; other jobs' names differ. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "fsdprun.h"

void job_shm_sweep(const job *j) {
  char prefix[300];
  snprintf(prefix, sizeof prefix, "fsdp.%.96s.", j->nspace); /* as the ranks cut it */
  for (char *p = prefix; *p; p++)
    if (*p == '/') *p = '_';
  size_t len = strlen(prefix);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, len)) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    shm_unlink(name);
  }
  closedir(d);
}
