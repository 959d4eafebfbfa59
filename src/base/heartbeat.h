/* heartbeat.h: the page through which ranks tell fsdprun they are alive
 * (fsdprun --heartbeat-timeout, docs/LAUNCH.md). fsdprun creates a file of
 * one slot per rank in its temporary directory and names it to the ranks in
 * FSDPRUN_HEARTBEAT; this header is the layout both sides map.
 *
 * A beat is progress, never a timer: the trainer beats at every step (with
 * the step's number), and the library beats at every collective, while a
 * rank waits in one for its peers, and while it reads or writes a file. A rank
 * stopped (SIGSTOP), or spinning outside the library, goes silent; the
 * peers waiting for it in a collective keep beating, so the stale one is
 * the one to blame. Nothing beats from a thread of its own. */
#ifndef FSDP_BASE_HEARTBEAT_H
#define FSDP_BASE_HEARTBEAT_H

#include <stdatomic.h>
#include <stdint.h>

#define FSDP_HEARTBEAT_ENV "FSDPRUN_HEARTBEAT"

typedef struct fsdp_heartbeat_slot {
  _Atomic int64_t beat_ns; /* CLOCK_MONOTONIC ns of the last beat, + 1; 0: never (not watched yet) */
  _Atomic int64_t step;    /* the last step the rank reported; -1: none yet */
  char pad[48];            /* one cache line per rank */
} fsdp_heartbeat_slot;

_Static_assert(sizeof(fsdp_heartbeat_slot) == 64, "one heartbeat slot per cache line");

/* Rank side (src/base/heartbeat.c). attach maps this rank's slot when
 * FSDPRUN_HEARTBEAT is set (fsdp_init calls it); pulse beats without a
 * step, from wherever waiting or I/O makes progress; both are no-ops
 * unattached. */
void fsdp_heartbeat_attach(int rank);
void fsdp_heartbeat_pulse(void);

#endif
