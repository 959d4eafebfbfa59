/* test_embedding: lookup and scatter-add, exact (copies and fp32 sums in
 * a fixed order, against float64 sums of the same order rounded once per
 * add); an id outside the vocabulary is an error naming it. */
#include <stdlib.h>

#include "check.h"
#include "ref.h"

int main(void) {
  enum { V = 11, D = 5, N = 23 };
  unsigned seed = 5;
  static float table[V * D], y[N * D], dy[N * D], dt[V * D];
  static double want[V * D];
  int32_t ids[N];
  ref_fill(table, NULL, V * D, &seed, 1);
  ref_fill(dy, NULL, N * D, &seed, 1);
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7 + 3) % V);
  CHECK_OK(fsdp_embedding_forward(y, ids, table, N, V, D));
  int bad = 0;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) bad += y[i * D + j] != table[ids[i] * D + j];
  CHECK(bad == 0);
  for (int i = 0; i < V * D; i++) dt[i] = 1.0f, want[i] = 1.0f;
  CHECK_OK(fsdp_embedding_backward(dt, dy, ids, N, V, D));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) want[ids[i] * D + j] = (float)(want[ids[i] * D + j] + dy[i * D + j]);
  CHECK(ref_mismatches("embedding dtable", dt, want, V * D, 0, 0) == 0);
  ids[4] = V;
  CHECK_FAILS(fsdp_embedding_forward(y, ids, table, N, V, D), FSDP_EINVAL, "token id 11 at position 4");
  ids[4] = -1;
  CHECK_FAILS(fsdp_embedding_backward(dt, dy, ids, N, V, D), FSDP_EINVAL, "token id -1");
  return fsdp_test_summary("test_embedding");
}
