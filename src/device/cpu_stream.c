/* cpu_stream.c: CPU streams and events.
 *
 * A CPU stream is a worker thread draining a FIFO of tasks, so work enqueued
 * on a comm stream really runs concurrently with the caller (the overlap that
 * FSDP depends on is exercised on CPU ranks too). Workers sleep on a condition
 * variable when idle: no spinning, so 4 ranks fit on 2 cores.
 *
 * An event counts records (`recorded`) and completions (`completed`). A wait
 * captures `recorded` at the time of the wait, as cudaStreamWaitEvent does.
 * A failed stream stays failed: later tasks are skipped, but event records
 * still complete (carrying the failure) so that nobody waits forever. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_device.h"
#include "device_impl.h"

struct task {
  struct task *next;
  fsdp_task_fn fn;
  void *arg;
  void (*free_arg)(void *);
};

typedef struct cpu_stream {
  struct fsdp_stream base;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t wake;   /* worker: new task or stop */
  pthread_cond_t idle;   /* synchronize: queue drained */
  struct task *head, *tail;
  int busy;              /* worker is running a task */
  int stop;
  int status;            /* first failure, sticky */
  char error[1024];
} cpu_stream;

typedef struct cpu_event {
  struct fsdp_event base;
  pthread_mutex_t mu;
  pthread_cond_t done;
  uint64_t recorded, completed;
  int status;
  int timed;      /* fsdp_event_create_timed: done_at is kept */
  double done_at; /* host clock at the last completion */
  char error[1024];
} cpu_event;

static void *worker_main(void *p) {
  cpu_stream *s = p;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->wake, &s->mu);
    if (!s->head) break; /* stop requested and nothing left */
    struct task *t = s->head;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    int failed = s->status < 0;
    pthread_mutex_unlock(&s->mu);

    int rc = FSDP_OK;
    if (!failed || t->free_arg == NULL) rc = t->fn(t->arg); /* records (no free_arg) always run */
    if (t->free_arg) t->free_arg(t->arg);
    free(t);

    pthread_mutex_lock(&s->mu);
    if (rc < 0 && s->status == 0) {
      s->status = rc;
      strncpy(s->error, fsdp_last_error(), sizeof s->error - 1);
    }
    s->busy = 0;
    if (!s->head) pthread_cond_broadcast(&s->idle);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

int fsdp_cpu_stream_create(fsdp_stream **out) {
  cpu_stream *s = calloc(1, sizeof *s);
  if (!s) return fsdp_fail(FSDP_ENOMEM, "stream_create: out of memory");
  s->base.device = FSDP_CPU;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->wake, NULL);
  pthread_cond_init(&s->idle, NULL);
  int err = pthread_create(&s->thread, NULL, worker_main, s);
  if (err) {
    free(s);
    return fsdp_fail(FSDP_ENOMEM, "stream_create: cannot start a worker thread: %s", strerror(err));
  }
  *out = &s->base;
  return FSDP_OK;
}

int fsdp_cpu_stream_destroy(fsdp_stream *base) {
  cpu_stream *s = (cpu_stream *)base;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->idle);
  free(s);
  return FSDP_OK;
}

/* Records are enqueued with free_arg == NULL so that they run even on a
 * failed stream; every other task must pass a free_arg (a no-op is fine). */
static int enqueue(cpu_stream *s, fsdp_task_fn fn, void *arg, void (*free_arg)(void *)) {
  struct task *t = malloc(sizeof *t);
  if (!t) {
    if (free_arg) free_arg(arg);
    return fsdp_fail(FSDP_ENOMEM, "stream: out of memory for a task");
  }
  t->next = NULL;
  t->fn = fn;
  t->arg = arg;
  t->free_arg = free_arg;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  return FSDP_OK;
}

static void no_free(void *arg) { (void)arg; }

int fsdp_cpu_stream_enqueue(fsdp_stream *base, fsdp_task_fn fn, void *arg, void (*free_arg)(void *)) {
  cpu_stream *s = (cpu_stream *)base;
  pthread_mutex_lock(&s->mu);
  int st = s->status;
  pthread_mutex_unlock(&s->mu);
  if (st < 0) {
    if (free_arg) free_arg(arg);
    return fsdp_fail(st, "%s", s->error);
  }
  return enqueue(s, fn, arg, free_arg ? free_arg : no_free);
}

int fsdp_cpu_stream_synchronize(fsdp_stream *base) {
  cpu_stream *s = (cpu_stream *)base;
  pthread_mutex_lock(&s->mu);
  while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->mu);
  int st = s->status;
  pthread_mutex_unlock(&s->mu);
  return st < 0 ? fsdp_fail(st, "%s", s->error) : FSDP_OK;
}

/* ---- events ---- */

