/* test_unit_lifecycle: a unit's named states (src/shard/unit_lifecycle.c)
 * and their checked transitions, at zero 0-3 on W ranks:
 *   - the states each call leads to (params: sharded -> gathering ->
 *     gathered -> sharded at zero 3, resident below; grads: clean ->
 *     accumulating -> reduced -> clean);
 *   - every call out of order is refused with FSDP_ESTATE and a message
 *     naming the unit, its state and the call that should come first: a
 *     wait before its unshard, a param view while still gathering, a reduce
 *     before grads, a reduce twice, a step before the last reduce, a step
 *     with nothing reduced, a new micro-batch's grads on reduced ones;
 *   - a refused call changes nothing: a unit driven through two steps with
 *     every refusal tried between the calls ends with main params and
 *     optimizer state bit for bit those of a unit driven through the same
 *     two steps alone (tolerance: none; the same calls on the same data).
 *   - a step dropped by zero_grad half way (one micro-batch reduced, one
 *     not) leaves nothing behind: the same reference never saw it;
 *   - overlap_step's config rules (0 or 1; not with offload or hfsdp). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

enum { NP = 2 };
static const char *names[NP] = {"w", "b"};
static const int64_t numels[NP] = {300, 5};
static const uint8_t no_decay[NP] = {0, 1};
static int R;

static fsdp_unit *make(fsdp_comm *dp, fsdp_pool *pp, fsdp_pool *gp, int zero, const char *name) {
  fsdp_init_rule rules[NP] = {{.kind = FSDP_INIT_NORMAL, .a = 0, .b = 0.02}, {.kind = FSDP_INIT_CONSTANT, .a = 0.5}};
  fsdp_unit_spec spec = {.name = name, .nparams = NP, .param_names = names, .numels = numels, .rules = rules,
                         .no_decay = no_decay, .seed = 5, .shard = dp, .param_pool = pp, .grad_pool = gp,
                         .config = {.zero = zero, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32,
                                    .grad_op = FSDP_AVG, .param_align = 16, .shard_align = 32}};
  fsdp_unit *u = NULL;
  CHECK_OK(fsdp_unit_create(&spec, &u));
  return u;
}

static void expect(fsdp_unit *u, int params, int grads, int line) {
  int p = -1, g = -1;
  CHECK_OK(fsdp_unit_states(u, &p, &g));
  if (p != params || g != grads) {
    fsdp_test_failed++;
    fprintf(stderr, "%s:%d: unit states %s/%s, expected %s/%s\n", __FILE__, line, fsdp_unit_params_state_name(p),
            fsdp_unit_grads_state_name(g), fsdp_unit_params_state_name(params), fsdp_unit_grads_state_name(grads));
  } else {
    fsdp_test_passed++;
  }
}
#define EXPECT(u, p, g) expect(u, p, g, __LINE__)
enum {
  SHARDED = FSDP_PARAMS_SHARDED, GATHERING = FSDP_PARAMS_GATHERING, GATHERED = FSDP_PARAMS_GATHERED,
  RESIDENT = FSDP_PARAMS_RESIDENT, CLEAN = FSDP_GRADS_CLEAN, ACCUMULATING = FSDP_GRADS_ACCUMULATING,
  REDUCED = FSDP_GRADS_REDUCED
};

/* micro-batch k of step t: this rank's grads, written into the full buffer */
static void backward(fsdp_unit *u, int t, int k) {
  float *g = NULL;
  CHECK_OK(fsdp_unit_grads(u, NULL, (void **)&g));
  fsdp_unit_plan plan;
  CHECK_OK(fsdp_unit_plan_get(u, &plan));
  for (int64_t i = 0; g && i < plan.total_numel; i++) g[i] += (float)((i * 3 + t * 7 + k + R) % 11 - 5) / 8.0f;
}

/* one step of K micro-batches; `probe`: try every call the state refuses
 * on the way, and check the states */
