/* test_units_split: units that compute in bf16 keep their fp32 main params
 * split (src/base/bf16_split.h): the bf16 compute params are the high
 * halves, the main_params row holds the 16 low bits. Checked on W ranks for
 * zero 0-3 against a unit that computes in fp32 (its main params are plain
 * fp32), fed the same grads:
 *   - the plan: 2 bytes per main param for the bf16 unit, 4 for the fp32 one;
 *   - meta init, then 5 optimizer steps (AdamW for zero 0 and 2, SGD with
 *     momentum for 1 and 3): the main params and the optimizer's arrays are
 *     the fp32 unit's bit for bit, and the full bf16 params are its params
 *     rounded ties-away (fsdp_bf16_round_away);
 *   - state set / get (checkpoints): values with exact ties come back bit for
 *     bit, and the compute params after publishing are their rounding.
 * The grads are small multiples of 1/16, exact in bf16, so both units reduce
 * the same fp32 numbers: any difference is the split's. Tolerance: none.
 *
 * And compact grads (fsdp_unit_plan.grads_compact): a bf16 unit made for
 * one micro-batch per step keeps the grads the optimizer reads in bf16 where
 * they are bf16 values anyway (one rank, or reduced in bf16). Checked for
 * zero 0-3 and both reduce dtypes against the same unit made for any count
 * (fp32 grads): the plan (compact exactly where it should be, 2 bytes per
 * grad or the full grads' memory, no grad pool on one rank), the grad norm
 * of each step and, after 5 steps, the main params and the optimizer's
 * arrays, bit for bit; a skipped step leaves no grads; a micro-batch that
 * is not the last is refused.
 *
 * And fp32 sums of bf16 micro-batches at zero 0-1 (fsdp_unit_plan.sums_fp32):
 * three micro-batches whose sum needs more bits than bf16 has (1 + 2^-10 +
 * 2^-10 per element, and the like), summed over the ranks (FSDP_SUM, so
 * every order of exact fp32 adds is the same number), against a zero 2
 * unit, which adds each micro-batch's reduced grads into its fp32 shard:
 * this rank's grad norm share and, after an AdamW step, its main params,
 * bit for bit (after a micro-batch dropped by zero_grad). Summed in bf16
 * the small terms would vanish. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16_split.h"
#include "check.h"
#include "fsdp.h"

enum { NP = 3, STEPS = 5 };
static const char *names[NP] = {"w", "b", "norm"};
static const int64_t numels[NP] = {1000, 7, 33};
static const uint8_t no_decay[NP] = {0, 1, 1};
static int W, R;

static float grad_at(int t, int64_t i) { return (float)((int)((i * 7 + R * 3 + t * 5) % 17) - 8) / 16.0f; }

static int grad_op = FSDP_AVG;

static fsdp_unit *make_with(fsdp_comm *dp, fsdp_pool *pp, fsdp_pool *gp, int zero, int dtype, int reduce_dtype,
                            int micro_batches, const char *name) {
  fsdp_init_rule rules[NP] = {{.kind = FSDP_INIT_NORMAL, .a = 0, .b = 0.02},
                              {.kind = FSDP_INIT_CONSTANT, .a = 0, .b = 0},
                              {.kind = FSDP_INIT_CONSTANT, .a = 1, .b = 0}};
  fsdp_unit_spec spec = {.name = name, .nparams = NP, .param_names = names, .numels = numels, .rules = rules,
                         .no_decay = no_decay, .seed = 11, .shard = dp, .param_pool = pp, .grad_pool = gp,
                         .config = {.zero = zero, .compute_dtype = dtype, .reduce_dtype = reduce_dtype,
                                    .grad_op = grad_op, .param_align = 16, .shard_align = 32,
                                    .micro_batches = micro_batches}};
  fsdp_unit *u = NULL;
  CHECK_OK(fsdp_unit_create(&spec, &u));
  return u;
}
static fsdp_unit *make(fsdp_comm *dp, fsdp_pool *pp, fsdp_pool *gp, int zero, int dtype, const char *name) {
  return make_with(dp, pp, gp, zero, dtype, FSDP_FP32, 0, name);
}

/* a state kind of the whole optimizer range, as fp32 */
static float *state(fsdp_unit *u, int kind) {
  int64_t n = fsdp_unit_state_numel(u);
  float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
  CHECK_OK(fsdp_unit_state_get(u, kind, 0, n, x));
  return x;
}

static int same_state(fsdp_unit *a, fsdp_unit *b, int kind) {
  int64_t n = fsdp_unit_state_numel(a);
  float *x = state(a, kind), *y = state(b, kind);
  int ok = n == fsdp_unit_state_numel(b) && memcmp(x, y, sizeof(float) * (size_t)n) == 0;
  free(x), free(y);
  return ok;
}

