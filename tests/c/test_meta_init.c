/* test_meta_init: each rank materialises only its shard of each unit; the
 * shards all-gathered give, bit for bit, the full parameters drawn directly
 * on one rank (the reference), for any world size (run on 1 to 4 ranks)
 * and for two different groupings of the parameters into units, in fp32 and
 * bf16. Padding must be zero. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

enum { NP = 7 };
static const char *names[NP] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                                "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.bias",
                                "model.layers.1.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"};
static const int64_t numels[NP] = {1000, 37, 4096, 1, 2500, 333, 777};
static fsdp_init_rule rules[NP];

static void check_unit(fsdp_comm *c, const int *params, int np, int dtype) {
  int W = fsdp_comm_size(c), r = fsdp_comm_rank(c);
  int64_t n[NP];
  const char *nm[NP];
  fsdp_init_rule ru[NP];
  for (int i = 0; i < np; i++) {
    n[i] = numels[params[i]];
    nm[i] = names[params[i]];
    ru[i] = rules[params[i]];
  }
  fsdp_layout *l = NULL;
  CHECK_OK(fsdp_layout_create(np, n, W, 64, 128, &l));
  if (!l) return;
  size_t es = fsdp_dtype_size(dtype);
  int64_t S = fsdp_layout_shard_numel(l);
  char *shard = malloc((size_t)S * es + 1), *full = malloc((size_t)S * W * es + 1), *ref = malloc(4096 * 8);
  CHECK_OK(fsdp_layout_init_shard(l, r, nm, ru, 42, shard, dtype));
  CHECK_OK(fsdp_comm_all_gather(c, full, shard, (size_t)S, dtype));
  CHECK_OK(fsdp_comm_synchronize(c));
  int64_t covered = 0;
  for (int i = 0; i < np; i++) {
    int64_t off = fsdp_layout_param_offset(l, i);
    if (ru[i].kind == FSDP_INIT_CONSTANT) {
      for (int64_t k = 0; k < n[i]; k++) fsdp_convert(ref + k * (int64_t)es, dtype, &ru[i].a, FSDP_FP64, 1);
    } else {
      fsdp_rng_fill(ref, dtype, n[i], 42, fsdp_rng_stream_id(nm[i]), 0,
                    ru[i].kind == FSDP_INIT_NORMAL ? FSDP_RNG_NORMAL : FSDP_RNG_UNIFORM, ru[i].a, ru[i].b);
    }
    CHECK(memcmp(full + off * (int64_t)es, ref, (size_t)n[i] * es) == 0);
    /* zero between the end of this parameter and the start of the next */
    int64_t end = off + n[i], next = i + 1 < np ? fsdp_layout_param_offset(l, i + 1) : S * W;
    int zero = 1;
    for (int64_t k = end * (int64_t)es; k < next * (int64_t)es; k++) zero &= full[k] == 0;
    CHECK(zero);
    covered += n[i];
  }
  CHECK(covered == fsdp_layout_numel_used(l));
  free(shard);
  free(full);
  free(ref);
  fsdp_layout_destroy(l);
}

/* A tensor-parallel slice holds the values the full parameter has there:
 * rows 2-3 of a [6, 10] weight (a column-parallel slice) and columns 4-7
 * (a row-parallel one), each sharded over 3 ranks so that pieces start and
 * end inside rows, against the whole parameter's init. */
