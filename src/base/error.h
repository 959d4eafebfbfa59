/* error.h: the thread-local last error and the helpers that set it. */
#ifndef FSDP_BASE_ERROR_H
#define FSDP_BASE_ERROR_H

#include "../fsdp_base.h"

/* Sets the thread's last error message and returns status, so that callers
 * can write `return fsdp_fail(FSDP_EINVAL, "count %zu ...", n);`. */
int fsdp_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with context ("mesh 'dp': ...") and returns status. */
int fsdp_fail_context(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FSDP_CHECK(expr)            \
  do {                              \
    int fsdp_rc_ = (expr);          \
    if (fsdp_rc_ < 0) return fsdp_rc_; \
  } while (0)

#endif
