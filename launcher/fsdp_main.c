/* fsdp: the rank host. LuaJIT with the engine: runs a Lua file (what
 * fsdprun starts on every rank), a string (-e), or an interactive prompt. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsdp.h"
#include "fsdp_prepare.h"

static const char *usage_text =
    "usage: fsdp FILE.lua [args...]     run a job file (arg[0] = FILE, arg[1..] = args)\n"
    "       fsdp -e 'lua code' [args...] run a string\n"
    "       fsdp [repl [RECIPE.lua] [--world W] [--mesh SPEC] [section.field=value ...]]\n"
    "                                    interactive prompt with the engine loaded as `fsdp`\n"
    "                                    and the shard-layout helpers (units(), layout(u),\n"
    "                                    owner(p, i), rank(r), mem(r), plan{...}, diff(a, b))\n"
    "       fsdp plan RECIPE.lua [--world W] [--mesh SPEC] [--json] [section.field=value ...]\n"
    "                                    per-rank memory and communication, no allocation\n"
    "       fsdp generate SOURCE [--prompt TEXT] [--max-new-tokens N] [--temperature T] ...\n"
    "                                    text from a checkpoint or a Hugging Face folder\n"
    "                                    (fsdp generate --help)\n"
    "       fsdp prepare --tokenizer DIR|bytes --out OUT INPUT... [options]\n"
    "                                    text (.txt, .jsonl, parquet, Arrow, folders of them)\n"
    "                                    -> OUT/train.bin, val.bin, manifest.json for\n"
    "                                    data.token_file; also `fsdp prepare encode|decode\n"
    "                                    --tokenizer DIR|bytes` (stdin to stdout) and\n"
    "                                    `fsdp prepare train-tokenizer --vocab-size N --out DIR\n"
    "                                    INPUT...`; `fsdp prepare --help` for the options.\n"
    "                                    Runs scripts/prepare_data.py in the Python environment\n"
    "                                    scripts/python_env.sh makes (.venv/, on first use)\n"
    "       fsdp --help | --version\n"
    "\n"
    "Ranks are normally started by the launcher: `fsdprun -n 4 FILE.lua`. Started\n"
    "alone, `fsdp FILE.lua` is a singleton (rank 0 of 1). Jobs use `require \"fsdp\"`.\n"
    "\n"
    "At the prompt: expressions are printed (`1+1`, `fsdp.init()`), statements run,\n"
    "an unfinished statement continues on the next line, errors are shown without\n"
    "leaving, Ctrl-D leaves. History is kept in ~/.fsdp_history. `help()` lists the\n"
    "helpers; docs/PLANNING.md explains them, the planner and scripted policies.\n"
    "\n"
    "Environment:\n"
    "  FSDP_LUA_PATH  directory holding the fsdp Lua package (default: the source tree's lua/)\n"
    "  FSDP_LIB       path of libfsdp.so (default: the one this binary was built with)\n"
    "  FSDP_HEADER    path of fsdp.h, read for the FFI declarations\n"
    "  FSDP_SCRIPTS_DIR  the scripts/ folder `fsdp prepare` runs from (default: the source\n"
    "                 tree's); FSDP_PYTHON_ENV: where python_env.sh makes its environment;\n"
    "                 FSDP_PYTHON: a Python with tokenizers and pyarrow, used instead\n"
    "  FSDP_LOG       error | warn | info | debug\n"
    "  FSDP_COMM_TIMEOUT  seconds a collective waits for its peers (default 300)\n"
    "  FSDP_TRACEBACK=1   a Lua stack trace with every error (by default only for errors\n"
    "                     that carry a source position: internal faults)\n"
    "  FSDP_CPU_THREADS   threads for the optimizer step on the host (default: cores / ranks,\n"
    "                     or the cores a launcher such as mpirun bound the rank to)\n"
    "  FSDP_BLAS_THREADS  OpenBLAS threads for every CPU GEMM (default: by its size, one per\n"
    "                     4 MFLOP (FSDP_BLAS_MFLOP_PER_THREAD), at most the rank's cores)\n"
    "  OPENBLAS_CORETYPE  OpenBLAS's kernels (Haswell, SkylakeX, ...). Unset, fsdp keeps\n"
    "                     OpenBLAS's choice unless it is below the CPU's features (an\n"
    "                     OpenBLAS older than the CPU falls back to SSE3 kernels): then it\n"
    "                     sets the one the features call for, checks its results once, and\n"
    "                     a training run's first lines say which kernels run\n"
    "  OPENBLAS_THREAD_TIMEOUT  how long OpenBLAS's idle threads spin, 2^N cycles (default\n"
    "                     here 4, set by fsdp for itself: short, so that they leave the cores\n"
    "                     to the ops between GEMMs; OpenBLAS's own default is 28)\n"
    "  FSDP_ATTENTION     CUDA attention kernels: auto (cuDNN's fused attention where it\n"
    "                     takes the shape, else own), own (our tensor-core kernels for bf16\n"
    "                     with head_dim 64 or 128, else our fp32 ones), cudnn, tc, simple\n"
    "  FSDP_CUDA_LIB      the CUDA backend (default: libfsdp_cuda.so beside libfsdp.so),\n"
    "                     opened only when a CUDA device is used\n"
    "  FSDP_CUDNN_LIB     the cuDNN library to open (default libcudnn.so.9)\n"
    "  FSDP_CUDNN_DETERMINISTIC=0  cuDNN's faster, non-deterministic attention backward\n";

static void set_default_env(const char *name, const char *value) {
  if (!getenv(name)) setenv(name, value, 1);
}

/* OpenBLAS reads its settings once, as it loads, before main: the host
 * sets them and runs itself again, once.
 * - Its idle threads spin (sched_yield) for 2^28 cycles after each GEMM,
 *   holding the cores that the pool's threads want for the ops between
 *   GEMMs (a rank with several cores; bench/RESULTS.md: +15% for the demo
 *   on one rank of two cores): OPENBLAS_THREAD_TIMEOUT=4.
 * - An OpenBLAS older than the CPU runs its oldest kernels on it (SSE3 on
 *   an AVX-512 Xeon: 5x slower GEMMs): OPENBLAS_CORETYPE from the CPU's
 *   features (src/ops/blas_core.c), FSDP_BLAS_CORE_FROM saying what
 *   OpenBLAS had picked, and the new kernels checked once after the run
 *   again (blas_checked).
 * A value the user set is kept; where the exec fails, OpenBLAS's own stay. */