static void check_slices(void) {
  enum { R = 6, G = 10 };
  const char *pname[] = {"layers.0.w"};
  fsdp_init_rule whole = {.kind = FSDP_INIT_NORMAL, .a = 0.0, .b = 0.02};
  float full[R * G];
  fsdp_layout *l1 = NULL;
  int64_t n_full = R * G;
  CHECK_OK(fsdp_layout_create(1, &n_full, 1, 1, 1, &l1));
  CHECK_OK(fsdp_layout_init_shard(l1, 0, pname, &whole, 5, full, FSDP_FP32));
  fsdp_layout_destroy(l1);
  struct { int64_t rows, cols, row0, col0; } cases[] = {{2, G, 2, 0}, {R, 4, 0, 4}, {R, 3, 0, 7}};
  for (int c = 0; c < 3; c++) {
    int64_t n = cases[c].rows * cases[c].cols;
    fsdp_init_rule rule = whole;
    rule.cols = cases[c].cols, rule.gcols = G, rule.row0 = cases[c].row0, rule.col0 = cases[c].col0;
    fsdp_layout *l = NULL;
    CHECK_OK(fsdp_layout_create(1, &n, 3, 1, 1, &l));
    int64_t S = fsdp_layout_shard_numel(l);
    float *shard = calloc((size_t)S, sizeof(float));
    int bad = 0, seen = 0;
    for (int r = 0; r < 3; r++) {
      CHECK_OK(fsdp_layout_init_shard(l, r, pname, &rule, 5, shard, FSDP_FP32));
      fsdp_layout_piece pc[4];
      int np = fsdp_layout_rank_pieces(l, r, pc, 4);
      for (int k = 0; k < np; k++)
        for (int64_t i = pc[k].begin; i < pc[k].end; i++, seen++) {
          int64_t row = i / cases[c].cols + cases[c].row0, col = i % cases[c].cols + cases[c].col0;
          bad += shard[pc[k].shard_offset + (i - pc[k].begin)] != full[row * G + col];
        }
    }
    CHECK(bad == 0);
    CHECK(seen == n);
    free(shard);
    fsdp_layout_destroy(l);
  }
  fsdp_init_rule wide = whole;
  wide.cols = 4, wide.gcols = 6, wide.col0 = 3; /* columns 3-6 of 6 */
  fsdp_layout *l = NULL;
  int64_t n = 8;
  float buf[8];
  CHECK_OK(fsdp_layout_create(1, &n, 1, 1, 1, &l));
  CHECK_FAILS(fsdp_layout_init_shard(l, 0, pname, &wide, 5, buf, FSDP_FP32), FSDP_EINVAL, "does not fit 6 columns");
  fsdp_layout_destroy(l);
}

int main(void) {
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) return 1;
  for (int i = 0; i < NP; i++) rules[i] = (fsdp_init_rule){.kind = FSDP_INIT_NORMAL, .a = 0.0, .b = 0.02};
  rules[1] = (fsdp_init_rule){.kind = FSDP_INIT_CONSTANT, .a = 1.0, .b = 0};
  rules[3] = (fsdp_init_rule){.kind = FSDP_INIT_CONSTANT, .a = 0.0, .b = 0};
  rules[4] = (fsdp_init_rule){.kind = FSDP_INIT_UNIFORM, .a = -0.1, .b = 0.1};
  fsdp_mesh *m = NULL;
  fsdp_comm *c = fsdp_test_world(FSDP_CPU, &m);
  static const int all[NP] = {0, 1, 2, 3, 4, 5, 6};
  static const int a[] = {0, 1, 2}, b[] = {3, 4}, d[] = {5, 6};
  int dtypes[] = {FSDP_FP32, FSDP_BF16};
  for (int k = 0; k < 2 && c; k++) {
    check_unit(c, all, NP, dtypes[k]); /* grouping 1: one unit */
    check_unit(c, a, 3, dtypes[k]);    /* grouping 2: three units */
    check_unit(c, b, 2, dtypes[k]);
    check_unit(c, d, 2, dtypes[k]);
  }
  check_slices();
  fsdp_layout *l = NULL;
  int64_t one = 5;
  const char *bad_names[] = {"w"};
  fsdp_init_rule bad_rule = {.kind = 9, .a = 0, .b = 0};
  float buf[128];
  CHECK_OK(fsdp_layout_create(1, &one, 1, 1, 1, &l));
  CHECK_FAILS(fsdp_layout_init_shard(l, 0, bad_names, &bad_rule, 1, buf, FSDP_FP32), FSDP_EINVAL, "unknown rule 9");
  fsdp_layout_destroy(l);
  fsdp_mesh_destroy(m);
  char name[64];
  snprintf(name, sizeof name, "test_meta_init[%d/%d]", info.rank, info.size);
  int rc = fsdp_test_summary(name);
  fsdp_finalize();
  return rc;
}
