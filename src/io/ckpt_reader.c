/* ckpt_reader.c: opens a checkpoint directory written by fsdp.checkpoint
 * (docs/CHECKPOINTS.md) and reads element ranges of its tensors.
 *
 * Everything that can be checked without reading the data is checked at
 * open: index.json against the checksum in index.sum, its structure, every
 * file present with the size the index gives (a shorter one is truncated),
 * every segment inside its file, and every state of every tensor covered by
 * segments exactly once (a gap means a missing shard). Reads verify each
 * segment against its CRC-32C before a byte of it is used. */
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

typedef struct seg {
  int32_t tensor, state, file;
  uint32_t crc;
  int64_t begin, end, offset;
} seg;

typedef struct tensor_info {
  char *name;
  int ndim;
  int64_t shape[MAX_NDIM], numel;
} tensor_info;

struct fsdp_ckpt {
  char *dir;
  cJSON *root, *meta;
  int ntensors, nstates, nfiles;
  tensor_info *tensors;
  char **states, **files;
  int64_t *file_bytes;
  int *fds;
  seg *segs;     /* sorted by (tensor, state, begin) */
  int64_t nsegs;
  void *scratch; /* one segment's bytes while it is verified */
  size_t scratch_bytes;
};

int fsdp_ckpt_close(fsdp_ckpt *c) {
  if (!c) return FSDP_OK;
  for (int i = 0; i < c->nfiles; i++)
    if (c->fds && c->fds[i] >= 0) close(c->fds[i]);
  free(c->fds);
  free(c->file_bytes);
  free(c->files); /* strings belong to root */
  free(c->states);
  free(c->tensors);
  free(c->segs);
  free(c->scratch);
  cJSON_Delete(c->root);
  free(c->dir);
  free(c);
  return FSDP_OK; /* read-only descriptors: closing them loses nothing */
}

static int read_whole(const char *path, char **out, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno == ENOENT ? FSDP_ABSENT : fsdp_fail(FSDP_EIO, "cannot open '%s': %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)(len > 0 ? len : 0) + 1);
  if (!buf) {
    fclose(f);
    return fsdp_fail(FSDP_ENOMEM, "out of memory reading '%s'", path);
  }
  size_t got = fread(buf, 1, (size_t)(len > 0 ? len : 0), f);
  fclose(f);
  buf[got] = 0;
  *out = buf;
  *n = got;
  return FSDP_OK;
}

static int seg_cmp(const void *a, const void *b) {
  const seg *x = a, *y = b;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  if (x->state != y->state) return x->state < y->state ? -1 : 1;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

#define BAD(...) fsdp_fail(FSDP_ECORRUPT, __VA_ARGS__)

static int parse_strings(const cJSON *arr, const char *what, const char *ip, char ***out, int *n) {
  if (!cJSON_IsArray(arr)) return BAD("%s: '%s' is missing or not an array", ip, what);
  *n = (int)json_count(arr);
  *out = calloc((size_t)(*n ? *n : 1), sizeof(char *));
  if (!*out) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", ip);
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    if (!cJSON_IsString(e)) return BAD("%s: %s[%d] is not a string", ip, what, i);
    (*out)[i] = e->valuestring;
  }
  return FSDP_OK;
}

static int parse_tensors(fsdp_ckpt *c, const cJSON *arr, const char *ip) {
  if (!cJSON_IsArray(arr)) return BAD("%s: 'tensors' is missing or not an array", ip);
  c->ntensors = (int)json_count(arr);
  c->tensors = calloc((size_t)(c->ntensors ? c->ntensors : 1), sizeof *c->tensors);
  if (!c->tensors) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", ip);
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    tensor_info *t = &c->tensors[i];
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsString(name)) return BAD("%s: tensors[%d] has no name", ip, i);
    t->name = name->valuestring;
    if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "F32"))
      return BAD("%s: tensor '%s': dtype must be \"F32\"", ip, t->name);
    if (!cJSON_IsArray(shape) || json_count(shape) > MAX_NDIM)
      return BAD("%s: tensor '%s': shape must be an array of at most %d sizes", ip, t->name, MAX_NDIM);
    t->numel = 1;
    for (const cJSON *d = shape->child; d; d = d->next) {
      int64_t v;
      if (!json_uint(d, &v) || (v && t->numel > INT64_MAX / 8 / v)) return BAD("%s: tensor '%s': bad shape", ip, t->name);
      t->shape[t->ndim++] = v;
      t->numel *= v;
    }
    for (int k = 0; k < i; k++)
      if (!strcmp(c->tensors[k].name, t->name)) return BAD("%s: tensor '%s' is listed twice", ip, t->name);
  }
  return FSDP_OK;
}

