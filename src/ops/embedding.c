/* embedding.c: token embedding lookup y[i] = table[ids[i]] and its
 * backward, a scatter-add into the table's gradient. fp32. */
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"

static int check_ids(const char *op, const int32_t *ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab)
      return fsdp_fail(FSDP_EINVAL, "%s: token id %d at position %lld is outside the vocabulary [0, %lld)", op, ids[i],
                       (long long)i, (long long)vocab);
  return FSDP_OK;
}

int fsdp_embedding_forward(float *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab, int64_t dim) {
  if (n < 0 || vocab < 1 || dim < 1 || (n && (!y || !ids || !table)))
    return fsdp_fail(FSDP_EINVAL, "embedding_forward: bad arguments (n=%lld vocab=%lld dim=%lld)", (long long)n,
                     (long long)vocab, (long long)dim);
  FSDP_CHECK(check_ids("embedding_forward", ids, n, vocab));
  for (int64_t i = 0; i < n; i++) memcpy(y + i * dim, table + (int64_t)ids[i] * dim, (size_t)dim * sizeof(float));
  return FSDP_OK;
}

int fsdp_embedding_backward(float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim) {
  if (n < 0 || vocab < 1 || dim < 1 || (n && (!dtable || !ids || !dy)))
    return fsdp_fail(FSDP_EINVAL, "embedding_backward: bad arguments (n=%lld vocab=%lld dim=%lld)", (long long)n,
                     (long long)vocab, (long long)dim);
  FSDP_CHECK(check_ids("embedding_backward", ids, n, vocab));
  for (int64_t i = 0; i < n; i++) {
    float *d = dtable + (int64_t)ids[i] * dim;
    const float *g = dy + i * dim;
    for (int64_t j = 0; j < dim; j++) d[j] += g[j];
  }
  return FSDP_OK;
}