static void step(fsdp_unit *u, int zero, int t, int K, int probe) {
  int gathered = zero == 3;
  fsdp_tensor v;
  int64_t shape[1] = {numels[0]};
  for (int k = 0; k < K; k++) {
    if (probe && gathered) {
      CHECK_FAILS(fsdp_unit_wait(u, NULL), FSDP_ESTATE, "wait() while its params are sharded: unshard() first");
      EXPECT(u, SHARDED, k == 0 ? CLEAN : ACCUMULATING);
    }
    CHECK(fsdp_unit_unshard(u) == FSDP_OK);
    if (probe && gathered) {
      EXPECT(u, GATHERING, k == 0 ? CLEAN : ACCUMULATING);
      CHECK_FAILS(fsdp_unit_param_view(u, 0, FSDP_VIEW_PARAM, 1, shape, &v), FSDP_ESTATE, "still being gathered");
      CHECK_OK(fsdp_unit_unshard(u)); /* a second unshard: nothing more */
    }
    CHECK_OK(fsdp_unit_wait(u, NULL));
    if (probe) EXPECT(u, gathered ? GATHERED : RESIDENT, k == 0 ? CLEAN : ACCUMULATING);
    CHECK_OK(fsdp_unit_param_view(u, 0, FSDP_VIEW_PARAM, 1, shape, &v));
    if (probe && k == 0) {
      CHECK_FAILS(fsdp_unit_reduce(u, NULL, 1), FSDP_ESTATE, "grads are clean: no backward wrote grads");
      CHECK_FAILS(fsdp_unit_reduce(u, NULL, 0), FSDP_ESTATE, "grads() first");
      CHECK_FAILS(fsdp_unit_step_sgd(u, t, 0.1f, 0.9f, 0.0f, 1.0f), FSDP_ESTATE, "no grads were reduced");
    }
    backward(u, t, k);
    if (probe) {
      EXPECT(u, gathered ? GATHERED : RESIDENT, ACCUMULATING);
      fsdp_adamw_config a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
      CHECK_FAILS(fsdp_unit_step(u, t, &a, 1.0f), FSDP_ESTATE, "reduce() (sync = 1) must come first");
    }
    CHECK_OK(fsdp_unit_reshard(u, NULL));
    if (probe) EXPECT(u, gathered ? SHARDED : RESIDENT, ACCUMULATING);
    CHECK_OK(fsdp_unit_reduce(u, NULL, k == K - 1));
  }
  if (probe) {
    EXPECT(u, gathered ? SHARDED : RESIDENT, REDUCED);
    CHECK_FAILS(fsdp_unit_reduce(u, NULL, 1), FSDP_ESTATE, "would count them twice");
    void *g = NULL;
    CHECK_FAILS(fsdp_unit_grads(u, NULL, &g), FSDP_ESTATE, "or its grads would add to theirs");
    CHECK_FAILS(fsdp_unit_grads(u, NULL, &g), FSDP_ESTATE, "unit 'probed': grads() while its grads are reduced");
    EXPECT(u, gathered ? SHARDED : RESIDENT, REDUCED);
  }
  CHECK_OK(fsdp_unit_step_sgd(u, t, 0.1f, 0.9f, 0.01f, 1.0f));
  if (probe) EXPECT(u, gathered ? SHARDED : RESIDENT, CLEAN);
}

static int same(fsdp_unit *a, fsdp_unit *b, int kind) {
  int64_t n = fsdp_unit_state_numel(a);
  float *x = calloc((size_t)n + 1, sizeof(float)), *y = calloc((size_t)n + 1, sizeof(float));
  CHECK_OK(fsdp_unit_state_get(a, kind, 0, n, x));
  CHECK_OK(fsdp_unit_state_get(b, kind, 0, n, y));
  int eq = n == fsdp_unit_state_numel(b) && memcmp(x, y, sizeof(float) * (size_t)n) == 0;
  free(x), free(y);
  return eq;
}

