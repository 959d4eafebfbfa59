/* arrival.h: which ranks reached fsdp_init, so that a fence that times out
 * can name the ranks that never got that far (boot.c). */
#ifndef FSDP_ARRIVAL_H
#define FSDP_ARRIVAL_H

#include <pmix.h>
#include <stddef.h>

/* Called by fsdp_init under a PMIx server: publishes this rank's arrival. */
void fsdp_arrival_announce(void);

/* The ranks of me's job (size of them; this one is rank) whose arrival did
 * not come within a few seconds, as "2, 5-7" into out ("": every rank's
 * came). 0 when nothing could be asked (out of memory). */
int fsdp_arrival_missing(const pmix_proc_t *me, int rank, int size, char *out, size_t cap);

#endif