static void blas_settings(char **argv) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || n >= (ssize_t)sizeof self - 1) return;
  self[n] = '\0'; /* the file itself, not the link: the process keeps its name (ps, pkill, /proc/PID/comm) */
  int again = 0;
  if (!getenv("OPENBLAS_THREAD_TIMEOUT")) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    again = 1;
  }
  const char *core = fsdp_blas_core_choice();
  if (core) {
    setenv("FSDP_BLAS_CORE_FROM", fsdp_blas_core(), 1);
    setenv("OPENBLAS_CORETYPE", core, 1);
    again = 1;
  }
  if (again) execv(self, argv);
  if (core) unsetenv("FSDP_BLAS_CORE_FROM"); /* not run again: OpenBLAS's own kernels stay */
}

/* Kernels chosen by blas_settings compute right, or the host refuses to
 * run on them, saying which and what to set. */
static int blas_checked(void) {
  if (!getenv("FSDP_BLAS_CORE_FROM") || fsdp_blas_verify() == FSDP_OK) return 1;
  fprintf(stderr, "fsdp: %s\n", fsdp_last_error());
  return 0;
}

/* package.path gets the fsdp Lua directory first. */
static void setup_paths(lua_State *L) {
  const char *dir = getenv("FSDP_LUA_PATH");
  if (!dir) dir = FSDP_LUA_DIR;
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

/* "file:LINE: ..." is where Lua raised the error: a bug's report wants the
 * stack. A message without a position (error(msg, 0): a recipe field, a bad
 * option, a corrupted file) is the whole story for the user; FSDP_TRACEBACK=1
 * shows the stack for those too. */
static int has_position(const char *msg) {
  const char *c = strchr(msg, ':');
  if (!c || c == msg || memchr(msg, '\n', (size_t)(c - msg))) return 0;
  const char *d = c + 1;
  while (*d >= '0' && *d <= '9') d++;
  return d > c + 1 && *d == ':';
}

/* the file being run, for errors that carry no message of their own */
static const char *current_file = "the program";

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    lua_pushfstring(L, "%s raised a %s as its error, not a message (error(\"text\") says what went wrong)", current_file,
                    luaL_typename(L, 1));
    msg = lua_tostring(L, -1);
  }
  const char *always = getenv("FSDP_TRACEBACK");
  if (has_position(msg) || (always && !strcmp(always, "1")))
    luaL_traceback(L, L, msg, 1);
  else
    lua_pushstring(L, msg);
  return 1;
}

/* 0 at the interactive prompt, where an error is shown and the prompt goes on. */
static int errors_end_the_job = 1;

/* An error on one rank of a job ends the job: returning 1 would leave the
 * others running under launchers that ignore a rank's exit status (plain
 * srun). fsdp_abort prints the message with the rank, then PMIx_Abort. */
