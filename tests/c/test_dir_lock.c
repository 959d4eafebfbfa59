/* test_dir_lock: one job per directory (src/io/dir_lock.c), between real
 * processes (fcntl locks are per process): a second process is refused
 * with the holder's text while the first holds the lock, also after the
 * holder read and rewrote it through its descriptor (closing any other
 * descriptor of the file would drop an fcntl lock); released, it is taken;
 * a holder killed by SIGKILL leaves no lock, and its text stays for the
 * next holder to read (a restarted job finds its previous attempt). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "fsdp.h"

/* in a child: 0 took it, 1 busy with the expected text, 2 busy otherwise, 3 error */
static int try_in_child(const char *path, const char *expect) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd;
    char holder[256];
    int rc = fsdp_dir_lock_take(path, &fd, holder, sizeof holder);
    if (rc == FSDP_OK) _exit(0);
    if (rc == FSDP_EBUSY) _exit(expect && !strcmp(holder, expect) ? 1 : 2);
    _exit(3);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 4;
}

int main(void) {
  char dir[] = "/tmp/fsdp-dirlock-XXXXXX", path[64];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/.fsdp-lock", dir);
  int fd = -1;
  char buf[256];
  CHECK_OK(fsdp_dir_lock_take(path, &fd, buf, sizeof buf));
  CHECK_OK(fsdp_dir_lock_read(fd, buf, sizeof buf));
  CHECK(buf[0] == '\0'); /* a new file: no holder before */
  CHECK_OK(fsdp_dir_lock_write(fd, "host a pid 1 job j1 run r1"));
  CHECK(try_in_child(path, "host a pid 1 job j1 run r1") == 1);
  CHECK_OK(fsdp_dir_lock_read(fd, buf, sizeof buf));
  CHECK(!strcmp(buf, "host a pid 1 job j1 run r1"));
  CHECK_OK(fsdp_dir_lock_write(fd, "run r2")); /* shorter: truncated, not mixed */
  CHECK(try_in_child(path, "run r2") == 1);
  CHECK_OK(fsdp_dir_lock_release(fd));
  CHECK(try_in_child(path, NULL) == 0);

  /* a holder killed mid-job: the lock goes with it, its text stays */
  pid_t pid = fork();
  if (pid == 0) {
    int f;
    if (fsdp_dir_lock_take(path, &f, NULL, 0) != FSDP_OK || fsdp_dir_lock_write(f, "host b pid 2 job j2 run r3")) _exit(3);
    raise(SIGKILL);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  CHECK_OK(fsdp_dir_lock_take(path, &fd, buf, sizeof buf));
  CHECK_OK(fsdp_dir_lock_read(fd, buf, sizeof buf));
  CHECK(!strcmp(buf, "host b pid 2 job j2 run r3"));
  CHECK_OK(fsdp_dir_lock_release(fd));

  CHECK_FAILS(fsdp_dir_lock_take("/nonexistent-dir-fsdp/x", &fd, NULL, 0), FSDP_EIO, "dir lock: open");
  unlink(path);
  rmdir(dir);
  return fsdp_test_summary("test_dir_lock");
}
