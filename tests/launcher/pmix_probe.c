/* pmix_probe: a small PMIx client for the launcher tests. It joins the job,
 * reads what the launcher registered, exchanges a key with every peer
 * (put / commit / fence with data collection / get), prints
 * "rank R of N local L/LS ok", then misbehaves as asked on the command line.
 * Started without a launcher it runs as a singleton (rank 0 of 1).
 * It links PMIx only, so the launcher can be tested without the engine. */
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *usage_text =
    "usage: pmix_probe [options]\n"
    "  --rank-to-fail R   the rank that fails (default 0); the others sleep\n"
    "  --exit CODE        that rank exits with CODE after the exchange\n"
    "  --abort            that rank calls PMIx_Abort (status: --exit CODE, or 1)\n"
    "                     and then waits to be killed\n"
    "  --kill-self SIG    that rank sends itself signal number SIG\n"
    "  --fail-early CODE  that rank exits with CODE before PMIx_Init\n"
    "  --sleep S          sleep S seconds before finishing (default: 0, or 60\n"
    "                     for the ranks that wait while another one fails)\n"
    "  --print-lines K    K lines to stdout and K to stderr, then a last stdout\n"
    "                     line without a newline\n"
    "  --grandchild       fork a child that sleeps as long as this rank would\n"
    "  --ignore-term      ignore SIGTERM (to test the launcher's SIGKILL)\n"
    "  --marker WORD      ignored: lets a test find its processes with pgrep\n";

enum action { NONE, EXIT, ABORT, KILL_SELF, FAIL_EARLY };

static struct {
  enum action action;
  int code, sig, fail_rank, lines, grandchild, ignore_term;
  double sleep_s; /* < 0: not given */
} opt = {NONE, 1, 0, 0, 0, 0, 0, -1};

static void die(const char *what, pmix_status_t rc) {
  fprintf(stderr, "pmix_probe: %s: %s\n", what, PMIx_Error_string(rc));
  exit(10);
}

static long number(const char *flag, const char *s) {
  char *end;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end) {
    fprintf(stderr, "pmix_probe: %s expects a number\n%s", flag, usage_text);
    exit(2);
  }
  return v;
}

static void parse(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--rank-to-fail")) {
      opt.fail_rank = (int)number(a, v), i++;
    } else if (!strcmp(a, "--exit")) {
      opt.code = (int)number(a, v), i++;
      if (opt.action == NONE) opt.action = EXIT;
    } else if (!strcmp(a, "--abort")) {
      opt.action = ABORT;
    } else if (!strcmp(a, "--kill-self")) {
      opt.sig = (int)number(a, v), i++;
      opt.action = KILL_SELF;
    } else if (!strcmp(a, "--fail-early")) {
      opt.code = (int)number(a, v), i++;
      opt.action = FAIL_EARLY;
    } else if (!strcmp(a, "--sleep")) {
      opt.sleep_s = (double)number(a, v), i++;
    } else if (!strcmp(a, "--print-lines")) {
      opt.lines = (int)number(a, v), i++;
    } else if (!strcmp(a, "--grandchild")) {
      opt.grandchild = 1;
    } else if (!strcmp(a, "--ignore-term")) {
      opt.ignore_term = 1;
    } else if (!strcmp(a, "--marker") && v) {
      i++;
    } else {
      fprintf(stderr, "pmix_probe: unknown argument '%s'\n%s", a, usage_text);
      exit(2);
    }
  }
}

static void sleep_for(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0) {
  }
}

/* A uint32 from the job (rank WILDCARD) or from this process. */
static uint32_t get_u32(const pmix_proc_t *who, const char *key) {
  pmix_value_t *val = NULL;
  pmix_status_t rc = PMIx_Get(who, key, NULL, 0, &val);
  if (rc != PMIX_SUCCESS) die(key, rc);
  uint32_t out = 0;
  switch (val->type) {
  case PMIX_UINT32: out = val->data.uint32; break;
  case PMIX_UINT16: out = val->data.uint16; break;
  case PMIX_PROC_RANK: out = val->data.rank; break;
  default: fprintf(stderr, "pmix_probe: %s has type %d\n", key, (int)val->type); exit(10);
  }
  PMIX_VALUE_RELEASE(val);
  return out;
}

/* Every rank puts a value derived from its rank; every rank reads all of
 * them back after a collecting fence. */
