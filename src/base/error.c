/* error.c: thread-local last error. A message is kept per thread so that a
 * comm worker's failure never overwrites the caller's message mid-read. */
#include "error.h"
#include "../fsdp_base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FSDP_ERR_CAP 1024
static _Thread_local char last_error[FSDP_ERR_CAP];

const char *fsdp_last_error(void) { return last_error; }

void fsdp_clear_error(void) { last_error[0] = '\0'; }

int fsdp_fail(int status, const char *fmt, ...) {
  /* formatted aside first: an argument may be fsdp_last_error() itself */
  char msg[FSDP_ERR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  memcpy(last_error, msg, sizeof msg);
  return status;
}

int fsdp_fail_context(int status, const char *fmt, ...) {
  char prefix[FSDP_ERR_CAP], old[FSDP_ERR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  /* the prefix is kept whole; the old message is cut if needed */
  size_t n = strlen(prefix);
  if (n > FSDP_ERR_CAP - 3) n = FSDP_ERR_CAP - 3;
  memcpy(last_error, prefix, n);
  memcpy(last_error + n, ": ", 2);
  size_t room = FSDP_ERR_CAP - n - 3, m = strlen(old);
  if (m > room) m = room;
  memcpy(last_error + n + 2, old, m);
  last_error[n + 2 + m] = '\0';
  return status;
}

const char *fsdp_status_name(int status) {
  switch (status) {
    case FSDP_OK: return "FSDP_OK";
    case FSDP_EINVAL: return "FSDP_EINVAL";
    case FSDP_ENOMEM: return "FSDP_ENOMEM";
    case FSDP_EIO: return "FSDP_EIO";
    case FSDP_ECOMM: return "FSDP_ECOMM";
    case FSDP_ETIMEOUT: return "FSDP_ETIMEOUT";
    case FSDP_EPEER: return "FSDP_EPEER";
    case FSDP_EUNSUPPORTED: return "FSDP_EUNSUPPORTED";
    case FSDP_EDEVICE: return "FSDP_EDEVICE";
    case FSDP_ESTATE: return "FSDP_ESTATE";
    case FSDP_ELAUNCH: return "FSDP_ELAUNCH";
    case FSDP_ECORRUPT: return "FSDP_ECORRUPT";
    case FSDP_EBUSY: return "FSDP_EBUSY";
    default: return "FSDP_E?";
  }
}

const char *fsdp_version(void) { return "0.1.0"; }
