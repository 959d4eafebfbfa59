/* shm_segment.c: naming and mapping a CPU group's segment (shm_segment.h). */
#include "shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../base/error.h"
#include "../fsdp_dist.h"

void shm_segment_name(char *buf, size_t cap, const char *tag) {
  fsdp_proc_info me;
  if (fsdp_init(&me) != FSDP_OK) snprintf(me.nspace, sizeof me.nspace, "none");
  /* a namespace that long would crowd out the tag: its start is still the job's */
  snprintf(buf, cap, "/fsdp.%.96s.%d.%s", me.nspace, (int)getpid(), tag);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') *p = '_';
}

int shm_segment_map(const char *segname, int create, size_t bytes, void **out) {
  int fd = shm_open(segname, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return fsdp_fail(FSDP_EIO, "shm_open('%s'): %s", segname, strerror(errno));
  if (create && ftruncate(fd, (off_t)bytes) < 0) {
    int e = errno;
    close(fd);
    shm_unlink(segname);
    return fsdp_fail(FSDP_EIO, "cannot size shared memory '%s' to %zu bytes: %s (is /dev/shm large enough?)",
                     segname, bytes, strerror(e));
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(segname);
    return fsdp_fail(FSDP_EIO, "mmap of shared memory '%s' (%zu bytes): %s", segname, bytes, strerror(errno));
  }
  *out = p;
  return FSDP_OK;
}

void shm_segment_test_die(int world_rank, const char *where) {
  const char *spec = getenv("FSDP_TEST_SHM_DIE");
  char want[64];
  snprintf(want, sizeof want, "%d:%s", world_rank, where);
  if (spec && !strcmp(spec, want)) _exit(3);
}