/* the full params of u (gathered for zero 3), and then released */
static const void *full_params(fsdp_unit *u) {
  CHECK(fsdp_unit_unshard(u) >= 0);
  CHECK_OK(fsdp_unit_wait(u, NULL));
  return fsdp_unit_params(u);
}

/* the split unit's full bf16 params are the fp32 ones rounded ties-away,
 * over [at, at + n) (n < 0: everything) */
static int rounded_off(fsdp_unit *split, const float *want, int64_t at, int64_t n) {
  const uint16_t *h = full_params(split);
  int bad = 0;
  for (int64_t i = 0; h && i < n; i++) bad += h[at + i] != fsdp_bf16_round_away(want[i]);
  CHECK_OK(fsdp_unit_reshard(split, NULL));
  return bad;
}

static void pools(fsdp_pool **pp, fsdp_pool **gp) {
  int64_t slot = 4 * (1000 + 7 + 33 + NP * 16 + 32 * 8);
  int64_t slots[2] = {slot, slot};
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, pp));
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, gp));
}

static void run(fsdp_comm *dp, int zero) {
  fsdp_pool *pp = NULL, *gp = NULL;
  pools(&pp, &gp);
  fsdp_unit *u[2] = {make(dp, pp, gp, zero, FSDP_BF16, "split"), make(dp, pp, gp, zero, FSDP_FP32, "fp32")};
  fsdp_unit_plan plan[2];
  fsdp_unit_memory mem[2];
  for (int k = 0; k < 2; k++) {
    CHECK_OK(fsdp_unit_plan_get(u[k], &plan[k]));
    CHECK_OK(fsdp_unit_memory_info(u[k], &mem[k]));
  }
  int64_t opt = plan[0].opt_numel, T = plan[0].total_numel, S = plan[0].shard_numel;
  CHECK(plan[0].main_split == 1 && plan[1].main_split == 0 && plan[1].compute_is_main == 1);
  CHECK(mem[0].main_params == 2 * opt && mem[1].main_params == 4 * opt && mem[0].optimizer == mem[1].optimizer);
  CHECK(same_state(u[0], u[1], FSDP_STATE_PARAM)); /* meta init */

  fsdp_adamw_config adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  for (int t = 1; t <= STEPS; t++) {
    for (int k = 0; k < 2; k++) {
      full_params(u[k]);
      void *g = NULL;
      CHECK_OK(fsdp_unit_grads(u[k], NULL, &g));
      for (int64_t i = 0; g && i < T; i++) {
        if (k == 0) ((uint16_t *)g)[i] = fsdp_f32_to_bf16(grad_at(t, i));
        else ((float *)g)[i] = grad_at(t, i);
      }
      CHECK_OK(fsdp_unit_reshard(u[k], NULL));
      CHECK_OK(fsdp_unit_reduce(u[k], NULL, 1));
      CHECK_OK(fsdp_unit_synchronize(u[k]));
      if (zero % 2 == 0) CHECK_OK(fsdp_unit_step(u[k], t, &adamw, 0.7f));
      else CHECK_OK(fsdp_unit_step_sgd(u[k], t, 0.05f, 0.9f, 0.01f, 0.7f));
    }
  }
  CHECK(same_state(u[0], u[1], FSDP_STATE_PARAM));
  CHECK(same_state(u[0], u[1], FSDP_STATE_OPT1));
  if (zero % 2 == 0) CHECK(same_state(u[0], u[1], FSDP_STATE_OPT2));
  /* the fp32 unit's full params are its main params (compute_is_main) */
  float *want = malloc(sizeof(float) * (size_t)T);
  memcpy(want, full_params(u[1]), sizeof(float) * (size_t)T);
  CHECK_OK(fsdp_unit_reshard(u[1], NULL));
  CHECK(rounded_off(u[0], want, 0, T) == 0);

  /* checkpoint values with exact ties and every low half */
  float *vals = malloc(sizeof(float) * (size_t)opt);
  for (int64_t i = 0; i < opt; i++)
    vals[i] = fsdp_bf16_join((uint16_t)(0x3c00 + i % 512 + (i % 2 ? 0x8000 : 0)),
                             (uint16_t)(i % 3 == 0 ? 0x8000 : (i * 40503) & 0xffff));
  CHECK_OK(fsdp_unit_state_set(u[0], FSDP_STATE_PARAM, 0, opt, vals));
  CHECK_OK(fsdp_unit_state_publish(u[0]));
  float *back = state(u[0], FSDP_STATE_PARAM);
  CHECK(memcmp(back, vals, sizeof(float) * (size_t)opt) == 0);
  /* this rank's range of the full params: all of them for zero 0 */
  CHECK(rounded_off(u[0], vals, zero == 0 ? 0 : R * S, opt) == 0);
  CHECK_FAILS(fsdp_unit_state_get(u[0], FSDP_STATE_PARAM, opt - 1, 2, back), FSDP_EINVAL, "outside the");
  free(back), free(vals), free(want);
  for (int k = 0; k < 2; k++) fsdp_unit_destroy(u[k]);
  fsdp_pool_destroy(pp);
  fsdp_pool_destroy(gp);
}

