/* heartbeat.c: the rank's side of fsdprun's heartbeat (heartbeat.h). */
#include "heartbeat.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../fsdp_base.h"

static fsdp_heartbeat_slot *_Atomic mine; /* NULL: no fsdprun watching */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + 1; /* never 0 */
}

void fsdp_heartbeat_attach(int rank) {
  const char *path = getenv(FSDP_HEARTBEAT_ENV);
  if (!path || !*path || rank < 0 || atomic_load(&mine)) return;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return; /* nothing to beat into: the job is not watched */
  struct stat st;
  size_t need = ((size_t)rank + 1) * sizeof(fsdp_heartbeat_slot);
  void *p = fstat(fd, &st) == 0 && (size_t)st.st_size >= need
                ? mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return;
  fsdp_heartbeat_slot *s = (fsdp_heartbeat_slot *)p + rank;
  atomic_store(&s->step, -1);
  atomic_store(&s->beat_ns, now_ns());
  atomic_store(&mine, s);
}

void fsdp_heartbeat_pulse(void) {
  fsdp_heartbeat_slot *s = atomic_load_explicit(&mine, memory_order_relaxed);
  if (s) atomic_store_explicit(&s->beat_ns, now_ns(), memory_order_relaxed);
}

int fsdp_heartbeat(int64_t step) {
  fsdp_heartbeat_slot *s = atomic_load_explicit(&mine, memory_order_relaxed);
  if (s && step >= 0) atomic_store_explicit(&s->step, step, memory_order_relaxed);
  fsdp_heartbeat_pulse();
  return FSDP_OK;
}
