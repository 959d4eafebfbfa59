/* safetensors.c: the safetensors format (huggingface/safetensors, "Format"):
 * 8 bytes little-endian u64 N, an N-byte JSON header, then the data. The
 * header maps each tensor name to {"dtype", "shape", "data_offsets": [b, e]}
 * (byte offsets into the data) and may hold "__metadata__", a string-to-
 * string map.
 *
 * The reader is strict, because a checkpoint from the internet is input we
 * do not control (tests/fuzz/fuzz_safetensors.c runs it under libFuzzer):
 * the header must fit in the file and in 100 MB, start with '{', be JSON
 * followed by nothing but spaces; each tensor has exactly those three keys,
 * a known dtype, a shape whose byte size matches its offsets, no name
 * twice; and the tensors tile the data exactly: no overlap, no hole, no
 * byte after the last (the format's rule against polyglot files). */
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
#include "json_util.h"

enum { MAX_NDIM = 8 };
#define MAX_HEADER 100000000LL

typedef struct entry {
  const char *name, *dtype; /* inside root */
  int ndim, esize, fsdp_dtype; /* fsdp_dtype: -1 when fsdp cannot read it */
  int64_t shape[MAX_NDIM], numel, begin, end; /* begin/end: absolute byte offsets */
} entry;

struct fsdp_safetensors {
  cJSON *root;
  const cJSON *meta;
  entry *e;
  int n;
  int fd;
  int64_t data_start, file_bytes;
  char what[];
};

static const struct {
  const char *name;
  int size, dtype;
} dtypes[] = {{"F64", 8, FSDP_FP64}, {"F32", 4, FSDP_FP32}, {"F16", 2, FSDP_FP16}, {"BF16", 2, FSDP_BF16},
              {"I64", 8, -1}, {"I32", 4, -1}, {"I16", 2, -1}, {"I8", 1, -1}, {"U64", 8, -1}, {"U32", 4, -1},
              {"U16", 2, -1}, {"U8", 1, -1}, {"BOOL", 1, -1}, {"F8_E4M3", 1, -1}, {"F8_E5M2", 1, -1}};

#define BAD(...) fsdp_fail(FSDP_ECORRUPT, __VA_ARGS__)

int fsdp_safetensors_close(fsdp_safetensors *st) {
  if (!st) return FSDP_OK;
  int rc = st->fd >= 0 && close(st->fd) != 0 ? fsdp_fail(FSDP_EIO, "closing a safetensors file: %s", strerror(errno)) : FSDP_OK;
  cJSON_Delete(st->root);
  free(st->e);
  free(st);
  return rc;
}

static int by_offset(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const entry *const *)a)->name, (*(const entry *const *)b)->name);
}

static int parse_entry(fsdp_safetensors *st, const cJSON *item, entry *e) {
  e->name = item->string;
  if (!cJSON_IsObject(item)) return BAD("%s: tensor '%s' is not an object", st->what, e->name);
  const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
  for (const cJSON *k = item->child; k; k = k->next) {
    if (!strcmp(k->string, "dtype") && !dt) dt = k;
    else if (!strcmp(k->string, "shape") && !shape) shape = k;
    else if (!strcmp(k->string, "data_offsets") && !offs) offs = k;
    else return BAD("%s: tensor '%s' has an unexpected or repeated key '%s'", st->what, e->name, k->string);
  }
  if (!cJSON_IsString(dt)) return BAD("%s: tensor '%s' has no dtype", st->what, e->name);
  e->dtype = dt->valuestring;
  e->esize = 0;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(dtypes[i].name, e->dtype)) e->esize = dtypes[i].size, e->fsdp_dtype = dtypes[i].dtype;
  if (!e->esize) return BAD("%s: tensor '%s' has unknown dtype '%.32s'", st->what, e->name, e->dtype);
  if (!cJSON_IsArray(shape) || json_count(shape) > MAX_NDIM)
    return BAD("%s: tensor '%s': shape must be an array of at most %d sizes", st->what, e->name, MAX_NDIM);
  e->numel = 1;
  e->ndim = 0;
  int64_t limit = st->file_bytes; /* no tensor can hold more elements than the file has bytes */
  for (const cJSON *d = shape->child; d; d = d->next) {
    int64_t v;
    if (!json_uint(d, &v)) return BAD("%s: tensor '%s': shape has a size that is not a non-negative integer", st->what, e->name);
    e->shape[e->ndim++] = v;
    if (v && e->numel > limit / v) e->numel = limit + 1; /* too big; reported below */
    else e->numel *= v;
  }
  int64_t b, en;
  if (!cJSON_IsArray(offs) || json_count(offs) != 2 || !json_uint(offs->child, &b) || !json_uint(offs->child->next, &en))
    return BAD("%s: tensor '%s': data_offsets must be [begin, end], non-negative integers", st->what, e->name);
  int64_t data_bytes = st->file_bytes - st->data_start;
  if (b > en || en > data_bytes)
    return BAD("%s: tensor '%s': data_offsets [%lld, %lld] out of range (the data has %lld bytes)", st->what, e->name,
               (long long)b, (long long)en, (long long)data_bytes);
  if (e->numel > limit || e->numel * e->esize != en - b)
    return BAD("%s: tensor '%s': shape and dtype %s make %s bytes, data_offsets span %lld", st->what, e->name, e->dtype,
               e->numel > limit ? "more" : "a different count of", (long long)(en - b));
  e->begin = st->data_start + b;
  e->end = st->data_start + en;
  return FSDP_OK;
}

