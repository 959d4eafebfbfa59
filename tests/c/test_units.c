/* test_units: FSDP units trained 20 steps on W ranks (1 to 4) for zero 0,
 * 1, 2, 3 and HSDP 2x2, with 1, 2 and 3 micro-batches, against a float64
 * single-model reference computed on every rank.
 *
 * The model: three units, five named parameters. Rank g's micro-batch k at
 * step t has the loss sum_i 0.5 c_i (w_i - y_{g,k,t,i})^2, so the gradient
 * is c_i (w_i - y); grads are summed over micro-batches and averaged over the
 * W data-parallel ranks, the global norm is clipped to 1, then AdamW (decay
 * 0.1, none on the bias and norm).
 *
 * The data is well conditioned: all of an element's targets lie on one side
 * of it, 0.7 to 1.3 from its init's center (the init is within 0.09 of it),
 * farther than 20 AdamW steps of lr 1e-2 move it (0.2), so its K * W
 * summands c_i (w_i - y) share a sign and never cancel (the reference checks
 * |grad| >= sum |summands| / 2). The fp32 sums' rounding, at most
 * (K + W + 1) 2^-24 of the summands' magnitudes, stays as small relative to
 * the grad, and AdamW, which divides by the grad's own size, does not blow
 * it up. (Targets near the params made the grads cancel to 1e-5 of their
 * summands as the params reached them, and AdamW turned that rounding into
 * parameter errors of 1e-5 that depended on the summation order: K = 2 on 3
 * and 4 ranks failed with a correct engine.)
 *
 * Tolerances (fp32 compute): the parameters within 1e-5 relative + 1e-6
 * absolute of the reference after 20 steps; 20 steps' fp32 rounding adds up
 * to about 1.2e-6 relative (a rounding of w of 2^-24 per step, the grads'
 * and the update's far below that; seen: 3.5e-7 absolute, 1/28 of the
 * tolerance). The grad norm each step within 1e-5 relative: float64 sums of
 * grads within 2^-20 relative, cast to fp32 and all-reduced over at most
 * four ranks in fp32, are off by about 1e-6 at most (seen: 7e-8). A dropped
 * micro-batch or rank moves almost every parameter out of its tolerance (the
 * worst by hundreds); one micro-batch's or rank's grads scaled by 1 + 1e-3
 * change the norm by about 1e-3 / K or 1e-3 / W, 25 tolerances or more
 * (AdamW itself barely sees a scale that the grads of every step share). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

enum { NU = 3, STEPS = 20, MAXP = 3 };
typedef struct { const char *name; int64_t n; fsdp_init_rule rule; uint8_t no_decay; } pspec;
static const int unit_np[NU] = {2, 2, 1};
static pspec P[NU][MAXP];
static int W, R;

/* 0.7 to 1.3 from the init's center (rule.a: the normal's mean, or the
 * constant), above it for odd i + u + p, below for even */
static inline double target(int g, int k, int t, int u, int p, int64_t i) {
  double d = 1 + 0.3 * sin(0.3 * g + 0.7 * k + 0.11 * t + 0.013 * (double)i + 1.7 * u + 0.5 * p);
  return P[u][p].rule.a + ((i + u + p) & 1 ? d : -d);
}
static double coef(int64_t i) { return 1.0 + (double)(i % 3); }

typedef struct { double *w, *m, *v; } ref_param;

/* Gathers every unit's params and counts those farther than rel * |want| +
 * abs from the reference (0, 0: bit for bit). */
static int params_off(fsdp_unit **units, ref_param ref[NU][MAXP], double rel, double abs_tol, const char *label) {
  int bad = 0;
  for (int u = 0; u < NU; u++) {
    CHECK_OK(fsdp_unit_unshard(units[u]));
    CHECK_OK(fsdp_unit_wait(units[u], NULL));
    const float *w = fsdp_unit_params(units[u]);
    for (int p = 0; p < unit_np[u] && w; p++) {
      int64_t off = fsdp_layout_param_offset(fsdp_unit_layout(units[u]), p);
      for (int64_t i = 0; i < P[u][p].n; i++) {
        double want = rel == 0 ? (double)(float)ref[u][p].w[i] : ref[u][p].w[i], got = w[off + i];
        if (!(fabs(got - want) <= rel * fabs(want) + abs_tol) && bad++ < 3)
          fprintf(stderr, "rank %d %s: %s[%lld] = %.9g, expected %.9g\n", R, label, P[u][p].name, (long long)i, got,
                  want);
      }
    }
    CHECK_OK(fsdp_unit_reshard(units[u], NULL));
  }
  return bad;
}

