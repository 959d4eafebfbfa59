#include "check.h"

int fsdp_test_passed, fsdp_test_failed;

int fsdp_test_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, fsdp_test_passed, fsdp_test_failed);
  return fsdp_test_failed ? 1 : 0;
}