static void exchange(const pmix_proc_t *me, uint32_t size) {
  pmix_value_t v;
  char text[64];
  snprintf(text, sizeof text, "hello from %u", me->rank);
  PMIX_VALUE_LOAD(&v, text, PMIX_STRING);
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, "probe.hello", &v);
  PMIX_VALUE_DESTRUCT(&v);
  if (rc != PMIX_SUCCESS) die("PMIx_Put", rc);
  if ((rc = PMIx_Commit()) != PMIX_SUCCESS) die("PMIx_Commit", rc);

  pmix_proc_t all;
  PMIX_LOAD_PROCID(&all, me->nspace, PMIX_RANK_WILDCARD);
  pmix_info_t info[2];
  bool yes = true;
  int secs = 20; /* a rank that never arrives must not hang the test forever */
  PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
  rc = PMIx_Fence(&all, 1, info, 2);
  PMIX_INFO_DESTRUCT(&info[0]);
  PMIX_INFO_DESTRUCT(&info[1]);
  if (rc != PMIX_SUCCESS) die("PMIx_Fence", rc);

  for (uint32_t r = 0; r < size; r++) {
    pmix_proc_t peer;
    pmix_value_t *got = NULL;
    PMIX_LOAD_PROCID(&peer, me->nspace, r);
    rc = PMIx_Get(&peer, "probe.hello", NULL, 0, &got);
    if (rc != PMIX_SUCCESS) die("PMIx_Get probe.hello", rc);
    snprintf(text, sizeof text, "hello from %u", r);
    if (got->type != PMIX_STRING || strcmp(got->data.string, text)) {
      fprintf(stderr, "pmix_probe: rank %u read a wrong value from rank %u\n", me->rank, r);
      exit(11);
    }
    PMIX_VALUE_RELEASE(got);
  }
}

static void print_lines(uint32_t rank) {
  for (int i = 0; i < opt.lines; i++) {
    printf("rank %u line %d\n", rank, i);
    fflush(stdout);
    fprintf(stderr, "rank %u err %d\n", rank, i);
  }
  printf("rank %u partial", rank); /* no newline: the launcher must still show it */
  fflush(stdout);
}

int main(int argc, char **argv) {
  parse(argc, argv);
  if (opt.ignore_term) signal(SIGTERM, SIG_IGN);
  int failing_job = opt.action != NONE;
  double wait_s = opt.sleep_s >= 0 ? opt.sleep_s : failing_job ? 60 : 0;

  /* Decide about failing early from the launcher's environment: there is
   * no PMIx yet to ask. */
  const char *env_rank = getenv("PMIX_RANK");
  if (opt.action == FAIL_EARLY && (env_rank ? atoi(env_rank) : 0) == opt.fail_rank) {
    fprintf(stderr, "pmix_probe: failing before PMIx_Init\n");
    return opt.code;
  }
  if (opt.grandchild && wait_s > 0 && fork() == 0) {
    sleep_for(wait_s); /* same command line as its parent, so pgrep finds it */
    _exit(0);
  }

  pmix_proc_t me;
  pmix_status_t rc = PMIx_Init(&me, NULL, 0);
  int singleton = rc == PMIX_ERR_UNREACH; /* no server: a usable singleton */
  if (rc != PMIX_SUCCESS && !singleton) die("PMIx_Init", rc);

  pmix_proc_t job;
  PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
  uint32_t size = get_u32(&job, PMIX_JOB_SIZE);
  uint32_t local_size = get_u32(&job, PMIX_LOCAL_SIZE);
  uint32_t local_rank = get_u32(&me, PMIX_LOCAL_RANK);
  if (me.rank >= size || local_rank >= local_size) {
    fprintf(stderr, "pmix_probe: inconsistent: rank %u of %u, local %u/%u\n", me.rank, size, local_rank,
            local_size);
    return 12;
  }
  exchange(&me, size);
  printf("rank %u of %u local %u/%u ok%s\n", me.rank, size, local_rank, local_size, singleton ? " (singleton)" : "");
  fflush(stdout);
  if (opt.lines) print_lines(me.rank);

  if (failing_job && (int)me.rank == opt.fail_rank) {
    switch (opt.action) {
    case EXIT: return opt.code; /* no PMIx_Finalize: an abrupt end */
    case KILL_SELF:
      signal(opt.sig, SIG_DFL); /* the sanitizers catch SIGSEGV: the default action, please */
      kill(getpid(), opt.sig);
      break;
    case ABORT:
      rc = PMIx_Abort(opt.code, "pmix_probe was asked to abort", NULL, 0);
      fprintf(stderr, "pmix_probe: PMIx_Abort returned %s; waiting to be killed\n", PMIx_Error_string(rc));
      for (;;) pause();
    default: break;
    }
  }
  sleep_for(wait_s);
  rc = PMIx_Finalize(NULL, 0);
  if (rc != PMIX_SUCCESS && !singleton) die("PMIx_Finalize", rc);
  return 0;
}