static int parse_header(fsdp_safetensors *st, const unsigned char *file, size_t n) {
  if (n < 8 || st->file_bytes < 8)
    return BAD("%s: %lld bytes, shorter than the 8-byte header length", st->what, (long long)st->file_bytes);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--) len = len << 8 | file[i];
  if (len > (uint64_t)MAX_HEADER) return BAD("%s: header length %llu is over the format's 100 MB limit", st->what, (unsigned long long)len);
  if ((int64_t)len + 8 > st->file_bytes)
    return BAD("%s: header length %llu runs past the end of the file (%lld bytes)", st->what, (unsigned long long)len,
               (long long)st->file_bytes);
  if ((size_t)len + 8 > n) return fsdp_fail(FSDP_EINVAL, "%s: the header is not in the buffer given", st->what);
  const char *h = (const char *)file + 8;
  if (len < 2 || h[0] != '{') return BAD("%s: the header does not start with '{'", st->what);
  const char *end = NULL;
  st->root = cJSON_ParseWithLengthOpts(h, (size_t)len, &end, 0);
  if (!st->root || !cJSON_IsObject(st->root)) return BAD("%s: the header is not a JSON object", st->what);
  for (; end && end < h + len; end++)
    if (*end != ' ') return BAD("%s: bytes after the header's JSON (only spaces may pad it)", st->what);
  st->data_start = 8 + (int64_t)len;
  int64_t count = json_count(st->root);
  st->e = calloc((size_t)(count ? count : 1), sizeof *st->e);
  if (!st->e) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", st->what);
  for (const cJSON *it = st->root->child; it; it = it->next) {
    if (!strcmp(it->string, "__metadata__")) {
      if (st->meta || !cJSON_IsObject(it)) return BAD("%s: __metadata__ must be one object", st->what);
      for (const cJSON *k = it->child; k; k = k->next)
        if (!cJSON_IsString(k)) return BAD("%s: __metadata__ value '%s' is not a string", st->what, k->string);
      st->meta = it;
      continue;
    }
    FSDP_CHECK(parse_entry(st, it, &st->e[st->n]));
    st->n++;
  }
  /* names once each */
  const entry **names = malloc(sizeof *names * (size_t)(st->n ? st->n : 1));
  if (!names) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", st->what);
  for (int i = 0; i < st->n; i++) names[i] = &st->e[i];
  qsort(names, (size_t)st->n, sizeof *names, by_name);
  int rc = FSDP_OK;
  for (int i = 1; i < st->n && rc == FSDP_OK; i++)
    if (!strcmp(names[i]->name, names[i - 1]->name)) rc = BAD("%s: tensor '%s' appears twice", st->what, names[i]->name);
  free(names);
  FSDP_CHECK(rc);
  /* the tensors tile the data */
  qsort(st->e, (size_t)st->n, sizeof *st->e, by_offset);
  int64_t at = st->data_start;
  for (int i = 0; i < st->n; i++) {
    if (st->e[i].begin < at)
      return BAD("%s: tensors '%s' and '%s' overlap", st->what, st->e[i - 1].name, st->e[i].name);
    if (st->e[i].begin > at)
      return BAD("%s: bytes %lld..%lld of the data belong to no tensor", st->what, (long long)(at - st->data_start),
                 (long long)(st->e[i].begin - st->data_start));
    at = st->e[i].end;
  }
  if (at != st->file_bytes)
    return BAD("%s: %lld bytes after the last tensor's data belong to no tensor", st->what, (long long)(st->file_bytes - at));
  return FSDP_OK;
}

