/* check.h: the tiny assertion kit of the C unit tests. A failed check prints
 * file:line and the expression and counts a failure; fsdp_test_summary()
 * prints "N passed, M failed" and returns the exit status. */
#ifndef FSDP_TEST_CHECK_H
#define FSDP_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

extern int fsdp_test_passed, fsdp_test_failed;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (cond) {                                                              \
      fsdp_test_passed++;                                                    \
    } else {                                                                 \
      fsdp_test_failed++;                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)

#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    int check_rc_ = (expr);                                                              \
    if (check_rc_ == 0) {                                                                \
      fsdp_test_passed++;                                                                \
    } else {                                                                             \
      fsdp_test_failed++;                                                                \
      fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr, check_rc_, \
              fsdp_last_error());                                                        \
    }                                                                                    \
  } while (0)

/* expr must fail with status st and a message containing needle */
#define CHECK_FAILS(expr, st, needle)                                                     \
  do {                                                                                    \
    int check_rc_ = (expr);                                                               \
    if (check_rc_ == (st) && strstr(fsdp_last_error(), (needle))) {                        \
      fsdp_test_passed++;                                                                 \
    } else {                                                                              \
      fsdp_test_failed++;                                                                 \
      fprintf(stderr, "%s:%d: %s: expected %d with '%s', got %d: %s\n", __FILE__, __LINE__, #expr, \
              (st), (needle), check_rc_, fsdp_last_error());                              \
    }                                                                                     \
  } while (0)

int fsdp_test_summary(const char *name);

#include "fsdp.h"
/* A 1-D mesh "dp" over every rank and its comm (NULL on failure, counted). */
fsdp_comm *fsdp_test_world(int device, fsdp_mesh **mesh);

#endif
