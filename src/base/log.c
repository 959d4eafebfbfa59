/* log.c: one line per message, written with a single write() so lines from
 * worker threads do not interleave. */
#include "log.h"
#include "../fsdp_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int log_level = -1;

static int level_from_env(void) {
  const char *v = getenv("FSDP_LOG");
  if (!v) return FSDP_LOG_WARN;
  if (!strcmp(v, "error")) return FSDP_LOG_ERROR;
  if (!strcmp(v, "info")) return FSDP_LOG_INFO;
  if (!strcmp(v, "debug")) return FSDP_LOG_DEBUG;
  return FSDP_LOG_WARN;
}

void fsdp_log_set_level(int level) { log_level = level; }

int fsdp_log_get_level(void) {
  if (log_level < 0) log_level = level_from_env();
  return log_level;
}

void fsdp_log(int level, const char *fmt, ...) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  if (level > fsdp_log_get_level()) return;
  char line[2048];
  int n = snprintf(line, sizeof line, "fsdp %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(2, line, (size_t)n);
  (void)w;
}