static int parse_files(fsdp_ckpt *c, const cJSON *arr, const char *ip) {
  if (!cJSON_IsArray(arr)) return BAD("%s: 'files' is missing or not an array", ip);
  c->nfiles = (int)json_count(arr);
  size_t m = (size_t)(c->nfiles ? c->nfiles : 1);
  c->files = calloc(m, sizeof(char *));
  c->file_bytes = calloc(m, sizeof(int64_t));
  c->fds = malloc(m * sizeof(int));
  if (!c->files || !c->file_bytes || !c->fds) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", ip);
  for (int i = 0; i < c->nfiles; i++) c->fds[i] = -1;
  int i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    if (!cJSON_IsString(name) || strchr(name->valuestring, '/') || !strcmp(name->valuestring, "..") ||
        !json_uint(cJSON_GetObjectItemCaseSensitive(e, "bytes"), &c->file_bytes[i]))
      return BAD("%s: files[%d] needs a plain file name and a byte count", ip, i);
    c->files[i] = name->valuestring;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->files[i]);
    struct stat st;
    if (stat(path, &st) != 0)
      return BAD("checkpoint '%s': shard file '%s' is missing (%s)", c->dir, c->files[i], strerror(errno));
    if ((int64_t)st.st_size < c->file_bytes[i])
      return BAD("checkpoint '%s': '%s' is truncated: %lld bytes, the index expects %lld", c->dir, c->files[i],
                 (long long)st.st_size, (long long)c->file_bytes[i]);
    if ((int64_t)st.st_size > c->file_bytes[i])
      return BAD("checkpoint '%s': '%s' has %lld bytes, the index expects %lld", c->dir, c->files[i],
                 (long long)st.st_size, (long long)c->file_bytes[i]);
  }
  return FSDP_OK;
}

static int parse_segments(fsdp_ckpt *c, const cJSON *arr, const char *ip) {
  if (!cJSON_IsArray(arr)) return BAD("%s: 'segments' is missing or not an array", ip);
  c->nsegs = json_count(arr);
  c->segs = calloc((size_t)(c->nsegs ? c->nsegs : 1), sizeof *c->segs);
  if (!c->segs) return fsdp_fail(FSDP_ENOMEM, "%s: out of memory", ip);
  int64_t i = 0;
  for (const cJSON *e = arr->child; e; e = e->next, i++) {
    int64_t v[7];
    int k = 0;
    for (const cJSON *x = cJSON_IsArray(e) ? e->child : NULL; x && k < 7; x = x->next, k++)
      if (!json_uint(x, &v[k])) break;
    if (k != 7 || json_count(e) != 7)
      return BAD("%s: segments[%lld] must be [tensor, state, begin, end, file, offset, crc32c]", ip, (long long)i);
    seg *s = &c->segs[i];
    if (v[0] >= c->ntensors || v[1] >= c->nstates || v[4] >= c->nfiles || v[6] > UINT32_MAX)
      return BAD("%s: segments[%lld] names a tensor, state or file that does not exist", ip, (long long)i);
    *s = (seg){(int32_t)v[0], (int32_t)v[1], (int32_t)v[4], (uint32_t)v[6], v[2], v[3], v[5]};
    const tensor_info *t = &c->tensors[s->tensor];
    if (s->begin >= s->end || s->end > t->numel)
      return BAD("%s: a segment of '%s' covers elements [%lld, %lld) of %lld", ip, t->name, (long long)s->begin,
                 (long long)s->end, (long long)t->numel);
    if (s->offset + (s->end - s->begin) * 4 > c->file_bytes[s->file])
      return BAD("%s: a segment of '%s' ends past the end of '%s'", ip, t->name, c->files[s->file]);
  }
  qsort(c->segs, (size_t)c->nsegs, sizeof *c->segs, seg_cmp);
  /* every (tensor, state) tiled exactly once */
  int64_t j = 0;
  for (int t = 0; t < c->ntensors; t++)
    for (int s = 0; s < c->nstates; s++) {
      int64_t at = 0;
      for (; j < c->nsegs && c->segs[j].tensor == t && c->segs[j].state == s; j++) {
        if (c->segs[j].begin != at)
          return BAD("checkpoint '%s': %s of '%s': elements [%lld, %lld) are %s", c->dir, c->states[s],
                     c->tensors[t].name, (long long)(c->segs[j].begin < at ? c->segs[j].begin : at),
                     (long long)(c->segs[j].begin < at ? at : c->segs[j].begin),
                     c->segs[j].begin < at ? "in two segments" : "in no segment (a shard is missing)");
        at = c->segs[j].end;
      }
      if (at != c->tensors[t].numel)
        return BAD("checkpoint '%s': %s of '%s': elements [%lld, %lld) are in no segment (a shard is missing)", c->dir,
                   c->states[s], c->tensors[t].name, (long long)at, (long long)c->tensors[t].numel);
    }
  return FSDP_OK;
}

