/* test_pool: the full-unit buffer pool (src/shard/pool.c) with slots of
 * different sizes: which slot a request takes (the smallest free one that
 * fits, the lowest index among equals), deferral when none fits, the
 * bound, and that every slot is as big as asked (written to its last byte,
 * which AddressSanitizer checks). The reference: the expected slot of each
 * request, worked out by hand below. And that of two free slots of one size
 * a request takes the one whose last user has finished, not one still
 * being read by a collective in flight, unless the slots are NCCL windows. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "device/device_impl.h"
#include "fsdp.h"
#include "shard/pool.h"

static void test_pick(void) {
  int64_t b[] = {400, 160, 160, 90};
  uint8_t t[] = {0, 0, 0, 0};
  CHECK(fsdp_pool_pick(4, b, t, 120) == 1); /* 160 fits best; 1 before 2 */
  CHECK(fsdp_pool_pick(4, b, t, 90) == 3);
  CHECK(fsdp_pool_pick(4, b, t, 161) == 0);
  CHECK(fsdp_pool_pick(4, b, t, 401) == -1);
  t[1] = 1;
  CHECK(fsdp_pool_pick(4, b, t, 120) == 2);
  t[2] = 1;
  CHECK(fsdp_pool_pick(4, b, t, 120) == 0); /* only the big one is free and fits */
  t[0] = 1;
  CHECK(fsdp_pool_pick(4, b, t, 120) == -1); /* 90 is free but too small */
  CHECK(fsdp_pool_pick(4, b, t, 0) == 3);
}

static void test_pool(void) {
  int64_t b[] = {400, 160, 160};
  fsdp_pool *p = NULL;
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 3, b, &p));
  fsdp_stream *s = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &s));
  int slot[4];
  void *buf[4];
  CHECK_OK(fsdp_pool_acquire(p, 120, s, &slot[0], &buf[0]));
  CHECK_OK(fsdp_pool_acquire(p, 120, s, &slot[1], &buf[1]));
  CHECK_OK(fsdp_pool_acquire(p, 120, s, &slot[2], &buf[2]));
  CHECK(slot[0] == 1 && slot[1] == 2 && slot[2] == 0);
  CHECK(buf[0] != buf[1] && buf[1] != buf[2] && buf[0] != buf[2]);
  memset(buf[2], 1, 400), memset(buf[0], 2, 160), memset(buf[1], 3, 160); /* each slot is as big as asked */
  CHECK(fsdp_pool_live(p) == 3 && fsdp_pool_peak(p) == 3);
  CHECK(fsdp_pool_acquire(p, 10, s, &slot[3], &buf[3]) == FSDP_DEFERRED); /* at the bound */
  CHECK_OK(fsdp_pool_give_back(p, slot[0], s));
  CHECK(fsdp_pool_acquire(p, 300, s, &slot[3], &buf[3]) == FSDP_DEFERRED); /* a small slot is free, too small */
  CHECK_OK(fsdp_pool_acquire(p, 100, s, &slot[3], &buf[3]));
  CHECK(slot[3] == 1 && buf[3] == buf[0]);
  CHECK_FAILS(fsdp_pool_acquire(p, 401, s, &slot[3], &buf[3]), FSDP_EINVAL, "largest buffer holds 400");
  CHECK_FAILS(fsdp_pool_give_back(p, 7, s), FSDP_ESTATE, "not taken");
  CHECK_OK(fsdp_stream_synchronize(s));
  CHECK_OK(fsdp_pool_destroy(p));
  CHECK_OK(fsdp_stream_destroy(s));
  int64_t none[] = {-1};
  CHECK_FAILS(fsdp_pool_create(FSDP_CPU, 1, none, &p), FSDP_EINVAL, "-1 bytes");
  CHECK_FAILS(fsdp_pool_create(FSDP_CPU, 0, b, &p), FSDP_EINVAL, "at least 1");
}

/* a task that holds its stream until *gate is set */
static int hold(void *gate) {
  while (!atomic_load((_Atomic int *)gate)) usleep(1000);
  return 0;
}

/* window: NULL, or a comm to register the pool with in window mode */
static void ready_slot_case(fsdp_comm *window) {
  int64_t b[] = {256, 256};
  fsdp_pool *p = NULL;
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, b, &p));
  if (window) CHECK_OK(fsdp_pool_register(p, window, FSDP_REG_WINDOW));
  fsdp_stream *user = NULL, *busy = NULL;
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &user));
  CHECK_OK(fsdp_stream_create(FSDP_CPU, &busy));
  int slot[3];
  void *buf[3];
  CHECK_OK(fsdp_pool_acquire(p, 200, user, &slot[0], &buf[0]));
  CHECK_OK(fsdp_pool_acquire(p, 200, user, &slot[1], &buf[1]));
  CHECK(slot[0] == 0 && slot[1] == 1);
  _Atomic int gate = 0;
  CHECK_OK(fsdp_cpu_stream_enqueue(busy, hold, (void *)&gate, NULL));
  CHECK_OK(fsdp_pool_give_back(p, slot[1], user)); /* finished */
  CHECK_OK(fsdp_stream_synchronize(user));
  CHECK_OK(fsdp_pool_give_back(p, slot[0], busy)); /* its reader still runs */
  /* the pick alone says slot 0 (the lowest index among equals) */
  CHECK_OK(fsdp_pool_acquire(p, 200, user, &slot[2], &buf[2]));
  if (window) {
    CHECK(slot[2] == 0 && buf[2] == buf[0]); /* the pick, whatever is idle */
  } else {
    CHECK(slot[2] == 1 && buf[2] == buf[1]);
    fsdp_event *e = NULL; /* the user goes on at once: it waits for nothing */
    CHECK_OK(fsdp_event_create(FSDP_CPU, &e));
    CHECK_OK(fsdp_event_record(e, user));
    for (int i = 0; i < 200 && fsdp_event_query(e) == 0; i++) usleep(1000);
    CHECK(fsdp_event_query(e) == 1);
    CHECK_OK(fsdp_event_destroy(e));
  }
  atomic_store(&gate, 1);
  CHECK_OK(fsdp_stream_synchronize(busy));
  CHECK_OK(fsdp_pool_give_back(p, slot[2], user));
  CHECK_OK(fsdp_stream_synchronize(user));
  CHECK_OK(fsdp_pool_destroy(p));
  CHECK_OK(fsdp_stream_destroy(user));
  CHECK_OK(fsdp_stream_destroy(busy));
}

static void test_ready_slot(void) { ready_slot_case(NULL); }

/* A pool registered in window mode keeps to the pick, even when another
 * slot of that size is idle: NCCL's symmetric windows need the same
 * window on every rank, and which slot is idle depends on each rank's
 * timing, so the swap above would let one rank's collective write another
 * unit's slot on its peers. (On CPU ranks registration costs nothing, so a
 * singleton's comm shows the choice.) */
static void test_window_slot(void) {
  fsdp_proc_info info;
  CHECK_OK(fsdp_init(&info));
  const char *names[] = {"dp"};
  int64_t sizes[] = {1};
  fsdp_mesh *m = NULL;
  fsdp_comm *c = NULL;
  CHECK_OK(fsdp_mesh_create(1, names, sizes, FSDP_CPU, &m));
  CHECK_OK(fsdp_mesh_group(m, "dp", &c));
  ready_slot_case(c);
  CHECK_OK(fsdp_mesh_destroy(m));
  CHECK_OK(fsdp_finalize());
}

int main(void) {
  test_pick();
  test_pool();
  test_ready_slot();
  test_window_slot();
  return fsdp_test_summary("test_pool");
}