static int make(const char *what, int64_t file_bytes, fsdp_safetensors **out) {
  size_t wl = strlen(what) + 1;
  fsdp_safetensors *st = calloc(1, sizeof *st + wl);
  if (!st) return fsdp_fail(FSDP_ENOMEM, "safetensors: out of memory");
  memcpy(st->what, what, wl);
  st->fd = -1;
  st->file_bytes = file_bytes;
  *out = st;
  return FSDP_OK;
}

int fsdp_safetensors_parse(const void *file, size_t n, int64_t file_bytes, const char *what, fsdp_safetensors **out) {
  if (!out || (!file && n)) return fsdp_fail(FSDP_EINVAL, "safetensors_parse: NULL argument");
  *out = NULL;
  fsdp_safetensors *st = NULL;
  FSDP_CHECK(make(what ? what : "safetensors", file_bytes, &st));
  int rc = parse_header(st, file, n);
  if (rc != FSDP_OK) {
    fsdp_safetensors_close(st);
    return rc;
  }
  *out = st;
  return FSDP_OK;
}

int fsdp_safetensors_open(const char *path, fsdp_safetensors **out) {
  if (!path || !out) return fsdp_fail(FSDP_EINVAL, "safetensors_open: NULL argument");
  *out = NULL;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return fsdp_fail(FSDP_EIO, "cannot open '%s': %s", path, strerror(errno));
  struct stat s;
  unsigned char len8[8];
  if (fstat(fd, &s) != 0) {
    close(fd);
    return fsdp_fail(FSDP_EIO, "cannot stat '%s': %s", path, strerror(errno));
  }
  int64_t size = (int64_t)s.st_size;
  ssize_t got = pread(fd, len8, 8, 0);
  uint64_t len = 0;
  for (int i = 7; i >= 0 && got == 8; i--) len = len << 8 | len8[i];
  /* read the header only when its length is plausible; parse_header judges */
  size_t want = got == 8 && len <= (uint64_t)MAX_HEADER && (int64_t)len + 8 <= size ? (size_t)len + 8 : (size_t)(got > 0 ? got : 0);
  unsigned char *buf = malloc(want ? want : 1);
  if (!buf) {
    close(fd);
    return fsdp_fail(FSDP_ENOMEM, "safetensors: out of memory for the header of '%s'", path);
  }
  size_t have = 0;
  while (have < want) {
    ssize_t k = pread(fd, buf + have, want - have, (off_t)have);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    have += (size_t)k;
  }
  fsdp_safetensors *st = NULL;
  int rc = make(path, size, &st);
  if (rc == FSDP_OK) rc = parse_header(st, buf, have);
  free(buf);
  if (rc != FSDP_OK) {
    fsdp_safetensors_close(st);
    close(fd);
    return rc;
  }
  st->fd = fd;
  *out = st;
  return FSDP_OK;
}

int fsdp_safetensors_count(const fsdp_safetensors *st) { return st ? st->n : 0; }

int fsdp_safetensors_find(const fsdp_safetensors *st, const char *name, int *index) {
  if (!st || !name || !index) return fsdp_fail(FSDP_EINVAL, "safetensors_find: NULL argument");
  for (int i = 0; i < st->n; i++)
    if (!strcmp(st->e[i].name, name)) {
      *index = i;
      return FSDP_OK;
    }
  return FSDP_ABSENT;
}

int fsdp_safetensors_entry_get(const fsdp_safetensors *st, int i, fsdp_safetensors_entry *out) {
  if (!st || !out || i < 0 || i >= st->n) return fsdp_fail(FSDP_EINVAL, "safetensors_entry_get: no tensor %d", i);
  const entry *e = &st->e[i];
  memset(out, 0, sizeof *out);
  out->name = e->name;
  out->dtype = e->dtype;
  out->ndim = e->ndim;
  for (int k = 0; k < e->ndim; k++) out->shape[k] = e->shape[k];
  out->begin = e->begin;
  out->end = e->end;
  return FSDP_OK;
}

