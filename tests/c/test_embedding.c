/* test_embedding: lookup and scatter-add, exact (copies and fp32 sums in
 * a fixed order, against float64 sums of the same order rounded once per
 * add); an id outside the vocabulary is an error naming it. Vocab-parallel
 * slices (rows [first, first + rows), 1-3 of them, uneven): their lookups
 * summed are the whole table's, bit for bit, and their gradients are the
 * whole gradient's rows. */
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
  ids[4] = 2;
  for (int parts = 1; parts <= 3; parts++) {
    static float ys[N * D], dts[V * D];
    int bad_y = 0, bad_g = 0;
    for (int i = 0; i < N * D; i++) ys[i] = 0;
    for (int i = 0; i < V * D; i++) dt[i] = 0;
    CHECK_OK(fsdp_embedding_backward(dt, dy, ids, N, V, D));
    for (int p = 0; p < parts; p++) {
      int first = p * V / parts, rows = (p + 1) * V / parts - first;
      static float part[N * D];
      CHECK_OK(fsdp_embedding_forward_slice(part, ids, table + first * D, N, V, first, rows, D));
      for (int i = 0; i < N * D; i++) ys[i] += part[i];
      for (int i = 0; i < rows * D; i++) dts[i] = 0;
      CHECK_OK(fsdp_embedding_backward_slice(dts, dy, ids, N, V, first, rows, D));
      for (int i = 0; i < rows * D; i++) bad_g += dts[i] != dt[first * D + i];
    }
    CHECK_OK(fsdp_embedding_forward(y, ids, table, N, V, D));
    for (int i = 0; i < N * D; i++) bad_y += ys[i] != y[i];
    CHECK(bad_y == 0);
    CHECK(bad_g == 0);
  }
  CHECK_FAILS(fsdp_embedding_forward_slice(y, ids, table, N, V, 5, V, D), FSDP_EINVAL, "rows [5, 16)");
  return fsdp_test_summary("test_embedding");
}