static void report_error(const char *msg) {
  fsdp_proc_info me;
  if (errors_end_the_job && fsdp_initialized() && fsdp_init(&me) == FSDP_OK && me.size > 1) {
    fflush(stdout);
    fsdp_abort(1, msg);
    return;
  }
  fprintf(stderr, "fsdp: %s\n", msg);
}

/* Runs the chunk on the stack top with `nargs` already pushed; prints errors. */
static int call(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (rc) {
    const char *msg = lua_tostring(L, -1);
    report_error(msg ? msg : "(error object is not a string)");
    lua_pop(L, 1);
  }
  return rc;
}

static void set_arg_table(lua_State *L, char **argv, int argc, int script_index) {
  lua_createtable(L, argc, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script_index);
  }
  lua_setglobal(L, "arg");
}

static int run_file(lua_State *L, const char *file, int argc, char **argv, int script_index) {
  set_arg_table(L, argv, argc, script_index);
  current_file = file;
  if (luaL_loadfile(L, file)) { /* the job's own file cannot be read or parsed: its configuration (EX_CONFIG), never restarted */
    fprintf(stderr, "fsdp: %s\n", lua_tostring(L, -1));
    return 78;
  }
  int nargs = argc - script_index - 1;
  for (int i = script_index + 1; i < argc; i++) lua_pushstring(L, argv[i]);
  if (call(L, nargs, 1)) return 1;
  if (!lua_istable(L, -1)) {
    /* a script returns nothing; anything else but a table is likely a recipe gone wrong */
    if (!lua_isnil(L, -1))
      fprintf(stderr, "fsdp: warning: %s returned a %s, not a table: it ran as a script and trained nothing (a recipe "
              "returns a table of sections: model, data, train, ...)\n", file, luaL_typename(L, -1));
    return 0;
  }
  /* a file that returns a table is a recipe: train it,
   * require("fsdp.train").main(recipe, file, args...) */
  lua_getglobal(L, "require");
  lua_pushstring(L, "fsdp.train");
  if (call(L, 1, 1)) return 1;
  lua_getfield(L, -1, "main");
  lua_pushvalue(L, -3);
  lua_pushstring(L, file);
  for (int i = script_index + 1; i < argc; i++) lua_pushstring(L, argv[i]);
  return call(L, nargs + 2, 0) ? 1 : 0;
}

/* require(module)[fn]({argv[first..]}): the subcommands written in Lua
 * (`fsdp plan`, the REPL's helpers). Returns its numeric result, else 0;
 * 1 when it raised an error (printed). */
static int run_module(lua_State *L, const char *module, const char *fn, int argc, char **argv, int first) {
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  if (call(L, 1, 1)) return 1;
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_createtable(L, argc > first ? argc - first : 0, 0);
  for (int i = first; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - first + 1);
  }
  if (call(L, 1, 1)) return 1;
  int rc = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return rc;
}

/* "near '<eof>'" ends the message: the chunk is unfinished. */
static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  return len >= 7 && !strcmp(msg + len - 7, "'<eof>'");
}

/* Compiles the chunk the way the luajit prompt does: as `return CHUNK` (an
 * expression, whose values are printed) if that compiles, else as a
 * statement. Leaves the function or the error message on the stack and
 * returns the status; *more is set when the input is unfinished (either
 * form ran into its end, e.g. `1 +` or `function f()`). */
static int compile(lua_State *L, const char *chunk, int *more) {
  size_t n = strlen(chunk) + 8;
  char *expr = malloc(n);
  if (!expr) return luaL_error(L, "out of memory");
  snprintf(expr, n, "return %s", chunk);
  int status = luaL_loadbuffer(L, expr, strlen(expr), "=stdin");
  free(expr);
  *more = 0;
  if (status == 0) return 0;
  int expr_more = incomplete(L, status);
  lua_pop(L, 1);
  status = luaL_loadbuffer(L, chunk, strlen(chunk), "=stdin");
  *more = incomplete(L, status) || (status == LUA_ERRSYNTAX && expr_more);
  return status;
}

static char *read_line(int tty, const char *prompt) {
  if (tty) return readline(prompt);
  char *buf = NULL;
  size_t cap = 0;
  ssize_t n = getline(&buf, &cap, stdin);
  if (n < 0) {
    free(buf);
    return NULL;
  }
  if (n > 0 && buf[n - 1] == '\n') buf[n - 1] = '\0';
  return buf;
}

/* History survives os.exit() at the prompt: saved from the atexit handler. */
static char history_file[4096];