static int open_index(fsdp_ckpt *c) {
  char ip[4096], sp[4096];
  snprintf(ip, sizeof ip, "%s/index.json", c->dir);
  snprintf(sp, sizeof sp, "%s/index.sum", c->dir);
  char *text = NULL, *sum = NULL;
  size_t n = 0, ns = 0;
  int rc = read_whole(ip, &text, &n);
  if (rc == FSDP_ABSENT)
    return fsdp_fail(FSDP_EIO, "'%s' is not a checkpoint: it has no index.json (a save that did not finish leaves "
                     "none)", c->dir);
  FSDP_CHECK(rc);
  rc = read_whole(sp, &sum, &ns);
  if (rc == FSDP_ABSENT) rc = BAD("checkpoint '%s': index.sum is missing", c->dir);
  unsigned crc = 0;
  long long bytes = -1;
  if (rc == FSDP_OK && sscanf(sum, "crc32c %8x bytes %lld", &crc, &bytes) != 2)
    rc = BAD("checkpoint '%s': index.sum is not 'crc32c XXXXXXXX bytes N'", c->dir);
  if (rc == FSDP_OK && ((long long)n != bytes || fsdp_crc32c(0, text, n) != crc))
    rc = BAD("checkpoint '%s': index.json is damaged (%zu bytes, crc32c %08x; index.sum says %lld bytes, %08x)", c->dir,
             n, fsdp_crc32c(0, text, n), bytes, crc);
  free(sum);
  if (rc == FSDP_OK) {
    c->root = cJSON_ParseWithLength(text, n);
    if (!c->root) rc = BAD("%s: not valid JSON", ip);
  }
  free(text);
  FSDP_CHECK(rc);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(c->root, "format");
  int64_t version = 0;
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "fsdp-checkpoint") ||
      !json_uint(cJSON_GetObjectItemCaseSensitive(c->root, "version"), &version) || version != 1)
    return BAD("%s: not an fsdp checkpoint index of version 1", ip);
  c->meta = cJSON_GetObjectItemCaseSensitive(c->root, "meta");
  FSDP_CHECK(parse_strings(cJSON_GetObjectItemCaseSensitive(c->root, "states"), "states", ip, &c->states, &c->nstates));
  FSDP_CHECK(parse_tensors(c, cJSON_GetObjectItemCaseSensitive(c->root, "tensors"), ip));
  FSDP_CHECK(parse_files(c, cJSON_GetObjectItemCaseSensitive(c->root, "files"), ip));
  return parse_segments(c, cJSON_GetObjectItemCaseSensitive(c->root, "segments"), ip);
}

int fsdp_ckpt_open(const char *dir, fsdp_ckpt **out) {
  if (!dir || !out) return fsdp_fail(FSDP_EINVAL, "ckpt_open: NULL argument");
  *out = NULL;
  fsdp_ckpt *c = calloc(1, sizeof *c);
  if (!c || !(c->dir = strdup(dir))) {
    free(c);
    return fsdp_fail(FSDP_ENOMEM, "ckpt_open: out of memory");
  }
  int rc = open_index(c);
  if (rc != FSDP_OK) {
    fsdp_ckpt_close(c);
    return rc;
  }
  *out = c;
  return FSDP_OK;
}

int fsdp_ckpt_tensor_count(const fsdp_ckpt *c) { return c ? c->ntensors : 0; }

int fsdp_ckpt_tensor_info(const fsdp_ckpt *c, int i, const char **name, int *ndim, int64_t *shape) {
  if (!c || i < 0 || i >= c->ntensors) return fsdp_fail(FSDP_EINVAL, "ckpt_tensor_info: no tensor %d", i);
  const tensor_info *t = &c->tensors[i];
  if (name) *name = t->name;
  if (ndim) *ndim = t->ndim;
  for (int k = 0; shape && k < t->ndim; k++) shape[k] = t->shape[k];
  return FSDP_OK;
}

int fsdp_ckpt_has_state(const fsdp_ckpt *c, const char *state) {
  for (int s = 0; c && state && s < c->nstates; s++)
    if (!strcmp(c->states[s], state)) return 1;
  return 0;
}

/* the meta object's member at a dotted path ("train.step") */
static const cJSON *meta_at(const fsdp_ckpt *c, const char *key) {
  const cJSON *at = c ? c->meta : NULL;
  char part[256];
  while (at && key && *key) {
    const char *dot = strchr(key, '.');
    size_t len = dot ? (size_t)(dot - key) : strlen(key);
    if (len >= sizeof part) return NULL;
    memcpy(part, key, len);
    part[len] = 0;
    at = cJSON_GetObjectItemCaseSensitive(at, part);
    key = dot ? dot + 1 : NULL;
  }
  return at;
}

