/* test_layout: property tests of the flat-buffer layout over random
 * parameter sets, group sizes and alignments, against a naive reference (an
 * explicit owner array over every element of the padded buffer). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

static int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)(((uint64_t)rand() << 31 ^ (uint64_t)rand()) % (uint64_t)(hi - lo + 1)); }

static void one_case(int np, const int64_t *numel, int W, int64_t pa, int64_t sa) {
  fsdp_layout *l = NULL;
  CHECK_OK(fsdp_layout_create(np, numel, W, pa, sa, &l));
  if (!l) return;
  int64_t S = fsdp_layout_shard_numel(l), T = fsdp_layout_numel_total(l), used = 0, packed = 0;
  for (int i = 0; i < np; i++) {
    used += numel[i];
    packed = (packed + pa - 1) / pa * pa + numel[i];
  }
  CHECK(fsdp_layout_numel_used(l) == used);
  CHECK(T == S * W);
  CHECK(S % sa == 0);                     /* shards aligned */
  CHECK(S * W >= packed);                 /* everything fits */
  CHECK(S == 0 || (S - sa) * W < packed); /* minimal: one alignment step less would not fit */
  /* reference owner map: -1 = padding */
  int *owner_param = malloc(sizeof(int) * (size_t)(T ? T : 1));
  for (int64_t k = 0; k < T; k++) owner_param[k] = -1;
  int ok = 1;
  for (int i = 0; i < np; i++) {
    int64_t off = fsdp_layout_param_offset(l, i);
    ok &= off % pa == 0;
    for (int64_t k = off; k < off + numel[i]; k++) {
      ok &= owner_param[k] == -1; /* no overlap */
      owner_param[k] = i;
    }
  }
  CHECK(ok);
  /* every element owned exactly once, by the rank whose slice holds it */
  int64_t seen[64] = {0};
  ok = 1;
  for (int r = 0; r < W; r++) {
    int n = fsdp_layout_rank_pieces(l, r, NULL, 0);
    fsdp_layout_piece *p = malloc(sizeof *p * (size_t)(n ? n : 1));
    ok &= fsdp_layout_rank_pieces(l, r, p, n) == n;
    for (int j = 0; j < n; j++) {
      ok &= p[j].rank == r && p[j].begin < p[j].end && p[j].shard_offset >= 0 && p[j].shard_offset + (p[j].end - p[j].begin) <= S;
      int64_t flat = fsdp_layout_param_offset(l, p[j].param) + p[j].begin;
      ok &= flat == (int64_t)r * S + p[j].shard_offset;
      for (int64_t k = p[j].begin; k < p[j].end; k++) ok &= owner_param[flat + k - p[j].begin] == p[j].param;
      seen[p[j].param] += p[j].end - p[j].begin;
      fsdp_layout_piece o;
      int64_t mid = (p[j].begin + p[j].end) / 2;
      ok &= fsdp_layout_owner(l, p[j].param, mid, &o) == 0 && o.rank == r &&
            o.shard_offset == p[j].shard_offset + mid - p[j].begin;
    }
    free(p);
  }
  for (int i = 0; i < np; i++) ok &= seen[i] == numel[i];
  CHECK(ok);
  free(owner_param);
  fsdp_layout_destroy(l);
}

int main(void) {
  srand(3);
  int64_t numel[40];
  for (int t = 0; t < 400; t++) {
    int np = (int)rnd(0, 12);
    for (int i = 0; i < np; i++) numel[i] = rnd(0, 5) == 0 ? rnd(0, 3) : rnd(1, 5000);
    one_case(np, numel, (int)rnd(1, 9), rnd(1, 4) == 1 ? 1 : 64, rnd(1, 3) == 1 ? 1 : 128);
  }
  /* a parameter spanning every shard, and a rank with nothing */
  int64_t one[] = {1000};
  one_case(1, one, 4, 1, 1);
  int64_t tiny[] = {3, 2};
  one_case(2, tiny, 8, 1, 1);
  fsdp_layout *l = NULL;
  CHECK_OK(fsdp_layout_create(2, tiny, 8, 1, 1, &l));
  CHECK(fsdp_layout_rank_pieces(l, 7, NULL, 0) == 0); /* rank 7 holds only padding */
  fsdp_layout_piece o;
  CHECK_FAILS(fsdp_layout_owner(l, 1, 2, &o), FSDP_EINVAL, "outside [0, 2)");
  CHECK_FAILS(fsdp_layout_rank_pieces(l, 8, NULL, 0), FSDP_EINVAL, "rank 8 out of range");
  fsdp_layout_destroy(l);
  CHECK_FAILS(fsdp_layout_create(1, tiny, 0, 1, 1, &l), FSDP_EINVAL, "group size 0");
  return fsdp_test_summary("test_layout");
}