/* reg: fsdp.comm_register's mode for the units and pools (a no-op on CPU
 * ranks: the same results, the same memory); red: the comm the reductions
 * run on (the shard group on another channel), or NULL for shard itself */
static void run(fsdp_comm *shard, fsdp_comm *red, fsdp_comm *outer, int zero, int K, int hfsdp, int reg,
                const char *label) {
  fsdp_unit_config cfg = {.zero = zero, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG,
                          .param_align = 16, .shard_align = 32, .hfsdp = hfsdp, .comm_register = reg};
  fsdp_pool *pp = NULL, *gp = NULL;
  size_t maxbytes = 0;
  for (int u = 0; u < NU; u++) {
    int64_t t = 0;
    for (int p = 0; p < unit_np[u]; p++) t += P[u][p].n + 16;
    maxbytes = (size_t)(t + 32 * 8) * 4 > maxbytes ? (size_t)(t + 32 * 8) * 4 : maxbytes;
  }
  fsdp_memory_stats before, after;
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &before));
  int64_t slots[2] = {(int64_t)maxbytes, (int64_t)maxbytes};
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, &pp));
  CHECK_OK(fsdp_pool_create(FSDP_CPU, 2, slots, &gp));
  if (reg) {
    CHECK_OK(fsdp_pool_register(pp, shard, reg));
    CHECK_OK(fsdp_pool_register(gp, red ? red : shard, reg));
    CHECK_FAILS(fsdp_pool_register(gp, shard, reg), FSDP_ESTATE, "registered already");
  }
  fsdp_unit *units[NU] = {0};
  ref_param ref[NU][MAXP];
  for (int u = 0; u < NU; u++) {
    const char *names[MAXP];
    int64_t n[MAXP];
    fsdp_init_rule rules[MAXP];
    uint8_t nd[MAXP];
    for (int p = 0; p < unit_np[u]; p++) {
      names[p] = P[u][p].name;
      n[p] = P[u][p].n;
      rules[p] = P[u][p].rule;
      nd[p] = P[u][p].no_decay;
      /* reference starts from the same fp32 values: one draw of the whole parameter */
      float *f = malloc((size_t)n[p] * 4);
      fsdp_layout *l1;
      fsdp_layout_create(1, &n[p], 1, 1, 1, &l1);
      fsdp_layout_init_shard(l1, 0, &names[p], &rules[p], 7, f, FSDP_FP32);
      fsdp_layout_destroy(l1);
      ref[u][p].w = malloc((size_t)n[p] * 8);
      ref[u][p].m = calloc((size_t)n[p], 8);
      ref[u][p].v = calloc((size_t)n[p], 8);
      for (int64_t i = 0; i < n[p]; i++) ref[u][p].w[i] = f[i];
      free(f);
    }
    char name[32];
    snprintf(name, sizeof name, "unit%d", u);
    fsdp_unit_spec spec = {.name = name, .nparams = unit_np[u], .param_names = names, .numels = n, .rules = rules,
                           .no_decay = nd, .seed = 7, .shard = shard, .reduce = red, .outer = outer,
                           .param_pool = pp, .grad_pool = gp, .config = cfg};
    CHECK_OK(fsdp_unit_create(&spec, &units[u]));
  }
  /* before any step, the gathered params are the reference's fp32 init, bit for bit */
  CHECK(params_off(units, ref, 0, 0, label) == 0);
  /* resident bytes per buffer: exactly what the ZeRO level and layout say,
   * and together with the two pools exactly what the allocator handed out */
  CHECK_OK(fsdp_memory_get_stats(FSDP_CPU, &after));
  int64_t predicted = 2 * 2 * (int64_t)maxbytes, max_shard = 0;
  for (int u = 0; u < NU; u++) {
    fsdp_unit_memory mem;
    CHECK_OK(fsdp_unit_memory_info(units[u], &mem));
    predicted += mem.params_full + mem.params_shard + mem.main_params + mem.optimizer + mem.grads_full +
                 mem.grads_main + mem.scratch;
    int64_t S = fsdp_layout_shard_numel(fsdp_unit_layout(units[u])), T = S * fsdp_comm_size(shard);
    int64_t opt_n = zero == 0 ? T : hfsdp ? S / fsdp_comm_size(outer) : S;
    CHECK(mem.shard_numel == S && mem.total_numel == T);
    /* fp32 params: the compute params are the main params (no copy), but
     * for HFSDP (main holds a part of the shard) and registered buffers */
    int alias = !hfsdp && !reg;
    CHECK(mem.params_full == (zero <= 2 && !(zero == 0 && alias) ? T * 4 : 0));
    CHECK(mem.params_shard == (zero >= 1 && !alias ? S * 4 : 0));
    CHECK(mem.main_params == opt_n * 4 && mem.optimizer == 2 * opt_n * 4);
    CHECK(mem.grads_main == opt_n * 4 + (hfsdp ? S * 4 : 0));
    CHECK(mem.grads_full == (zero <= 1 ? T * 4 : 0));
    CHECK(mem.scratch == 0);
    if (S > max_shard) max_shard = S;
  }
  /* one fp32 staging shard for the group, as big as the largest unit's;
   * none in a group of one rank (a reduction only adds the full grads),
   * but for HFSDP's publish */
  fsdp_comm *sc = red ? red : shard; /* the scratch belongs to the reductions' comm */
  int alone = fsdp_comm_size(shard) == 1;
  CHECK(fsdp_comm_scratch_bytes(sc) == (alone && !hfsdp ? 0 : max_shard * 4));
  CHECK(red == NULL || fsdp_comm_scratch_bytes(shard) == 0);
  predicted += fsdp_comm_scratch_bytes(sc);
  CHECK(after.allocated - before.allocated == predicted);
  fsdp_adamw_config opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  int bad_norm = 0, cancel = 0;
  for (int t = 1; t <= STEPS; t++) {
    for (int k = 0; k < K; k++) {
      for (int u = 0; u < NU; u++) { /* forward: gather, prefetch the next, release */
        CHECK(fsdp_unit_unshard(units[u]) >= 0);
        if (u + 1 < NU) CHECK(fsdp_unit_unshard(units[u + 1]) >= 0);
        CHECK_OK(fsdp_unit_wait(units[u], NULL));
        CHECK_OK(fsdp_unit_reshard(units[u], NULL));
      }
      for (int u = NU - 1; u >= 0; u--) { /* backward: grads from the gathered params */
        CHECK(fsdp_unit_unshard(units[u]) == 0);
        if (u > 0) CHECK(fsdp_unit_unshard(units[u - 1]) >= 0);
        CHECK_OK(fsdp_unit_wait(units[u], NULL));
        const float *w = fsdp_unit_params(units[u]);
        float *g = NULL;
        CHECK_OK(fsdp_unit_grads(units[u], NULL, (void **)&g));
        if (!w || !g) return;
        for (int p = 0; p < unit_np[u]; p++) { /* through per-parameter views */
          fsdp_tensor pv, gv;
          int64_t shape[1] = {P[u][p].n};
          CHECK_OK(fsdp_unit_param_view(units[u], p, FSDP_VIEW_PARAM, 1, shape, &pv));
          CHECK_OK(fsdp_unit_param_view(units[u], p, FSDP_VIEW_GRAD, 1, shape, &gv));
          if (!pv.data || !gv.data) return;
          const float *pw = pv.data;
          float *pg = gv.data;
          for (int64_t i = 0; i < P[u][p].n; i++)
            pg[i] += (float)(coef(i) * ((double)pw[i] - target(R, k, t, u, p, i)));
        }
        CHECK_OK(fsdp_unit_reshard(units[u], NULL));
        if (t == 1 && k == 0) { /* misuse: a sharded unit, a wrong shape, a missing param */
          fsdp_tensor v;
          int64_t wrong[2] = {P[u][0].n, 2};
          if (zero == 3)
            CHECK_FAILS(fsdp_unit_param_view(units[u], 0, FSDP_VIEW_PARAM, 1, wrong, &v), FSDP_ESTATE, "unshard and wait");
          else
            CHECK_FAILS(fsdp_unit_param_view(units[u], 0, FSDP_VIEW_PARAM, 2, wrong, &v), FSDP_EINVAL, "the view's shape has");
          CHECK_FAILS(fsdp_unit_param_view(units[u], 9, FSDP_VIEW_GRAD, 1, wrong, &v), FSDP_EINVAL, "does not exist");
        }
        CHECK_OK(fsdp_unit_reduce(units[u], NULL, k == K - 1));
        if (k == K - 1 && u % 2 == 0) CHECK_OK(fsdp_unit_grad_norm_start(units[u])); /* queued behind the reduce */
      }
    }
    float sums[NU];
    for (int u = 0; u < NU; u++) {
      double s;
      int64_t nonfinite;
      CHECK_OK(fsdp_unit_synchronize(units[u]));
      if (u % 2 == 0) { /* started early on the comm stream: the same sum as computed now */
        double early;
        int64_t bad_early;
        CHECK_OK(fsdp_unit_grad_norm_get(units[u], &early, &bad_early));
        CHECK_OK(fsdp_unit_grad_sumsq(units[u], &s, &nonfinite));
        CHECK(early == s && bad_early == nonfinite);
      } else {
        CHECK_OK(fsdp_unit_grad_sumsq(units[u], &s, &nonfinite));
      }
      CHECK(nonfinite == 0);
      sums[u] = (float)s;
    }
    CHECK_OK(fsdp_comm_all_reduce(shard, sums, sums, NU, FSDP_FP32, FSDP_SUM));
    CHECK_OK(fsdp_comm_synchronize(shard));
    if (hfsdp) { /* the replicas hold different parts of the grads too */
      CHECK_OK(fsdp_comm_all_reduce(outer, sums, sums, NU, FSDP_FP32, FSDP_SUM));
      CHECK_OK(fsdp_comm_synchronize(outer));
    }
    double norm = sqrt((double)sums[0] + sums[1] + sums[2]);
    float clip = (float)fmin(1.0, 1.0 / (norm + 1e-6));
    for (int u = 0; u < NU; u++) CHECK_OK(fsdp_unit_step(units[u], t, &opt, clip));
    /* reference step in float64 */
    double rnorm2 = 0;
    double *G[NU][MAXP];
    for (int u = 0; u < NU; u++)
      for (int p = 0; p < unit_np[u]; p++) {
        G[u][p] = calloc((size_t)P[u][p].n, 8);
        for (int64_t i = 0; i < P[u][p].n; i++) {
          double s = 0, mag = 0;
          for (int k = 0; k < K; k++)
            for (int g = 0; g < W; g++) {
              double term = coef(i) * (ref[u][p].w[i] - target(g, k, t, u, p, i)) / W;
              s += term;
              mag += fabs(term);
            }
          if (fabs(s) < 0.5 * mag) cancel++; /* the data's promise (see the top) */
          G[u][p][i] = s;
          rnorm2 += s * s;
        }
      }
    double rnorm = sqrt(rnorm2), rclip = fmin(1.0, 1.0 / (rnorm + 1e-6));
    if (fabs(norm - rnorm) > 1e-5 * rnorm) bad_norm++;
    double c1 = 1 / (1 - pow(0.9, t)), c2 = 1 / (1 - pow(0.95, t));
    for (int u = 0; u < NU; u++)
      for (int p = 0; p < unit_np[u]; p++) {
        ref_param *rp = &ref[u][p];
        double wd = P[u][p].no_decay ? 0 : 0.1;
        for (int64_t i = 0; i < P[u][p].n; i++) {
          double g = G[u][p][i] * rclip;
          rp->w[i] *= 1 - 1e-2 * wd;
          rp->m[i] = 0.9 * rp->m[i] + 0.1 * g;
          rp->v[i] = 0.95 * rp->v[i] + 0.05 * g * g;
          rp->w[i] -= 1e-2 * (rp->m[i] * c1) / (sqrt(rp->v[i] * c2) + 1e-8);
        }
        free(G[u][p]);
      }
  }
  CHECK(cancel == 0);
  CHECK(bad_norm == 0);
  int bad = params_off(units, ref, 1e-5, 1e-6, label);
  if (bad) fprintf(stderr, "rank %d %s: %d parameters off\n", R, label, bad);
  CHECK(bad == 0);
  /* prefetch used both buffers, never more; one rank gathers nothing (its
   * shard is the full unit) */
  if (zero == 3) CHECK(fsdp_pool_peak(pp) == (fsdp_comm_size(shard) > 1 ? 2 : 0));
  for (int u = 0; u < NU; u++) {
    fsdp_unit_destroy(units[u]);
    for (int p = 0; p < unit_np[u]; p++) {
      free(ref[u][p].w);
      free(ref[u][p].m);
      free(ref[u][p].v);
    }
  }
  CHECK(fsdp_pool_live(pp) == 0 && fsdp_pool_live(gp) == 0);
  fsdp_pool_destroy(pp);
  fsdp_pool_destroy(gp);
}