const char *fsdp_safetensors_metadata(const fsdp_safetensors *st, const char *key) {
  const cJSON *v = st && st->meta && key ? cJSON_GetObjectItemCaseSensitive(st->meta, key) : NULL;
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

int fsdp_safetensors_read(fsdp_safetensors *st, int i, int64_t begin, int64_t end, float *dst) {
  if (!st || i < 0 || i >= st->n) return fsdp_fail(FSDP_EINVAL, "safetensors_read: no tensor %d", i);
  const entry *e = &st->e[i];
  if (begin < 0 || end > e->numel || begin > end || (end > begin && !dst))
    return fsdp_fail(FSDP_EINVAL, "%s: elements [%lld, %lld) of '%s', which has %lld", st->what, (long long)begin,
                     (long long)end, e->name, (long long)e->numel);
  if (e->fsdp_dtype < 0) return fsdp_fail(FSDP_EUNSUPPORTED, "%s: tensor '%s' is %s; fsdp reads F64, F32, F16 and BF16", st->what, e->name, e->dtype);
  if (st->fd < 0) return fsdp_fail(FSDP_ESTATE, "%s: parsed from memory: no file to read", st->what);
  enum { CHUNK = 1 << 20 };
  unsigned char *buf = malloc((size_t)CHUNK * (size_t)e->esize);
  if (!buf) return fsdp_fail(FSDP_ENOMEM, "safetensors: out of memory");
  int rc = FSDP_OK;
  while (rc == FSDP_OK && begin < end) {
    int64_t k = end - begin < CHUNK ? end - begin : CHUNK;
    size_t bytes = (size_t)(k * e->esize), have = 0;
    int64_t off = e->begin + begin * e->esize;
    while (rc == FSDP_OK && have < bytes) {
      ssize_t r = pread(st->fd, buf + have, bytes - have, (off_t)(off + (int64_t)have));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) rc = BAD("%s: the file ends inside tensor '%s' (it was truncated after opening?)", st->what, e->name);
      else have += (size_t)r;
    }
    fsdp_heartbeat_pulse(); /* a long import is progress (fsdprun --heartbeat-timeout) */
    if (rc == FSDP_OK) rc = fsdp_convert(dst, FSDP_FP32, buf, e->fsdp_dtype, (size_t)k);
    dst += k;
    begin += k;
  }
  free(buf);
  return rc;
}

/* ---- writing ---- */

int64_t fsdp_safetensors_header(int n, const char *const *names, const char *const *dtype_names, const int32_t *ndims,
                                const int64_t *shapes, int nmeta, const char *const *meta, char *buf, int64_t cap,
                                int64_t *data_begin) {
  if (n < 0 || (n && (!names || !dtype_names || !ndims || !shapes)) || nmeta < 0 || (nmeta && !meta))
    return fsdp_fail(FSDP_EINVAL, "safetensors_header: bad argument");
  cJSON *root = cJSON_CreateObject();
  int rc = root ? FSDP_OK : fsdp_fail(FSDP_ENOMEM, "safetensors_header: out of memory");
  if (rc == FSDP_OK && nmeta) {
    cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
    for (int i = 0; m && i < nmeta; i++) cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]);
  }
  int64_t off = 0;
  for (int i = 0; rc == FSDP_OK && i < n; i++) {
    int esize = 0;
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
      if (!strcmp(dtypes[k].name, dtype_names[i])) esize = dtypes[k].size;
    if (!esize || ndims[i] < 0 || ndims[i] > MAX_NDIM) {
      rc = fsdp_fail(FSDP_EINVAL, "safetensors_header: tensor '%s': dtype '%s', %d dims", names[i], dtype_names[i], ndims[i]);
      break;
    }
    cJSON *t = cJSON_AddObjectToObject(root, names[i]);
    cJSON_AddStringToObject(t, "dtype", dtype_names[i]);
    cJSON *sh = cJSON_AddArrayToObject(t, "shape");
    int64_t numel = 1;
    for (int k = 0; k < ndims[i]; k++) {
      numel *= shapes[i * MAX_NDIM + k];
      cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shapes[i * MAX_NDIM + k]));
    }
    cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
    if (data_begin) data_begin[i] = off;
    cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    off += numel * esize;
    cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
  }
  char *text = rc == FSDP_OK ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (rc != FSDP_OK) return rc;
  if (!text) return fsdp_fail(FSDP_ENOMEM, "safetensors_header: out of memory");
  int64_t len = (int64_t)strlen(text);
  int64_t padded = (len + 7) / 8 * 8; /* the data starts 8-aligned, as the reference writer does */
  int64_t total = 8 + padded;
  if (buf && cap >= total) {
    for (int i = 0; i < 8; i++) buf[i] = (char)((uint64_t)padded >> (8 * i) & 0xff);
    memcpy(buf + 8, text, (size_t)len);
    memset(buf + 8 + len, ' ', (size_t)(padded - len));
  }
  for (int i = 0; data_begin && i < n; i++) data_begin[i] += total;
  free(text);
  return total;
}
