/* fsdp_prepare.c: `fsdp prepare ...` runs the data preparation tool,
 * scripts/prepare_data.py (tokenizers and pyarrow: Python, not the engine),
 * with the project's Python environment, which scripts/python_env.sh makes
 * on demand and names on its stdout. The arguments pass through unchanged,
 * so `fsdp prepare --help` is the tool's own help. */
#include "fsdp_prepare.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int has_tool(const char *dir) {
  char p[PATH_MAX];
  return snprintf(p, sizeof p, "%s/prepare_data.py", dir) < (int)sizeof p && access(p, R_OK) == 0;
}

/* The scripts folder, found as the Lua package is: FSDP_SCRIPTS_DIR; the
 * source tree's, where the build put its path; beside FSDP_LUA_PATH (a
 * checkout of its own); above this binary (a build folder inside a checkout
 * carried elsewhere). tried: what was looked at, for the error. */
static int scripts_dir(char *out, size_t cap, char *tried, size_t tcap) {
  const char *env = getenv("FSDP_SCRIPTS_DIR");
  if (env && env[0]) {
    snprintf(tried, tcap, "%s (FSDP_SCRIPTS_DIR)", env);
    if (!has_tool(env)) return 0;
    snprintf(out, cap, "%s", env);
    return 1;
  }
  char cand[3][PATH_MAX];
  int n = 0;
  snprintf(cand[n++], PATH_MAX, "%s", FSDP_SCRIPTS_DIR);
  const char *lua = getenv("FSDP_LUA_PATH");
  if (lua && lua[0]) snprintf(cand[n++], PATH_MAX, "%s/../scripts", lua);
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      snprintf(cand[n++], PATH_MAX, "%.*s/../scripts", PATH_MAX - 16, self);
    }
  }
  tried[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (has_tool(cand[i])) {
      snprintf(out, cap, "%s", cand[i]);
      return 1;
    }
    size_t used = strlen(tried);
    snprintf(tried + used, tcap - used, "%s%s", i ? ", " : "", cand[i]);
  }
  return 0;
}

/* Runs DIR/python_env.sh (its messages go to our stderr) and returns the
 * python it printed, or NULL saying why. */
static char *python_of(const char *dir) {
  static char py[PATH_MAX];
  char script[PATH_MAX + 32];
  snprintf(script, sizeof script, "%s/python_env.sh", dir);
  int fds[2];
  if (pipe(fds) != 0) {
    fprintf(stderr, "fsdp prepare: pipe: %s\n", strerror(errno));
    return NULL;
  }
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "fsdp prepare: fork: %s\n", strerror(errno));
    return NULL;
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execlp("bash", "bash", script, (char *)NULL);
    fprintf(stderr, "fsdp prepare: cannot run bash %s: %s\n", script, strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  size_t used = 0;
  ssize_t got;
  while (used < sizeof py - 1 && (got = read(fds[0], py + used, sizeof py - 1 - used)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    used += (size_t)got;
  }
  close(fds[0]);
  py[used] = '\0';
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (used > 0 && (py[used - 1] == '\n' || py[used - 1] == ' ')) py[--used] = '\0';
  char *last = strrchr(py, '\n'); /* the python is its last line */
  char *p = last ? last + 1 : py;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !p[0] || access(p, X_OK) != 0) {
    char why[64 + PATH_MAX];
    if (WIFSIGNALED(status)) snprintf(why, sizeof why, "was ended by signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0) snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
    else snprintf(why, sizeof why, "printed '%s', not a python that can run", p);
    fprintf(stderr,
            "fsdp prepare: the project's Python environment could not be made: %s %s (its messages above say why; "
            "it needs python3 with venv and PyPI, or FSDP_PYTHON_ENV naming an environment it can install "
            "tokenizers and pyarrow into)\n",
            script, why);
    return NULL;
  }
  return p;
}

int fsdp_prepare_main(int argc, char **argv) {
  char dir[PATH_MAX], tried[3 * PATH_MAX + 64];
  if (!scripts_dir(dir, sizeof dir, tried, sizeof tried)) {
    fprintf(stderr,
            "fsdp prepare: scripts/prepare_data.py is not in %s; set FSDP_SCRIPTS_DIR to the scripts folder of an "
            "fsdp checkout\n",
            tried);
    return 1;
  }
  char *py = python_of(dir);
  if (!py) return 1;
  char tool[PATH_MAX + 32];
  snprintf(tool, sizeof tool, "%s/prepare_data.py", dir);
  char **args = calloc((size_t)argc + 1, sizeof *args);
  if (!args) return 1;
  args[0] = py;
  args[1] = tool;
  for (int i = 2; i < argc; i++) args[i] = argv[i];
  execv(py, args);
  fprintf(stderr, "fsdp prepare: cannot run %s: %s\n", py, strerror(errno));
  free(args);
  return 1;
}