int fsdp_ckpt_meta_number(const fsdp_ckpt *c, const char *key, double *out) {
  const cJSON *v = meta_at(c, key);
  if (!cJSON_IsNumber(v)) return FSDP_ABSENT;
  *out = v->valuedouble;
  return FSDP_OK;
}

int fsdp_ckpt_meta_string(const fsdp_ckpt *c, const char *key, char *buf, int64_t cap) {
  const cJSON *v = meta_at(c, key);
  if (!cJSON_IsString(v) || cap < 1) return FSDP_ABSENT;
  snprintf(buf, (size_t)cap, "%s", v->valuestring);
  return FSDP_OK;
}

static int file_fd(fsdp_ckpt *c, int f) {
  if (c->fds[f] >= 0) return c->fds[f];
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", c->dir, c->files[f]);
  c->fds[f] = open(path, O_RDONLY);
  if (c->fds[f] < 0) return fsdp_fail(FSDP_EIO, "checkpoint '%s': cannot open '%s': %s", c->dir, c->files[f], strerror(errno));
  return c->fds[f];
}

/* a whole segment into scratch, verified */
static int load_segment(fsdp_ckpt *c, const seg *s) {
  size_t bytes = (size_t)(s->end - s->begin) * 4;
  if (bytes > c->scratch_bytes) {
    void *p = realloc(c->scratch, bytes);
    if (!p) return fsdp_fail(FSDP_ENOMEM, "checkpoint: out of memory for a %zu-byte segment", bytes);
    c->scratch = p;
    c->scratch_bytes = bytes;
  }
  int fd = file_fd(c, s->file);
  FSDP_CHECK(fd);
  size_t got = 0;
  while (got < bytes) {
    ssize_t k = pread(fd, (char *)c->scratch + got, bytes - got, (off_t)(s->offset + (int64_t)got));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return BAD("checkpoint '%s': '%s' ends inside the %s of '%s' (bytes %lld..%lld)", c->dir, c->files[s->file],
                 c->states[s->state], c->tensors[s->tensor].name, (long long)s->offset, (long long)(s->offset + (int64_t)bytes));
    got += (size_t)k;
    fsdp_heartbeat_pulse(); /* a long read is progress (fsdprun --heartbeat-timeout) */
  }
  uint32_t crc = fsdp_crc32c(0, c->scratch, bytes);
  if (crc != s->crc)
    return BAD("checkpoint '%s': checksum mismatch in '%s' bytes %lld..%lld (%s of '%s', elements [%lld, %lld)): crc32c "
               "%08x, the index says %08x", c->dir, c->files[s->file], (long long)s->offset,
               (long long)(s->offset + (int64_t)bytes), c->states[s->state], c->tensors[s->tensor].name,
               (long long)s->begin, (long long)s->end, crc, s->crc);
  return FSDP_OK;
}

int fsdp_ckpt_read(fsdp_ckpt *c, const char *tensor, const char *state, int64_t begin, int64_t end, float *dst) {
  if (!c || !tensor || !state || (end > begin && !dst)) return fsdp_fail(FSDP_EINVAL, "ckpt_read: NULL argument");
  int t = -1, s = -1;
  for (int i = 0; i < c->ntensors && t < 0; i++)
    if (!strcmp(c->tensors[i].name, tensor)) t = i;
  for (int i = 0; i < c->nstates && s < 0; i++)
    if (!strcmp(c->states[i], state)) s = i;
  if (t < 0) return fsdp_fail(FSDP_EINVAL, "checkpoint '%s' has no tensor '%s'", c->dir, tensor);
  if (s < 0) return fsdp_fail(FSDP_EINVAL, "checkpoint '%s' has no state '%s' (it has the optimizer state of another optimizer?)", c->dir, state);
  if (begin < 0 || end > c->tensors[t].numel || begin > end)
    return fsdp_fail(FSDP_EINVAL, "ckpt_read: elements [%lld, %lld) of '%s', which has %lld", (long long)begin,
                     (long long)end, tensor, (long long)c->tensors[t].numel);
  /* the first segment of (t, s) that ends after begin */
  int64_t lo = 0, hi = c->nsegs;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    const seg *m = &c->segs[mid];
    if (m->tensor < t || (m->tensor == t && (m->state < s || (m->state == s && m->end <= begin)))) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t j = lo; j < c->nsegs && begin < end; j++) {
    const seg *g = &c->segs[j];
    if (g->tensor != t || g->state != s || g->begin > begin) break; /* the coverage check at open makes this unreachable */
    FSDP_CHECK(load_segment(c, g));
    int64_t take = (g->end < end ? g->end : end) - begin;
    memcpy(dst, (const float *)c->scratch + (begin - g->begin), (size_t)take * 4);
    dst += take;
    begin += take;
  }
  if (begin < end) return BAD("checkpoint '%s': no segment holds element %lld of '%s'", c->dir, (long long)begin, tensor);
  return FSDP_OK;
}
