/* ckpt_writer.c: one rank's checkpoint file, written by a background thread
 * so that training goes on while the bytes reach the disk (async save).
 * The file is the rank's segments back to back, each starting at a multiple
 * of 64 bytes (zero padding between), in the order given; each segment's
 * CRC-32C is computed from the caller's buffer as it is written. The file is
 * fsynced before the writer reports success: the index that names it is
 * only written after every rank's writer has finished. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../fsdp_io.h"

enum { SEG_ALIGN = 64, CHUNK = 8 << 20 };

struct fsdp_ckpt_writer {
  pthread_t thread;
  int n;
  const void *const *bufs;
  int64_t *bytes, *offsets, total, kill_after;
  uint32_t *crcs;
  int status;
  char error[512];
  atomic_int done;
  char path[];
};

static _Atomic int64_t fault_kill_after = -1;

void fsdp_ckpt_writer_fault(int64_t kill_after_bytes) { atomic_store(&fault_kill_after, kill_after_bytes); }

/* the test hook: the process dies (SIGKILL, as a crash or an OOM kill would
 * end it) once `written` passes the byte budget */
static void maybe_die(const fsdp_ckpt_writer *w, int64_t written) {
  if (w->kill_after >= 0 && written >= w->kill_after) raise(SIGKILL);
}

static void *run(void *arg) {
  fsdp_ckpt_writer *w = arg;
  int fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = FSDP_OK;
  if (fd < 0) rc = fsdp_fail(FSDP_EIO, "cannot create '%s': %s", w->path, strerror(errno));
  static const char zeros[SEG_ALIGN];
  int64_t pos = 0;
  for (int i = 0; rc == FSDP_OK && i < w->n; i++) {
    while (rc == FSDP_OK && pos < w->offsets[i]) { /* padding */
      ssize_t k = write(fd, zeros, (size_t)(w->offsets[i] - pos));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) rc = fsdp_fail(FSDP_EIO, "cannot write '%s': %s", w->path, strerror(errno));
      else pos += k;
    }
    const char *p = w->bufs[i];
    int64_t left = w->bytes[i];
    uint32_t crc = 0;
    while (rc == FSDP_OK && left > 0) {
      size_t len = (size_t)(left < CHUNK ? left : CHUNK);
      ssize_t k = write(fd, p, len);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) {
        rc = fsdp_fail(FSDP_EIO, "cannot write '%s': %s", w->path, strerror(errno));
        break;
      }
      crc = fsdp_crc32c(crc, p, (size_t)k);
      fsdp_heartbeat_pulse(); /* progress: a sync save's rank waits for this thread */
      p += k;
      left -= k;
      pos += k;
      maybe_die(w, pos);
    }
    w->crcs[i] = crc;
  }
  if (rc == FSDP_OK && fsync(fd) != 0) rc = fsdp_fail(FSDP_EIO, "cannot fsync '%s': %s", w->path, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && rc == FSDP_OK)
    rc = fsdp_fail(FSDP_EIO, "cannot close '%s': %s", w->path, strerror(errno));
  w->status = rc;
  if (rc != FSDP_OK) snprintf(w->error, sizeof w->error, "%s", fsdp_last_error());
  atomic_store(&w->done, 1);
  return NULL;
}

int fsdp_ckpt_writer_start(const char *path, int n, const void *const *bufs, const int64_t *bytes,
                           fsdp_ckpt_writer **out) {
  if (!path || !out || n < 0 || (n && (!bufs || !bytes))) return fsdp_fail(FSDP_EINVAL, "ckpt_writer_start: bad argument");
  *out = NULL;
  size_t plen = strlen(path) + 1;
  fsdp_ckpt_writer *w = calloc(1, sizeof *w + plen);
  if (!w) return fsdp_fail(FSDP_ENOMEM, "ckpt_writer: out of memory");
  memcpy(w->path, path, plen);
  size_t m = (size_t)(n ? n : 1);
  w->bytes = malloc(m * sizeof(int64_t));
  w->offsets = malloc(m * sizeof(int64_t));
  w->crcs = calloc(m, sizeof(uint32_t));
  if (!w->bytes || !w->offsets || !w->crcs) {
    free(w->bytes), free(w->offsets), free(w->crcs), free(w);
    return fsdp_fail(FSDP_ENOMEM, "ckpt_writer: out of memory");
  }
  int64_t pos = 0;
  for (int i = 0; i < n; i++) {
    if (bytes[i] < 0 || (bytes[i] && !bufs[i])) {
      free(w->bytes), free(w->offsets), free(w->crcs), free(w);
      return fsdp_fail(FSDP_EINVAL, "ckpt_writer: segment %d of '%s' has %lld bytes at %p", i, path, (long long)bytes[i],
                       bufs[i]);
    }
    pos = (pos + SEG_ALIGN - 1) / SEG_ALIGN * SEG_ALIGN;
    w->offsets[i] = pos;
    w->bytes[i] = bytes[i];
    pos += bytes[i];
  }
  w->n = n;
  w->bufs = bufs;
  w->total = pos;
  w->kill_after = atomic_exchange(&fault_kill_after, -1);
  if (pthread_create(&w->thread, NULL, run, w) != 0) {
    free(w->bytes), free(w->offsets), free(w->crcs), free(w);
    return fsdp_fail(FSDP_EIO, "ckpt_writer: cannot start a thread for '%s'", path);
  }
  *out = w;
  return FSDP_OK;
}

int fsdp_ckpt_writer_done(const fsdp_ckpt_writer *w) { return w ? atomic_load(&((fsdp_ckpt_writer *)w)->done) : 1; }

int fsdp_ckpt_writer_finish(fsdp_ckpt_writer *w, int64_t *offsets, uint32_t *crcs, int64_t *file_bytes) {
  if (!w) return fsdp_fail(FSDP_EINVAL, "ckpt_writer_finish: NULL writer");
  pthread_join(w->thread, NULL);
  int rc = w->status;
  if (rc == FSDP_OK) {
    if (offsets) memcpy(offsets, w->offsets, sizeof(int64_t) * (size_t)w->n);
    if (crcs) memcpy(crcs, w->crcs, sizeof(uint32_t) * (size_t)w->n);
    if (file_bytes) *file_bytes = w->total;
  } else {
    fsdp_fail(rc, "%s", w->error);
  }
  free(w->bytes), free(w->offsets), free(w->crcs), free(w);
  return rc;
}