static void run(fsdp_comm *dp, int zero) {
  int64_t slot = 4 * (300 + 5 + 64 * 8), slots[2] = {slot, slot};
  fsdp_pool *pp = NULL, *gp = NULL;
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, &pp));
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, &gp));
  fsdp_unit *probed = make(dp, pp, gp, zero, "probed"), *plain = make(dp, pp, gp, zero, "plain");
  EXPECT(probed, zero == 3 ? SHARDED : RESIDENT, CLEAN);
  CHECK(strcmp(fsdp_unit_grads_state_name(FSDP_GRADS_ACCUMULATING), "accumulating") == 0);
  CHECK(strcmp(fsdp_unit_params_state_name(99), "?") == 0);
  /* a step dropped half way (one micro-batch reduced, one not): zero_grad
   * from accumulating is clean again, and the plain unit, which never saw
   * that step, is the reference that nothing of it is left */
  CHECK_OK(fsdp_unit_unshard(probed));
  CHECK_OK(fsdp_unit_wait(probed, NULL));
  backward(probed, 0, 0);
  CHECK_OK(fsdp_unit_reduce(probed, NULL, 0));
  backward(probed, 0, 1);
  CHECK_OK(fsdp_unit_reshard(probed, NULL));
  CHECK_OK(fsdp_unit_zero_grad(probed));
  EXPECT(probed, zero == 3 ? SHARDED : RESIDENT, CLEAN);
  for (int t = 1; t <= 2; t++) {
    step(probed, zero, t, t, 1);
    step(plain, zero, t, t, 0);
  }
  for (int kind = FSDP_STATE_PARAM; kind <= FSDP_STATE_OPT1; kind++) CHECK(same(probed, plain, kind));
  fsdp_unit_destroy(probed);
  fsdp_unit_destroy(plain);
  fsdp_pool_destroy(pp);
  fsdp_pool_destroy(gp);
}

/* overlap_step's config rules: 0 or 1, and not with offload or hfsdp */
static void overlap_rules(void) {
  fsdp_layout *lay = NULL;
  int64_t n = 100;
  CHECK_OK(fsdp_layout_create(1, &n, 2, 1, 1, &lay));
  fsdp_unit_config c = {.zero = 3, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG,
                        .param_align = 1, .shard_align = 1, .overlap_step = 1};
  fsdp_unit_plan p;
  CHECK_OK(fsdp_unit_plan_make(&c, lay, FSDP_CPU, 1, 0, &p));
  c.offload = FSDP_OFFLOAD_OPTIMIZER;
  CHECK_FAILS(fsdp_unit_plan_make(&c, lay, FSDP_CPU, 1, 0, &p), FSDP_EINVAL, "not with offload");
  c.offload = 0;
  c.hfsdp = 1;
  CHECK_FAILS(fsdp_unit_plan_make(&c, lay, FSDP_CPU, 2, 0, &p), FSDP_EINVAL, "not with hfsdp");
  c.hfsdp = 0;
  c.overlap_step = 2;
  CHECK_FAILS(fsdp_unit_plan_make(&c, lay, FSDP_CPU, 1, 0, &p), FSDP_EINVAL, "overlap_step = 2; expected 0 or 1");
  fsdp_layout_destroy(lay);
}

int main(void) {
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) return 1;
  R = info.rank;
  fsdp_mesh *m = NULL;
  fsdp_comm *dp = fsdp_test_world(FSDP_CPU, &m);
  for (int zero = 0; zero <= 3 && dp; zero++) run(dp, zero);
  overlap_rules();
  fsdp_mesh_destroy(m);
  char label[64];
  snprintf(label, sizeof label, "test_unit_lifecycle[%d/%d]", R, info.size);
  int rc = fsdp_test_summary(label);
  fsdp_finalize();
  return rc;
}
