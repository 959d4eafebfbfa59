/* shm_segment.h: the named shared-memory segment behind a CPU group: its
 * name, which says whose job it belongs to, and mapping it. */
#ifndef FSDP_DIST_SHM_SEGMENT_H
#define FSDP_DIST_SHM_SEGMENT_H

#include <stddef.h>

/* "/fsdp.<PMIx namespace>.<pid>.<tag>" ('/' in the parts made '_'), so that
 * a launcher can find and remove its own job's segments (fsdprun does, when
 * the job ends, whatever way), and two jobs never share a name. */
void shm_segment_name(char *buf, size_t cap, const char *tag);
/* Opens (create: creates exclusively and sizes) and maps the segment; a
 * segment it created is removed again when that fails. */
int shm_segment_map(const char *segname, int create, size_t bytes, void **out);
/* FSDP_TEST_SHM_DIE = "RANK:WHERE" (tests only): world rank RANK exits at
 * once at that point of a group's creation ("created": the leader, right
 * after creating the segment; "mapped": any member, once it has it mapped). */
void shm_segment_test_die(int world_rank, const char *where);

#endif