int main(void) {
  fsdp_proc_info info;
  if (fsdp_init(&info) < 0) return 1;
  W = info.size;
  R = info.rank;
  fsdp_init_rule normal = {.kind = FSDP_INIT_NORMAL, .a = 0.0, .b = 0.02};
  fsdp_init_rule zeros = {.kind = FSDP_INIT_CONSTANT, .a = 0, .b = 0};
  fsdp_init_rule ones = {.kind = FSDP_INIT_CONSTANT, .a = 1, .b = 0};
  P[0][0] = (pspec){"embed.weight", 1000, normal, 0};
  P[0][1] = (pspec){"embed.bias", 7, zeros, 1};
  P[1][0] = (pspec){"layers.0.w", 2048, normal, 0};
  P[1][1] = (pspec){"layers.0.norm.weight", 33, ones, 1};
  P[2][0] = (pspec){"head.weight", 999, normal, 0};

  fsdp_mesh *m = NULL;
  fsdp_comm *dp = fsdp_test_world(FSDP_CPU, &m);
  char label[64];
  for (int zero = 0; zero <= 3 && dp; zero++)
    for (int K = 1; K <= 3; K += 2) {
      snprintf(label, sizeof label, "zero %d, %d micro-batch(es)", zero, K);
      run(dp, NULL, NULL, zero, K, 0, 0, label);
    }
  for (int zero = 0; zero <= 3 && dp; zero++) {
    snprintf(label, sizeof label, "zero %d, registered buffers, 2 micro-batches", zero);
    run(dp, NULL, NULL, zero, 2, 0, FSDP_REG_WINDOW, label);
  }
  fsdp_comm *red = NULL; /* the reductions on their own channel (and stream) */
  if (dp) CHECK_OK(fsdp_mesh_group_channel(m, "world", 1, &red));
  for (int zero = 0; zero <= 3 && red; zero++) {
    snprintf(label, sizeof label, "zero %d, reductions on channel 1", zero);
    run(dp, red, NULL, zero, 3, 0, 0, label);
  }
  if (red) {
    CHECK(red != dp && strstr(fsdp_comm_name(red), "#1") != NULL);
    fsdp_comm *again = NULL;
    CHECK_OK(fsdp_mesh_group_channel(m, "world", 1, &again));
    CHECK(again == red);
    CHECK_FAILS(fsdp_mesh_group_channel(m, "world", 9, &again), FSDP_EINVAL, "channel 9");
  }
  if (dp) { /* the CPU transport registers nothing, and says so */
    fsdp_comm_reg *r = NULL;
    void *b = NULL;
    CHECK_OK(fsdp_comm_mem_alloc(dp, FSDP_REG_BUFFER, 64, &b));
    CHECK_OK(fsdp_comm_register(dp, b, 64, FSDP_REG_BUFFER, &r));
    CHECK(r != NULL && !fsdp_comm_reg_active(r));
    CHECK_OK(fsdp_comm_deregister(dp, r));
    CHECK_OK(fsdp_comm_mem_free(dp, FSDP_REG_BUFFER, b));
    CHECK_FAILS(fsdp_comm_register(dp, NULL, 0, 9, &r), FSDP_EINVAL, "expected FSDP_REG_NONE");
  }
  if (W == 4) {
    const char *d2[] = {"dp_outer", "dp_shard"};
    int64_t s2[] = {2, 2};
    fsdp_mesh *h = NULL;
    fsdp_comm *sh = NULL, *out = NULL;
    CHECK_OK(fsdp_mesh_create(2, d2, s2, FSDP_CPU, &h));
    CHECK_OK(fsdp_mesh_group(h, "dp_shard", &sh));
    CHECK_OK(fsdp_mesh_group(h, "dp_outer", &out));
    for (int hf = 0; hf <= 1; hf++)
      for (int zero = 1; zero <= 3 && sh && out; zero++)
        for (int K = 1; K <= 3; K += 2) {
          snprintf(label, sizeof label, "%s 2x2 zero %d, %d micro-batch(es)", hf ? "HFSDP" : "HSDP", zero, K);
          run(sh, NULL, out, zero, K, hf, 0, label);
        }
    fsdp_comm *sh1 = NULL;
    CHECK_OK(fsdp_mesh_group_channel(h, "dp_shard", 1, &sh1));
    for (int hf = 0; hf <= 1 && sh1 && out; hf++) {
      snprintf(label, sizeof label, "%s 2x2 zero 3, reductions on channel 1, 2 micro-batches", hf ? "HFSDP" : "HSDP");
      run(sh, sh1, out, 3, 2, hf, 0, label);
    }
    fsdp_mesh_destroy(h);
  }
  /* a config the unit refuses, naming the field */
  fsdp_unit *u = NULL;
  int64_t n = 4;
  const char *nm[] = {"x"};
  fsdp_unit_spec bad = {.name = "u", .nparams = 1, .param_names = nm, .numels = &n, .rules = &P[0][0].rule, .seed = 1,
                        .shard = dp,
                        .config = {.zero = 4, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32,
                                   .grad_op = FSDP_AVG, .param_align = 1, .shard_align = 1}};
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "zero = 4");
  bad.config.zero = 1, bad.config.comm_register = 5;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "comm_register = 5");
  bad.config.zero = 2, bad.config.comm_register = 0, bad.config.offload = FSDP_OFFLOAD_PARAMS;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "offloading the params (offload = {params = true}) needs zero 3");
  bad.config.offload = 9;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "offload = 9");
  bad.config.zero = 1, bad.config.offload = FSDP_OFFLOAD_OPTIMIZER | FSDP_OFFLOAD_GRADS, bad.outer = dp;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "offloading the grads needs no outer");
  bad.config.offload = 0, bad.config.hfsdp = 1, bad.outer = NULL;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "needs an outer group");
  bad.config.hfsdp = 0, bad.param_names = NULL;
  CHECK_FAILS(fsdp_unit_create(&bad, &u), FSDP_EINVAL, "no names");
  /* the planner (fsdp_unit_plan_make) refuses every config creation
   * refuses, with the same message: `fsdp plan` never shows a plan that
   * creation would not make */
  {
    fsdp_layout *lay = NULL;
    CHECK_OK(fsdp_layout_create(1, &n, 2, 1, 1, &lay));
    struct {
      fsdp_unit_config c;
      int outer;
      const char *says;
    } cases[] = {
        {{.zero = 4, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG}, 1, "zero = 4"},
        {{.zero = 1, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG, .comm_register = 5}, 1,
         "comm_register = 5"},
        {{.zero = 2, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG,
          .offload = FSDP_OFFLOAD_PARAMS}, 1, "offloading the params (offload = {params = true}) needs zero 3"},
        {{.zero = 0, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG,
          .offload = FSDP_OFFLOAD_OPTIMIZER}, 1, "offload needs zero >= 1"},
        {{.zero = 1, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG,
          .offload = FSDP_OFFLOAD_OPTIMIZER | FSDP_OFFLOAD_GRADS}, 2, "offloading the grads needs no outer"},
        {{.zero = 0, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG, .hfsdp = 1}, 2,
         "hfsdp shards the optimizer over the outer group: it needs zero >= 1"},
        {{.zero = 1, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_BF16, .grad_op = FSDP_AVG}, 1,
         "reduce dtype must be fp32 or the compute dtype"},
        {{.zero = 1, .compute_dtype = FSDP_FP32, .reduce_dtype = FSDP_FP32, .grad_op = FSDP_AVG, .micro_batches = -1}, 1,
         "micro_batches = -1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      fsdp_unit_plan plan;
      CHECK_FAILS(fsdp_unit_plan_make(&cases[i].c, lay, FSDP_CPU, cases[i].outer, 0, &plan), FSDP_EINVAL, cases[i].says);
      CHECK_FAILS(fsdp_unit_config_check(&cases[i].c, cases[i].outer), FSDP_EINVAL, cases[i].says);
    }
    fsdp_layout_destroy(lay);
  }
  fsdp_mesh_destroy(m);
  snprintf(label, sizeof label, "test_units[%d/%d]", R, W);
  int rc = fsdp_test_summary(label);
  fsdp_finalize();
  return rc;
}