int fsdp_cpu_event_create(fsdp_event **out) {
  cpu_event *e = calloc(1, sizeof *e);
  if (!e) return fsdp_fail(FSDP_ENOMEM, "event_create: out of memory");
  e->base.device = FSDP_CPU;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->done, NULL);
  *out = &e->base;
  return FSDP_OK;
}

int fsdp_cpu_event_create_timed(fsdp_event **out) {
  FSDP_CHECK(fsdp_cpu_event_create(out));
  ((cpu_event *)*out)->timed = 1;
  return FSDP_OK;
}

/* when e completed; an error if it has not (or has no time kept) */
static int done_at(cpu_event *e, double *t) {
  pthread_mutex_lock(&e->mu);
  int ok = e->timed && e->recorded > 0 && e->completed >= e->recorded;
  *t = e->done_at;
  pthread_mutex_unlock(&e->mu);
  return ok ? FSDP_OK : fsdp_fail(FSDP_EINVAL, "event_elapsed: an event %s", e->timed ? "has not completed" : "not created timed");
}

int fsdp_cpu_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds) {
  double ta, tb;
  FSDP_CHECK(done_at((cpu_event *)a, &ta));
  FSDP_CHECK(done_at((cpu_event *)b, &tb));
  *seconds = tb - ta;
  return FSDP_OK;
}

int fsdp_cpu_event_destroy(fsdp_event *base) {
  cpu_event *e = (cpu_event *)base;
  (void)fsdp_cpu_event_synchronize(base); /* a pending record still points here */
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->done);
  free(e);
  return FSDP_OK;
}

struct record_args {
  cpu_event *e;
  cpu_stream *s;
  uint64_t target;
};

static void complete(cpu_event *e, uint64_t target, int status, const char *error) {
  pthread_mutex_lock(&e->mu);
  if (target > e->completed) e->completed = target;
  if (e->timed) e->done_at = fsdp_time_now();
  if (status < 0 && e->status == 0) {
    e->status = status;
    strncpy(e->error, error, sizeof e->error - 1);
  }
  pthread_cond_broadcast(&e->done);
  pthread_mutex_unlock(&e->mu);
}

static int record_task(void *arg) {
  struct record_args *a = arg;
  pthread_mutex_lock(&a->s->mu);
  int st = a->s->status;
  char error[1024];
  memcpy(error, a->s->error, sizeof error);
  pthread_mutex_unlock(&a->s->mu);
  complete(a->e, a->target, st, error);
  free(a);
  return FSDP_OK;
}

int fsdp_cpu_event_record(fsdp_event *base, fsdp_stream *sbase) {
  cpu_event *e = (cpu_event *)base;
  pthread_mutex_lock(&e->mu);
  uint64_t target = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (!sbase) {
    complete(e, target, 0, "");
    return FSDP_OK;
  }
  struct record_args *a = malloc(sizeof *a);
  if (!a) return fsdp_fail(FSDP_ENOMEM, "event_record: out of memory");
  a->e = e;
  a->s = (cpu_stream *)sbase;
  a->target = target;
  return enqueue(a->s, record_task, a, NULL);
}

static int wait_for(cpu_event *e, uint64_t target) {
  pthread_mutex_lock(&e->mu);
  while (e->completed < target) pthread_cond_wait(&e->done, &e->mu);
  int st = e->status;
  pthread_mutex_unlock(&e->mu);
  return st < 0 ? fsdp_fail(st, "%s", e->error) : FSDP_OK;
}

int fsdp_cpu_event_query(fsdp_event *base) {
  cpu_event *e = (cpu_event *)base;
  pthread_mutex_lock(&e->mu);
  int done = e->completed >= e->recorded;
  int st = e->status;
  pthread_mutex_unlock(&e->mu);
  if (st < 0) return fsdp_fail(st, "%s", e->error);
  return done;
}

int fsdp_cpu_event_synchronize(fsdp_event *base) {
  cpu_event *e = (cpu_event *)base;
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  pthread_mutex_unlock(&e->mu);
  return wait_for(e, target);
}

struct wait_args {
  cpu_event *e;
  uint64_t target;
};

static int wait_task(void *arg) {
  struct wait_args *a = arg;
  return wait_for(a->e, a->target);
}

int fsdp_cpu_stream_wait_event(fsdp_stream *sbase, fsdp_event *base) {
  cpu_event *e = (cpu_event *)base;
  struct wait_args *a = malloc(sizeof *a);
  if (!a) return fsdp_fail(FSDP_ENOMEM, "stream_wait_event: out of memory");
  a->e = e;
  pthread_mutex_lock(&e->mu);
  a->target = e->recorded;
  pthread_mutex_unlock(&e->mu);
  return fsdp_cpu_stream_enqueue(sbase, wait_task, a, free);
}
