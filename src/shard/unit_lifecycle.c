/* unit_lifecycle.c: a unit's two state machines, named, and the one place
 * their transitions are checked. A call out of order (a wait before its
 * unshard, a reduce twice, a step before the last micro-batch's reduce, a
 * new micro-batch's grads on top of reduced ones) would otherwise compute a
 * wrong result without a word; here it is refused with the unit's name, the
 * state it is in and the call that would be right.
 *
 *   params (zero 3)  SHARDED --unshard--> GATHERING --wait--> GATHERED
 *                    any --reshard--> SHARDED
 *   params (zero 0-2) RESIDENT, always (unshard, wait, reshard: no-ops)
 *
 *   grads  CLEAN --grads--> ACCUMULATING --reduce(sync 0)--> ACCUMULATING
 *                           ACCUMULATING --reduce(sync 1)--> REDUCED
 *          REDUCED --step--> CLEAN;  any --zero_grad--> CLEAN
 *
 * An operation checks its event first (fsdp_unit_check) and enters the new
 * state only once it has succeeded (fsdp_unit_enter), so a refused or
 * failed call leaves the unit as it was. Before either, the unit's rows
 * must be on the device (fsdp_unit_placed_check: phase offload). */
#include "../base/error.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

static const char *const params_names[] = {"sharded", "gathering", "gathered", "resident"};
static const char *const grads_names[] = {"clean", "accumulating", "reduced"};

const char *fsdp_unit_params_state_name(int s) {
  return s >= 0 && s <= FSDP_PARAMS_RESIDENT ? params_names[s] : "?";
}
const char *fsdp_unit_grads_state_name(int s) { return s >= 0 && s <= FSDP_GRADS_REDUCED ? grads_names[s] : "?"; }

int fsdp_unit_states(const fsdp_unit *u, int *params, int *grads) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_states: NULL unit");
  if (params) *params = u->params_state;
  if (grads) *grads = u->grads_state;
  return FSDP_OK;
}

/* the state an event leads to from each state; -1: refused. The grads'
 * events follow the params' (unit_event), their rows from GRADS_FIRST. */
#define GRADS_FIRST UNIT_EV_GRADS
static const signed char params_next[GRADS_FIRST][4] = {
    /*                 SHARDED GATHERING GATHERED RESIDENT */
    [UNIT_EV_UNSHARD] = {1, 1, 2, 3},
    [UNIT_EV_WAIT] = {-1, 2, 2, 3},
    [UNIT_EV_RESHARD] = {0, 0, 0, 3},
};
static const signed char grads_next[UNIT_EV_ZERO_GRAD - GRADS_FIRST + 1][3] = {
    /*                     CLEAN ACCUMULATING REDUCED */
    [UNIT_EV_GRADS - GRADS_FIRST] = {1, 1, -1},
    [UNIT_EV_REDUCE_PART - GRADS_FIRST] = {-1, 1, -1},
    [UNIT_EV_REDUCE_LAST - GRADS_FIRST] = {-1, 2, -1},
    [UNIT_EV_STEP - GRADS_FIRST] = {-1, -1, 0},
    [UNIT_EV_ZERO_GRAD - GRADS_FIRST] = {0, 0, 0},
};

static const char *const event_names[] = {"unshard()", "wait()", "reshard()", "grads()", "reduce() of a micro-batch",
                                          "reduce() of the last micro-batch", "step()", "zero_grad()"};

/* what a refused event should have been preceded by, from the state it met */
static const char *advice(unit_event e, int state) {
  switch (e) {
  case UNIT_EV_WAIT: return "unshard() first (or it was deferred at the pool's bound: unshard() again)";
  case UNIT_EV_GRADS:
    return "the last micro-batch's grads were reduced: step() or zero_grad() before the next step's backward, or "
           "its grads would add to theirs";
  case UNIT_EV_REDUCE_PART:
  case UNIT_EV_REDUCE_LAST:
    return state == FSDP_GRADS_CLEAN ? "no backward wrote grads since the last step: grads() first"
                                     : "the step's grads were reduced already: a second reduce would count them twice";
  case UNIT_EV_STEP:
    return state == FSDP_GRADS_CLEAN ? "no grads were reduced since the last step: run a backward and reduce() first"
                                     : "the last micro-batch's reduce() (sync = 1) must come first, or the step "
                                       "reads grads that are not summed over the ranks";
  default: return "";
  }
}

/* where the rows are (unit_phase.c): every call needs its params on the
 * device, the grads' calls (and the state's) everything */
static const char *const placed_names[] = {"on the device", "on the device for forwards only (its params)",
                                           "in host memory (offloaded)"};

int fsdp_unit_placed_check(const fsdp_unit *u, int need_all, const char *what) {
  if (u->placed == FSDP_PLACED_DEVICE || (!need_all && u->placed == FSDP_PLACED_PARAMS)) return FSDP_OK;
  return fsdp_fail(FSDP_ESTATE, "unit '%s': %s while its state is %s: onload()%s first", u->name, what,
                   placed_names[u->placed], need_all && u->placed == FSDP_PLACED_PARAMS ? " of everything" : "");
}

int fsdp_unit_check(const fsdp_unit *u, unit_event e) {
  int params = e < GRADS_FIRST;
  FSDP_CHECK(fsdp_unit_placed_check(u, !params, event_names[e]));
  int state = params ? u->params_state : u->grads_state;
  int next = params ? params_next[e][state] : grads_next[e - GRADS_FIRST][state];
  if (next >= 0) return FSDP_OK;
  return fsdp_fail(FSDP_ESTATE, "unit '%s': %s while its %s are %s: %s", u->name, event_names[e],
                   params ? "params" : "grads",
                   params ? params_names[state] : grads_names[state], advice(e, state));
}

void fsdp_unit_enter(fsdp_unit *u, unit_event e) {
  if (e < GRADS_FIRST) {
    int next = params_next[e][u->params_state];
    if (next >= 0) u->params_state = next;
  } else {
    int next = grads_next[e - GRADS_FIRST][u->grads_state];
    if (next >= 0) u->grads_state = next;
  }
}