static void save_history(void) {
  if (history_file[0]) write_history(history_file); /* not writable: ignored */
  history_file[0] = '\0';
}

static void repl(lua_State *L) {
  int tty = isatty(0);
  if (tty) {
    const char *home = getenv("HOME");
    if (home && snprintf(history_file, sizeof history_file, "%s/.fsdp_history", home) < (int)sizeof history_file)
      read_history(history_file);
    else
      history_file[0] = '\0';
    printf("fsdp %s REPL (LuaJIT); `fsdp` is loaded; Ctrl-D to leave\n", fsdp_version());
  }
  lua_getglobal(L, "require");
  lua_pushstring(L, "fsdp");
  if (call(L, 1, 1) == 0) lua_setglobal(L, "fsdp");
  errors_end_the_job = 0;
  for (;;) {
    char *chunk = read_line(tty, "fsdp> ");
    if (!chunk) break;
    if (tty && chunk[0]) add_history(chunk);
    int more, status = compile(L, chunk, &more);
    while (more) { /* unfinished: read continuation lines */
      char *line = read_line(tty, ">> ");
      if (!line) break; /* end of input: report the incomplete chunk */
      if (tty && line[0]) add_history(line);
      size_t len = strlen(chunk) + strlen(line) + 2;
      char *joined = realloc(chunk, len);
      if (!joined) {
        free(line);
        break;
      }
      chunk = joined;
      strcat(chunk, "\n");
      strcat(chunk, line);
      free(line);
      lua_pop(L, 1);
      status = compile(L, chunk, &more);
    }
    free(chunk);
    if (status) {
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
      lua_pop(L, 1);
      continue;
    }
    int top = lua_gettop(L) - 1;
    if (call(L, 0, LUA_MULTRET)) continue;
    int nres = lua_gettop(L) - top;
    if (nres > 0) {
      /* print through fsdp.show (tables readably), else plain print */
      lua_getglobal(L, "fsdp");
      if (lua_istable(L, -1))
        lua_getfield(L, -1, "show");
      else
        lua_pushnil(L);
      lua_remove(L, -2);
      if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        lua_getglobal(L, "print");
      }
      lua_insert(L, top + 1);
      call(L, nres, 0);
    }
    fflush(stdout);
  }
  if (tty) printf("\n");
  save_history();
}

static void finalize_at_exit(void) {
  save_history();
  fsdp_finalize();
}

int main(int argc, char **argv) {
  /* a Python tool: before the engine's start-up (OpenBLAS's settings re-exec) */
  if (argc > 1 && !strcmp(argv[1], "prepare")) return fsdp_prepare_main(argc, argv);
  blas_settings(argv);
  if (!blas_checked()) return 1;
  atexit(finalize_at_exit); /* os.exit() from a job leaves through exit() too */
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--version")) {
    printf("fsdp %s\n", fsdp_version());
    return 0;
  }
  set_default_env("FSDP_LIB", FSDP_LIB_PATH);
  set_default_env("FSDP_HEADER", FSDP_HEADER_PATH);
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "fsdp: cannot create a Lua state\n");
    return 1;
  }
  luaL_openlibs(L);
  setup_paths(L);
  int rc = 0;
  if (argc > 1 && !strcmp(argv[1], "-e")) {
    if (argc < 3) {
      fprintf(stderr, "fsdp: -e needs a string of Lua code\n");
      rc = 2;
    } else {
      set_arg_table(L, argv, argc, 2);
      rc = luaL_loadstring(L, argv[2]) ? (fprintf(stderr, "fsdp: %s\n", lua_tostring(L, -1)), 1)
                                       : (call(L, 0, 0) ? 1 : 0);
    }
  } else if (argc > 1 && !strcmp(argv[1], "plan")) {
    rc = run_module(L, "fsdp.plan_cli", "cli", argc, argv, 2);
  } else if (argc > 1 && !strcmp(argv[1], "generate")) {
    rc = run_module(L, "fsdp.generate", "cli", argc, argv, 2);
  } else if (argc > 1 && strcmp(argv[1], "repl")) {
    if (argv[1][0] == '-') {
      fprintf(stderr, "fsdp: unknown option '%s' (fsdp --help)\n", argv[1]);
      rc = 2;
    } else {
      rc = run_file(L, argv[1], argc, argv, 1);
    }
  } else {
    /* the helpers (units(), layout(), plan{} ...), for RECIPE.lua when given */
    rc = run_module(L, "fsdp.repl", "setup", argc, argv, argc > 1 ? 2 : 1);
    if (rc == 0) repl(L);
  }
  lua_close(L);
  return rc; /* fsdp_finalize runs at exit: idempotent, a no-op without init */
}