/* one step's backward of u: bf16 grads, reduced */
static void feed(fsdp_unit *u, int t, int64_t T) {
  full_params(u);
  void *g = NULL;
  CHECK_OK(fsdp_unit_grads(u, NULL, &g));
  for (int64_t i = 0; g && i < T; i++) ((uint16_t *)g)[i] = fsdp_f32_to_bf16(grad_at(t, i) * (1 + (float)i / 3));
  CHECK_OK(fsdp_unit_reshard(u, NULL));
  CHECK_OK(fsdp_unit_reduce(u, NULL, 1));
  CHECK_OK(fsdp_unit_synchronize(u));
}

static void run_compact(fsdp_comm *dp, int zero, int reduce_dtype) {
  fsdp_pool *pp = NULL, *gp = NULL;
  pools(&pp, &gp);
  fsdp_unit *u[2] = {make_with(dp, pp, gp, zero, FSDP_BF16, reduce_dtype, 1, "one micro-batch"),
                     make_with(dp, pp, gp, zero, FSDP_BF16, reduce_dtype, 0, "any micro-batches")};
  fsdp_unit_plan plan[2];
  fsdp_unit_memory mem[2];
  for (int k = 0; k < 2; k++) {
    CHECK_OK(fsdp_unit_plan_get(u[k], &plan[k]));
    CHECK_OK(fsdp_unit_memory_info(u[k], &mem[k]));
  }
  int64_t opt = plan[0].opt_numel, T = plan[0].total_numel;
  int compact = W == 1 || reduce_dtype == FSDP_BF16, aliased = compact && (zero == 0 || (zero == 1 && W == 1));
  CHECK(plan[0].grads_compact == compact && plan[1].grads_compact == 0);
  /* the unit made for any count sums micro-batches in fp32; at zero 1 in a full sum of its own */
  int64_t fp32_sum = zero == 1 && reduce_dtype == FSDP_FP32 ? 4 * T : 0;
  CHECK(mem[1].grads_main == 4 * opt + fp32_sum &&
        mem[0].grads_main == (aliased ? 0 : compact ? 2 * opt : 4 * opt));
  CHECK(plan[1].sums_fp32 == (zero <= 1 && reduce_dtype == FSDP_FP32) && plan[0].sums_fp32 == 0);
  CHECK(plan[0].pool_grads == (zero >= 2 && !(compact && W == 1) ? plan[1].pool_grads : 0));
  CHECK(plan[0].reduce_scratch == (compact ? 0 : plan[1].reduce_scratch));

  fsdp_adamw_config adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  int norms_off = 0;
  for (int t = 1; t <= STEPS; t++) {
    double sum[2];
    for (int k = 0; k < 2; k++) {
      feed(u[k], t, T);
      int64_t bad = -1;
      CHECK_OK(fsdp_unit_grad_sumsq(u[k], &sum[k], &bad));
      if (zero % 2 == 0) CHECK_OK(fsdp_unit_step(u[k], t, &adamw, 0.7f));
      else CHECK_OK(fsdp_unit_step_sgd(u[k], t, 0.05f, 0.9f, 0.01f, 0.7f));
    }
    norms_off += memcmp(&sum[0], &sum[1], sizeof(double)) != 0;
  }
  /* a skipped step (non-finite grads somewhere) drops the grads: none left */
  for (int k = 0; k < 2; k++) {
    feed(u[k], STEPS + 1, T);
    CHECK_OK(fsdp_unit_zero_grad(u[k]));
    double left = -1;
    int64_t bad = -1;
    CHECK_OK(fsdp_unit_grad_sumsq(u[k], &left, &bad));
    CHECK(left == 0 && bad == 0);
  }
  CHECK(norms_off == 0);
  CHECK(same_state(u[0], u[1], FSDP_STATE_PARAM));
  CHECK(same_state(u[0], u[1], FSDP_STATE_OPT1));
  if (zero % 2 == 0) CHECK(same_state(u[0], u[1], FSDP_STATE_OPT2));
  /* a unit made for one micro-batch has no fp32 sum for a second */
  if (compact) {
    full_params(u[0]);
    void *g = NULL;
    CHECK_OK(fsdp_unit_grads(u[0], NULL, &g));
    CHECK_OK(fsdp_unit_reshard(u[0], NULL));
    CHECK_FAILS(fsdp_unit_reduce(u[0], NULL, 0), FSDP_ESTATE, "one micro-batch per step");
    CHECK_OK(fsdp_unit_reduce(u[0], NULL, 1));
    CHECK_OK(fsdp_unit_synchronize(u[0]));
  }
  for (int k = 0; k < 2; k++) fsdp_unit_destroy(u[k]);
  fsdp_pool_destroy(pp);
  fsdp_pool_destroy(gp);
}

