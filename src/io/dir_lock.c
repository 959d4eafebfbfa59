/* dir_lock.c: one job per directory. A checkpoint directory written by two
 * jobs at once (the same recipe started twice, or a scheduler requeuing a
 * job still running) would have its checkpoints replaced under the other's
 * feet. Rank 0 of a job takes an exclusive advisory lock on a file in the
 * directory for the job's life; the kernel releases it when the process
 * ends, however it ends, so a crash never leaves a stale lock. The file's
 * text says who holds it (written by the holder), for the refusal of a
 * second job, and what the last holder was (a restarted job finds its own
 * previous attempt there).
 *
 * fcntl record locks, not flock: they work on NFS too. Their catch: closing
 * any descriptor of the file in the holding process drops the lock, so
 * every read and write of a held lock goes through its own descriptor. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"
#include "../fsdp_io.h"

static int lock_fail(const char *what, const char *path) {
  return fsdp_fail(FSDP_EIO, "%s '%s': %s", what, path, strerror(errno));
}

/* the text of fd's file into buf (cap > 0), NUL-terminated */
static int read_text(int fd, char *buf, size_t cap) {
  size_t at = 0;
  while (at + 1 < cap) {
    ssize_t n = pread(fd, buf + at, cap - 1 - at, (off_t)at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fsdp_fail(FSDP_EIO, "dir lock: read: %s", strerror(errno));
    if (n == 0) break;
    at += (size_t)n;
  }
  buf[at] = '\0';
  return FSDP_OK;
}

int fsdp_dir_lock_take(const char *path, int *fd, char *holder, size_t cap) {
  if (!path || !fd) return fsdp_fail(FSDP_EINVAL, "dir lock: NULL argument");
  *fd = -1;
  if (holder && cap) holder[0] = '\0';
  int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f < 0) return lock_fail("dir lock: open", path);
  struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  while (fcntl(f, F_SETLK, &l) < 0) {
    if (errno == EINTR) continue;
    int busy = errno == EAGAIN || errno == EACCES;
    int e = errno;
    if (busy && holder && cap) read_text(f, holder, cap);
    close(f);
    errno = e;
    if (busy) return fsdp_fail(FSDP_EBUSY, "'%s' is locked by another process", path);
    return lock_fail("dir lock: lock", path);
  }
  *fd = f;
  return FSDP_OK;
}

int fsdp_dir_lock_read(int fd, char *buf, size_t cap) {
  if (fd < 0 || !buf || !cap) return fsdp_fail(FSDP_EINVAL, "dir lock: read: bad argument");
  return read_text(fd, buf, cap);
}

int fsdp_dir_lock_write(int fd, const char *text) {
  if (fd < 0 || !text) return fsdp_fail(FSDP_EINVAL, "dir lock: write: bad argument");
  size_t n = strlen(text), at = 0;
  if (ftruncate(fd, 0) < 0) return fsdp_fail(FSDP_EIO, "dir lock: truncate: %s", strerror(errno));
  while (at < n) {
    ssize_t w = pwrite(fd, text + at, n - at, (off_t)at);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return fsdp_fail(FSDP_EIO, "dir lock: write: %s", strerror(errno));
    at += (size_t)w;
  }
  if (fsync(fd) < 0) return fsdp_fail(FSDP_EIO, "dir lock: fsync: %s", strerror(errno));
  return FSDP_OK;
}

int fsdp_dir_lock_release(int fd) {
  if (fd < 0) return FSDP_OK;
  return close(fd) < 0 ? fsdp_fail(FSDP_EIO, "dir lock: close: %s", strerror(errno)) : FSDP_OK;
}
