/* fsdprun_io.c: the ranks' output. Each rank's stdout and stderr arrive on
 * their own pipes and leave on fsdprun's stdout and stderr, one whole line
 * at a time, as "[rank] text". */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsdprun.h"

/* A line this long without a newline is shown in pieces, so that a rank
 * writing binary junk cannot make fsdprun's buffer grow without bound. */
#define MAX_LINE 65536

static void write_all(const job *j, int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) { /* our stdout was left non-blocking by whoever started us */
      /* a reader that stopped reading must not hold up --timeout */
      if (fsdprun_past_timeout(j)) return;
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      poll(&pfd, 1, 200);
      continue;
    }
    if (w <= 0) return; /* our reader is gone (EPIPE): drop the output, keep supervising */
    p += w;
    n -= (size_t)w;
  }
}

/* A line redrawn in place on the terminal: "\r\033[K" and the text, no
 * newline (a training run's progress line between its log lines; rank 0
 * draws it only when fsdprun's stdout is a terminal, FSDPRUN_TTY=1). It is
 * passed on as it comes, prefixed, and the next line shown replaces it. */
static const char redraw[] = "\r\033[K";
static int bar_open; /* a redrawn line is on the terminal, without its newline */

/* One write per line, so lines of different ranks never interleave. */
static void emit(job *j, int rank, int is_err, const char *line, size_t len) {
  if (j->rank0_only && rank != 0 && !is_err) return;
  char stack[4096];
  size_t need = len + 32 + sizeof redraw;
  char *buf = need <= sizeof stack ? stack : malloc(need);
  if (!buf) return;
  size_t at = 0;
  if (bar_open) { /* the line replaces the redrawn one */
    memcpy(buf, redraw, sizeof redraw - 1);
    at = sizeof redraw - 1;
    bar_open = 0;
  }
  if (len >= sizeof redraw - 1 && !memcmp(line, redraw, sizeof redraw - 1)) { /* (a log line after a redraw) */
    line += sizeof redraw - 1;
    len -= sizeof redraw - 1;
  }
  at += j->prefix ? (size_t)snprintf(buf + at, 32, "[%d] ", rank) : 0;
  memcpy(buf + at, line, len);
  at += len;
  if (!len || line[len - 1] != '\n') buf[at++] = '\n'; /* a partial last line */
  write_all(j, is_err ? 2 : 1, buf, at);
  if (buf != stack) free(buf);
}

/* Emits the complete lines in s->buf and keeps the rest. With --repl, rank
 * 0's stdout goes out as it comes, unprefixed: its prompt has no newline. */
static void emit_lines(job *j, int rank, int is_err, out_stream *s) {
  if (j->repl && rank == 0 && !is_err) {
    write_all(j, 1, s->buf, s->len);
    s->len = 0;
    return;
  }
  size_t start = 0;
  for (size_t i = 0; i < s->len; i++)
    if (s->buf[i] == '\n' || i + 1 - start == MAX_LINE) {
      emit(j, rank, is_err, s->buf + start, i + 1 - start);
      start = i + 1;
    }
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
  /* what is left, a redrawn line (stdout at a terminal): its last state now */
  if (!is_err && s->len > sizeof redraw - 1 && !memcmp(s->buf, redraw, sizeof redraw - 1) && isatty(1) &&
      (!j->rank0_only || rank == 0)) {
    size_t from = 0;
    for (size_t i = 0; i + sizeof redraw - 1 <= s->len; i++)
      if (!memcmp(s->buf + i, redraw, sizeof redraw - 1)) from = i + sizeof redraw - 1;
    char buf[MAX_LINE + 64];
    size_t at = sizeof redraw - 1;
    memcpy(buf, redraw, at);
    at += j->prefix ? (size_t)snprintf(buf + at, 32, "[%d] ", rank) : 0;
    memcpy(buf + at, s->buf + from, s->len - from);
    write_all(j, 1, buf, at + s->len - from);
    bar_open = 1;
    s->len = 0;
  }
}

static void close_stream(job *j, int rank, int is_err, out_stream *s) {
  if (s->len) emit_lines(j, rank, is_err, s);
  if (s->len) emit(j, rank, is_err, s->buf, s->len);
  free(s->buf);
  s->buf = NULL;
  s->len = 0;
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

void io_read(job *j, int rank, int is_err) {
  out_stream *s = is_err ? &j->ranks[rank].err : &j->ranks[rank].out;
  if (s->fd < 0) return;
  if (!s->buf && !(s->buf = malloc(MAX_LINE))) return;
  for (;;) {
    ssize_t n = read(s->fd, s->buf + s->len, MAX_LINE - s->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) { /* EOF: every writer is gone */
      close_stream(j, rank, is_err, s);
      return;
    }
    s->len += (size_t)n;
    emit_lines(j, rank, is_err, s);
  }
}

int io_open_streams(job *j) {
  int open = 0;
  for (int r = 0; r < j->n; r++) open += (j->ranks[r].out.fd >= 0) + (j->ranks[r].err.fd >= 0);
  return open;
}

/* At the end: what is still in the pipes, then the partial lines. */
void io_finish(job *j) {
  for (int r = 0; r < j->n; r++) {
    io_read(j, r, 0);
    io_read(j, r, 1);
    close_stream(j, r, 0, &j->ranks[r].out);
    close_stream(j, r, 1, &j->ranks[r].err);
  }
}
