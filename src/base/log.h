/* log.h: leveled logging to stderr; level from FSDP_LOG (error|warn|info|debug). */
#ifndef FSDP_BASE_LOG_H
#define FSDP_BASE_LOG_H

#include "../fsdp_base.h"

void fsdp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FSDP_LOG_DEBUG_ON() (fsdp_log_get_level() >= FSDP_LOG_DEBUG)

#endif
