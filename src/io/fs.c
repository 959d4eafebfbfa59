/* fs.c: the file-system steps checkpoints are made of, each durable when it
 * returns: directories created and removed, files renamed with the parent
 * directory fsynced (so that the rename survives a crash), small files
 * written atomically (temporary file, fsync, rename), and positioned writes
 * into files that several ranks fill at once (safetensors export). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../fsdp_io.h"

static int os_fail(const char *what, const char *path) {
  return fsdp_fail(FSDP_EIO, "%s '%s': %s", what, path, strerror(errno));
}

int fsdp_fs_mkdirs(const char *path) {
  if (!path || !*path) return fsdp_fail(FSDP_EINVAL, "mkdirs: empty path");
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p) return fsdp_fail(FSDP_ENOMEM, "mkdirs: out of memory");
  memcpy(p, path, n + 1);
  int rc = FSDP_OK;
  for (size_t i = 1; i <= n && rc == FSDP_OK; i++) {
    if (p[i] != '/' && p[i] != 0) continue;
    char c = p[i];
    p[i] = 0;
    struct stat st;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = os_fail("cannot create directory", p);
    else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) rc = fsdp_fail(FSDP_EIO, "'%s' exists and is not a directory", p);
    p[i] = c;
  }
  free(p);
  return rc;
}

int fsdp_fs_stat(const char *path, int64_t *bytes, int *is_dir) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT) return FSDP_ABSENT;
    return os_fail("cannot stat", path);
  }
  if (bytes) *bytes = (int64_t)st.st_size;
  if (is_dir) *is_dir = S_ISDIR(st.st_mode) ? 1 : 0;
  return FSDP_OK;
}

static int remove_rec(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? FSDP_OK : os_fail("cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return os_fail("cannot open directory", path);
    struct dirent *e;
    int rc = FSDP_OK;
    while (rc == FSDP_OK && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      size_t n = strlen(path) + strlen(e->d_name) + 2;
      char *child = malloc(n);
      if (!child) rc = fsdp_fail(FSDP_ENOMEM, "remove: out of memory");
      else {
        snprintf(child, n, "%s/%s", path, e->d_name);
        rc = remove_rec(child);
        free(child);
      }
    }
    closedir(d);
    if (rc == FSDP_OK && rmdir(path) != 0) rc = os_fail("cannot remove directory", path);
    return rc;
  }
  return unlink(path) == 0 || errno == ENOENT ? FSDP_OK : os_fail("cannot remove", path);
}

int fsdp_fs_remove_tree(const char *path) {
  if (!path || !*path || !strcmp(path, "/")) return fsdp_fail(FSDP_EINVAL, "remove_tree: refusing path '%s'", path ? path : "");
  return remove_rec(path);
}

/* fsync the directory holding path, so that an entry created or renamed
 * there is on disk */
static int sync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == path) snprintf(dir, sizeof dir, "/");
  else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return os_fail("cannot open directory", dir);
  int rc = fsync(fd) == 0 || errno == EINVAL ? FSDP_OK : os_fail("cannot fsync directory", dir);
  close(fd);
  return rc;
}

int fsdp_fs_rename(const char *from, const char *to) {
  if (rename(from, to) != 0) return fsdp_fail(FSDP_EIO, "cannot rename '%s' to '%s': %s", from, to, strerror(errno));
  return sync_parent(to);
}

int fsdp_fs_fsync(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return os_fail("cannot open", path);
  int rc = fsync(fd) == 0 ? FSDP_OK : os_fail("cannot fsync", path);
  close(fd);
  return rc;
}

static int write_all(int fd, const void *data, size_t n, int64_t off, const char *path) {
  const char *p = data;
  while (n) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return os_fail("cannot write", path);
    }
    p += w;
    n -= (size_t)w;
    off += w;
    fsdp_heartbeat_pulse(); /* a long write is progress (fsdprun --heartbeat-timeout) */
  }
  return FSDP_OK;
}

int fsdp_fs_write_atomic(const char *path, const void *data, size_t n) {
  size_t len = strlen(path) + 8;
  char *tmp = malloc(len);
  if (!tmp) return fsdp_fail(FSDP_ENOMEM, "write: out of memory");
  snprintf(tmp, len, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int rc = fd < 0 ? os_fail("cannot create", tmp) : write_all(fd, data, n, 0, tmp);
  if (fd >= 0) {
    if (rc == FSDP_OK && fsync(fd) != 0) rc = os_fail("cannot fsync", tmp);
    close(fd);
  }
  if (rc == FSDP_OK) rc = fsdp_fs_rename(tmp, path);
  if (rc != FSDP_OK) unlink(tmp);
  free(tmp);
  return rc;
}

int fsdp_fs_create(const char *path, int64_t bytes) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return os_fail("cannot create", path);
  int rc = ftruncate(fd, (off_t)bytes) == 0 ? FSDP_OK : os_fail("cannot size", path);
  close(fd);
  return rc;
}

int fsdp_fs_pwrite(const char *path, int64_t offset, const void *data, size_t n) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) return os_fail("cannot open for writing", path);
  int rc = write_all(fd, data, n, offset, path);
  close(fd);
  return rc;
}

/* names in dir, each followed by '\n' ("." and ".." left out), into buf;
 * returns the bytes needed (call again with more when above cap) */
int64_t fsdp_fs_list(const char *dir, char *buf, int64_t cap) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : os_fail("cannot open directory", dir);
  int64_t used = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    int64_t n = (int64_t)strlen(e->d_name) + 1;
    if (buf && used + n <= cap) {
      memcpy(buf + used, e->d_name, (size_t)n - 1);
      buf[used + n - 1] = '\n';
    }
    used += n;
  }
  closedir(d);
  return used;
}