/* micro-batch k's bf16 grad of element i on this rank: 1, 2^-10 or 2^-11
 * apart in scale, so that their sum needs 12 bits and more */
static float micro_grad(int k, int64_t i) {
  float big = (float)((int)((i * 5 + R) % 9) - 4) / 4.0f;
  return k == 0 ? big : (float)((int)((i * 3 + k + R) % 5) + 1) / (k == 1 ? 1024.0f : 2048.0f);
}

static void run_sums(fsdp_comm *dp, int zero) {
  enum { K = 3 };
  fsdp_pool *pp = NULL, *gp = NULL;
  pools(&pp, &gp);
  grad_op = FSDP_SUM;
  fsdp_unit *u[2] = {make_with(dp, pp, gp, zero, FSDP_BF16, FSDP_FP32, 0, "summed in full"),
                     make_with(dp, pp, gp, 2, FSDP_BF16, FSDP_FP32, 0, "zero 2")};
  grad_op = FSDP_AVG;
  fsdp_unit_plan plan;
  CHECK_OK(fsdp_unit_plan_get(u[0], &plan));
  CHECK(plan.sums_fp32 == 1);
  int64_t T = plan.total_numel, S = plan.shard_numel;
  double sum[2];
  for (int k = 0; k < 2; k++) {
    /* a micro-batch, then the step dropped (zero_grad): nothing of it is left in the sum */
    void *g0 = NULL;
    CHECK_OK(fsdp_unit_grads(u[k], NULL, &g0));
    for (int64_t i = 0; g0 && i < T; i++) ((uint16_t *)g0)[i] = fsdp_f32_to_bf16(micro_grad(0, i + 1));
    CHECK_OK(fsdp_unit_reduce(u[k], NULL, 0));
    CHECK_OK(fsdp_unit_zero_grad(u[k]));
    for (int mb = 0; mb < K; mb++) {
      void *g = NULL;
      CHECK_OK(fsdp_unit_grads(u[k], NULL, &g));
      for (int64_t i = 0; g && i < T; i++) ((uint16_t *)g)[i] = fsdp_f32_to_bf16(micro_grad(mb, i));
      CHECK_OK(fsdp_unit_reduce(u[k], NULL, mb == K - 1));
    }
    CHECK_OK(fsdp_unit_synchronize(u[k]));
    int64_t bad = -1;
    CHECK_OK(fsdp_unit_grad_sumsq(u[k], &sum[k], &bad));
    fsdp_adamw_config adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    CHECK_OK(fsdp_unit_step(u[k], 1, &adamw, 1.0f));
  }
  CHECK(sum[0] > 0 && memcmp(&sum[0], &sum[1], sizeof(double)) == 0);
  /* this rank's shard of the main params (zero 0 holds them all) */
  float *a = malloc(sizeof(float) * (size_t)(S ? S : 1)), *b = malloc(sizeof(float) * (size_t)(S ? S : 1));
  CHECK_OK(fsdp_unit_state_get(u[0], FSDP_STATE_PARAM, zero == 0 ? R * S : 0, S, a));
  CHECK_OK(fsdp_unit_state_get(u[1], FSDP_STATE_PARAM, 0, S, b));
  CHECK(memcmp(a, b, sizeof(float) * (size_t)S) == 0);
  free(a), free(b);
  for (int k = 0; k < 2; k++) fsdp_unit_destroy(u[k]);
  fsdp_pool_destroy(pp);
  fsdp_pool_destroy(gp);
}

int main(void) {
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) return 1;
  W = info.size;
  R = info.rank;
  fsdp_mesh *m = NULL;
  fsdp_comm *dp = fsdp_test_world(FSDP_CPU, &m);
  for (int zero = 0; zero <= 3 && dp; zero++) run(dp, zero);
  for (int zero = 0; zero <= 3 && dp; zero++) {
    run_compact(dp, zero, FSDP_FP32);
    run_compact(dp, zero, FSDP_BF16);
  }
  for (int zero = 0; zero <= 1 && dp; zero++) run_sums(dp, zero);
  fsdp_mesh_destroy(m);
  char label[64];
  snprintf(label, sizeof label, "test_units_split[%d/%d]", R, W);
  int rc = fsdp_test_summary(label);
  fsdp_finalize();
  return rc;
}
