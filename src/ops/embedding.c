/* embedding.c: token embedding lookup y[i] = table[ids[i]] and its
 * backward, a scatter-add into the table's gradient. fp32. A vocab-parallel
 * rank holds rows [first, first + rows) of the table: ids outside them give
 * zero rows (another rank's: summed over the tp group) and no gradient. */
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"

static int check_args(const char *op, const void *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab,
                      int64_t first, int64_t rows, int64_t dim) {
  if (n < 0 || vocab < 1 || dim < 1 || rows < 1 || first < 0 || first + rows > vocab || (n && (!y || !ids || !table)))
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld vocab=%lld rows [%lld, %lld) dim=%lld)", op, (long long)n,
                     (long long)vocab, (long long)first, (long long)(first + rows), (long long)dim);
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return fsdp_fail(FSDP_EINVAL, "%s: token id %d at position %lld is outside the vocabulary [0, %lld)", op, ids[i],
                       (long long)i, (long long)vocab);
  return FSDP_OK;
}

int fsdp_embedding_forward_slice(float *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab,
                                 int64_t first, int64_t rows, int64_t dim) {
  FSDP_CHECK(check_args("embedding_forward", y, ids, table, n, vocab, first, rows, dim));
  for (int64_t i = 0; i < n; i++) {
    int64_t r = (int64_t)ids[i] - first;
    if (r >= 0 && r < rows) memcpy(y + i * dim, table + r * dim, (size_t)dim * sizeof(float));
    else memset(y + i * dim, 0, (size_t)dim * sizeof(float));
  }
  return FSDP_OK;
}

int fsdp_embedding_backward_slice(float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                  int64_t first, int64_t rows, int64_t dim) {
  FSDP_CHECK(check_args("embedding_backward", dy, ids, dtable, n, vocab, first, rows, dim));
  for (int64_t i = 0; i < n; i++) {
    int64_t r = (int64_t)ids[i] - first;
    if (r < 0 || r >= rows) continue;
    float *d = dtable + r * dim;
    const float *g = dy + i * dim;
    for (int64_t j = 0; j < dim; j++) d[j] += g[j];
  }
  return FSDP_OK;
}

int fsdp_embedding_forward(float *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab, int64_t dim) {
  return fsdp_embedding_forward_slice(y, ids, table, n, vocab, 0, vocab, dim);
}

int fsdp_embedding_backward(float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim) {
  return fsdp_embedding_backward_slice(dtable, dy, ids, n, vocab, 0, vocab, dim);
}
