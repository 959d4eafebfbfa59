#include "check.h"

#include <string.h>

int fsdp_test_passed, fsdp_test_failed;

int fsdp_test_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, fsdp_test_passed, fsdp_test_failed);
  return fsdp_test_failed ? 1 : 0;
}

fsdp_comm *fsdp_test_world(int device, fsdp_mesh **mesh) {
  const char *names[] = {"dp"};
  int64_t sizes[] = {-1};
  fsdp_comm *c = NULL;
  *mesh = NULL;
  CHECK_OK(fsdp_mesh_create(1, names, sizes, device, mesh));
  if (*mesh) CHECK_OK(fsdp_mesh_group(*mesh, "dp", &c));
  return c;
}
