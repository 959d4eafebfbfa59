/* arrival.c: which ranks reached fsdp_init. Each rank publishes a key
 * there; a rank whose fence timed out asks for every other rank's at once,
 * and names those whose key does not come. */
#include "arrival.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/log.h"
#include "../fsdp_dist.h"

static const char *const REACHED_INIT = "fsdp.reached_init";

void fsdp_arrival_announce(void) {
  pmix_value_t v;
  memset(&v, 0, sizeof v);
  v.type = PMIX_INT;
  v.data.integer = 1;
  if (PMIx_Put(PMIX_GLOBAL, REACHED_INIT, &v) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
    fsdp_log(FSDP_LOG_DEBUG, "fsdp_init: could not publish %s; a fence timeout will not name missing ranks", REACHED_INIT);
}

/* Every other rank's REACHED_INIT is asked for at once (PMIx_Get_nb, the
 * server holding each request until that rank commits it, or PROBE_S): a
 * rank whose key does not come has not called fsdp_init. The set is freed
 * by the last answer, so a late one never touches freed memory. */
enum { PROBE_S = 2 };

/* PMIx reads the request's proc and info on its own thread later: both
 * live until the answer */
typedef struct probe_set {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int pending, abandoned;
  unsigned char *arrived; /* per rank */
  pmix_info_t timeout;
} probe_set;

typedef struct probe {
  probe_set *set;
  int rank;
  pmix_proc_t proc;
} probe;

static void probe_set_free(probe_set *s) {
  PMIX_INFO_DESTRUCT(&s->timeout);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->arrived);
  free(s);
}

static void probe_answer(pmix_status_t st, pmix_value_t *kv, void *cbdata) {
  probe *p = cbdata;
  probe_set *s = p->set;
  if (kv) PMIX_VALUE_RELEASE(kv);
  pthread_mutex_lock(&s->mu);
  if (st == PMIX_SUCCESS) s->arrived[p->rank] = 1;
  int last = --s->pending == 0, gone = s->abandoned;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  free(p);
  if (last && gone) probe_set_free(s);
}

int fsdp_arrival_missing(const pmix_proc_t *me, int rank, int size, char *out, size_t cap) {
  out[0] = 0;
  int n = size;
  probe_set *s = calloc(1, sizeof *s);
  if (!s || !(s->arrived = calloc((size_t)n, 1))) {
    free(s);
    return 0;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  s->arrived[rank] = 1;
  int secs = PROBE_S;
  PMIX_INFO_LOAD(&s->timeout, PMIX_TIMEOUT, &secs, PMIX_INT);
  for (int r = 0; r < n; r++) {
    if (r == rank) continue;
    probe *p = malloc(sizeof *p);
    if (!p) {
      s->arrived[r] = 1; /* unknown: not named */
      continue;
    }
    *p = (probe){s, r, *me};
    p->proc.rank = (pmix_rank_t)r;
    pthread_mutex_lock(&s->mu);
    s->pending++;
    pthread_mutex_unlock(&s->mu);
    if (PMIx_Get_nb(&p->proc, REACHED_INIT, &s->timeout, 1, probe_answer, p) != PMIX_SUCCESS) {
      pthread_mutex_lock(&s->mu);
      s->pending--;
      s->arrived[r] = 1;
      pthread_mutex_unlock(&s->mu);
      free(p);
    }
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += PROBE_S + 3;
  pthread_mutex_lock(&s->mu);
  while (s->pending > 0 && pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0) {
  }
  int complete = s->pending == 0;
  size_t used = 0;
  for (int r = 0; r < n; r++) { /* no answer yet counts as none */
    if (s->arrived[r]) continue;
    int last = r;
    while (last + 1 < n && !s->arrived[last + 1]) last++;
    int w = last > r ? snprintf(out + used, cap - used, "%s%d-%d", used ? ", " : "", r, last)
                     : snprintf(out + used, cap - used, "%s%d", used ? ", " : "", r);
    if (w < 0 || (size_t)w >= cap - used) {
      snprintf(out + (cap > 6 ? cap - 6 : 0), cap > 6 ? 6 : cap, ", ...");
      break;
    }
    used += (size_t)w;
    r = last;
  }
  s->abandoned = !complete; /* answers still to come: the last one frees the set */
  pthread_mutex_unlock(&s->mu);
  if (complete) probe_set_free(s);
  return 1;
}
