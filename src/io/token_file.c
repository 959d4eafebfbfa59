/* token_file.c: read-only, memory-mapped pre-tokenised token files.
 *
 * Headered files (llm.c's layout): 256 little-endian int32 (1024 bytes),
 * header[0] the magic, header[1] the version, header[2] the token count, the
 * rest zero; then exactly count tokens. Two (magic, version) pairs exist:
 * (20240520, 1) with uint16 tokens (GPT-2) and (20240801, 7) with uint32
 * tokens (Llama 3), as llm.c's dev/data/data_common.py writes them.
 * Headerless files are taken whole as uint8, uint16 or uint32 tokens when the caller
 * says so: nothing in them can be checked but their size.
 *
 * Every check happens at open, so that a malformed file fails there with a
 * message naming it, never later inside a read. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/error.h"
#include "../base/scan.h"
#include "../fsdp_io.h"

enum { HEADER_INTS = 256, HEADER_BYTES = HEADER_INTS * 4 };
enum { MAGIC_U16 = 20240520, VERSION_U16 = 1, MAGIC_U32 = 20240801, VERSION_U32 = 7 };

struct fsdp_token_file {
  const unsigned char *map; /* the whole file */
  size_t map_bytes;
  const unsigned char *tokens; /* first token, inside map */
  int64_t count;
  int32_t width;
  char path[]; /* for messages */
};

static int32_t le32(const unsigned char *p) {
  /* assemble by hand: independent of the host's byte order and alignment */
  uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
  int32_t s;
  memcpy(&s, &v, sizeof s);
  return s;
}

/* Checks the header of a mapped file and sets tokens, count and width. */
static int parse_header(fsdp_token_file *f, int64_t size) {
  if (size < HEADER_BYTES)
    return fsdp_fail(FSDP_EINVAL,
                     "token file '%s': %lld bytes, too small for the %d-byte header (a headerless file needs "
                     "format raw_u16 or raw_u32)",
                     f->path, (long long)size, HEADER_BYTES);
  int32_t magic = le32(f->map), version = le32(f->map + 4), count = le32(f->map + 8);
  int32_t want_version;
  if (magic == MAGIC_U16) {
    f->width = 2;
    want_version = VERSION_U16;
  } else if (magic == MAGIC_U32) {
    f->width = 4;
    want_version = VERSION_U32;
  } else {
    return fsdp_fail(FSDP_EINVAL,
                     "token file '%s': bad magic %d (expected %d for uint16 tokens or %d for uint32 tokens; a "
                     "headerless file needs format raw_u16 or raw_u32)",
                     f->path, (int)magic, MAGIC_U16, MAGIC_U32);
  }
  if (version != want_version)
    return fsdp_fail(FSDP_EINVAL, "token file '%s': unknown version %d for magic %d (expected %d)", f->path,
                     (int)version, (int)magic, (int)want_version);
  if (count <= 0)
    return fsdp_fail(FSDP_EINVAL, "token file '%s': the header counts %d tokens", f->path, (int)count);
  int64_t expected = HEADER_BYTES + (int64_t)count * f->width;
  if (size < expected)
    return fsdp_fail(FSDP_EINVAL,
                     "token file '%s': truncated: the header counts %d tokens of %d bytes, expected %lld bytes, "
                     "the file has %lld",
                     f->path, (int)count, (int)f->width, (long long)expected, (long long)size);
  if (size > expected)
    return fsdp_fail(FSDP_EINVAL,
                     "token file '%s': %lld bytes after the %d tokens the header counts (expected %lld bytes, "
                     "the file has %lld)",
                     f->path, (long long)(size - expected), (int)count, (long long)expected, (long long)size);
  f->tokens = f->map + HEADER_BYTES;
  f->count = count;
  return FSDP_OK;
}

static int parse_raw(fsdp_token_file *f, int64_t size, int32_t width) {
  if (size % width != 0)
    return fsdp_fail(FSDP_EINVAL, "token file '%s': %lld bytes is not a multiple of the token width %d", f->path,
                     (long long)size, (int)width);
  f->width = width;
  f->tokens = f->map;
  f->count = size / width;
  return FSDP_OK;
}

int fsdp_token_file_open(const char *path, int32_t format, fsdp_token_file **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "fsdp_token_file_open: out is NULL");
  *out = NULL;
  if (!path) return fsdp_fail(FSDP_EINVAL, "fsdp_token_file_open: path is NULL");
  if (format != FSDP_TOKENS_AUTO && format != FSDP_TOKENS_RAW_U16 && format != FSDP_TOKENS_RAW_U32 &&
      format != FSDP_TOKENS_RAW_U8)
    return fsdp_fail(FSDP_EINVAL, "token file '%s': unknown format %d (expected auto, raw_u8, raw_u16 or raw_u32)", path,
                     (int)format);
  size_t plen = strlen(path);
  fsdp_token_file *f = calloc(1, sizeof *f + plen + 1);
  if (!f) return fsdp_fail(FSDP_ENOMEM, "token file '%s': out of memory", path);
  memcpy(f->path, path, plen + 1);

  int rc = FSDP_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0) {
    rc = fsdp_fail(FSDP_EIO, "token file '%s': cannot open: %s", path, strerror(errno));
  } else if (fstat(fd, &st) != 0) {
    rc = fsdp_fail(FSDP_EIO, "token file '%s': cannot stat: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = fsdp_fail(FSDP_EINVAL, "token file '%s': not a regular file", path);
  } else if (st.st_size == 0) {
    rc = fsdp_fail(FSDP_EINVAL, "token file '%s': the file is empty", path);
  } else if ((uint64_t)st.st_size > SIZE_MAX) {
    rc = fsdp_fail(FSDP_EINVAL, "token file '%s': %lld bytes, too large to map", path, (long long)st.st_size);
  } else {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      rc = fsdp_fail(FSDP_EIO, "token file '%s': cannot map %lld bytes: %s", path, (long long)st.st_size,
                     strerror(errno));
    } else {
      f->map = m;
      f->map_bytes = (size_t)st.st_size;
      if (format == FSDP_TOKENS_AUTO) rc = parse_header(f, st.st_size);
      else rc = parse_raw(f, st.st_size, format == FSDP_TOKENS_RAW_U8 ? 1 : format == FSDP_TOKENS_RAW_U16 ? 2 : 4);
    }
  }
  if (fd >= 0) close(fd); /* the mapping outlives the descriptor */
  if (rc < 0) {
    fsdp_token_file_close(f);
    return rc;
  }
  *out = f;
  return FSDP_OK;
}

int64_t fsdp_token_file_count(const fsdp_token_file *f) { return f ? f->count : 0; }

int32_t fsdp_token_file_width(const fsdp_token_file *f) { return f ? f->width : 0; }

int fsdp_token_file_read(const fsdp_token_file *f, int64_t start, int64_t n, int32_t *out) {
  if (!f) return fsdp_fail(FSDP_EINVAL, "fsdp_token_file_read: the file is NULL");
  /* written so that no sum can overflow: n > count - start, not start + n > count */
  if (start < 0 || n < 0 || start > f->count || n > f->count - start)
    return fsdp_fail(FSDP_EINVAL, "token file '%s': read of %lld tokens at %lld is out of range [0, %lld)", f->path,
                     (long long)n, (long long)start, (long long)f->count);
  if (n > 0 && !out) return fsdp_fail(FSDP_EINVAL, "token file '%s': read into NULL", f->path);
  const unsigned char *p = f->tokens + (size_t)start * (size_t)f->width;
  if (f->width == 1) {
    for (int64_t i = 0; i < n; i++) out[i] = p[i];
  } else if (f->width == 2) {
    for (int64_t i = 0; i < n; i++, p += 2) out[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
  } else {
    for (int64_t i = 0; i < n; i++, p += 4) {
      uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
      if (v > INT32_MAX)
        return fsdp_fail(FSDP_EINVAL, "token file '%s': token %lld is %lu, above the int32 range", f->path,
                         (long long)(start + i), (unsigned long)v);
      out[i] = (int32_t)v;
    }
  }
  return FSDP_OK;
}

int fsdp_token_file_check_ids(const fsdp_token_file *f, int64_t vocab) {
  if (!f) return fsdp_fail(FSDP_EINVAL, "fsdp_token_file_check_ids: the file is NULL");
  if (vocab < 1) return fsdp_fail(FSDP_EINVAL, "token file '%s': vocabulary size %lld", f->path, (long long)vocab);
  uint32_t bound = vocab > INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)vocab, v = 0;
  int64_t at = -1;
  if (f->width == 1) { /* byte files (loss masks) are small beside their tokens: a plain loop */
    for (int64_t i = 0; i < f->count && at < 0; i++)
      if (f->tokens[i] >= bound) at = i, v = f->tokens[i];
  } else {
    at = fsdp_scan_tokens_at_least(f->tokens, f->width, f->count, bound, &v);
  }
  if (at < 0) return FSDP_OK;
  return fsdp_fail(FSDP_EINVAL,
                   "token file '%s': token %lld (byte offset %lld) is id %lu, outside the vocabulary of %lld ids "
                   "(0 to %lld)",
                   f->path, (long long)at, (long long)((f->tokens - f->map) + at * f->width), (unsigned long)v,
                   (long long)vocab, (long long)vocab - 1);
}

int fsdp_token_file_close(fsdp_token_file *f) {
  if (!f) return FSDP_OK;
  int rc = f->map && munmap((void *)f->map, f->map_bytes) != 0 ? fsdp_fail(FSDP_EIO, "unmapping a token file: %s", strerror(errno))
                                                                : FSDP_OK;
  free(f);
  return rc;
}
