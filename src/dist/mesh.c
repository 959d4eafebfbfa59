/* mesh.c: a device mesh: named dimensions over the world's ranks (row-major,
 * first dimension outermost), this rank's coordinates, and one communicator
 * per group along any set of dimensions, created on first use. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../device/cuda_backend.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"

#define MESH_MAX_DIMS 8
#define MESH_MAX_GROUPS 64

struct fsdp_mesh {
  int ndims, device, id, world_rank, world_size;
  char names[MESH_MAX_DIMS][64];
  int64_t sizes[MESH_MAX_DIMS], coord[MESH_MAX_DIMS], stride[MESH_MAX_DIMS];
  struct {
    unsigned dims; /* bit set of dimension indices */
    int channel;   /* 0, or another communicator over the same members */
    fsdp_comm *comm;
  } groups[MESH_MAX_GROUPS];
  int ngroups;
};

static int mesh_counter; /* meshes are created collectively, so ids agree */

static int valid_name(const char *s) {
  if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || *s == '_')) return 0;
  return 1;
}

int fsdp_mesh_create(int ndims, const char *const *names, const int64_t *sizes, int device, fsdp_mesh **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "mesh: NULL out");
  *out = NULL;
  if (ndims < 1 || ndims > MESH_MAX_DIMS)
    return fsdp_fail(FSDP_EINVAL, "mesh: %d dimensions; expected 1 to %d", ndims, MESH_MAX_DIMS);
  if (!names || !sizes) return fsdp_fail(FSDP_EINVAL, "mesh: NULL names or sizes");
  if (device != FSDP_CPU && device != FSDP_CUDA)
    return fsdp_fail(FSDP_EINVAL, "mesh: unknown device %d (expected cpu or cuda)", device);
  fsdp_proc_info info;
  FSDP_CHECK(fsdp_init(&info));

  int64_t known = 1;
  int rest = -1;
  for (int i = 0; i < ndims; i++) {
    if (!valid_name(names[i]) || strlen(names[i]) >= 64)
      return fsdp_fail(FSDP_EINVAL, "mesh: dimension %d has name '%s'; expected an identifier ([A-Za-z_][A-Za-z0-9_]*)",
                       i + 1, names[i] ? names[i] : "(null)");
    if (!strcmp(names[i], "world"))
      return fsdp_fail(FSDP_EINVAL, "mesh: 'world' is reserved for the group of all ranks; rename dimension %d", i + 1);
    for (int j = 0; j < i; j++)
      if (!strcmp(names[i], names[j])) return fsdp_fail(FSDP_EINVAL, "mesh: dimension '%s' appears twice", names[i]);
    if (sizes[i] == -1) {
      if (rest >= 0)
        return fsdp_fail(FSDP_EINVAL, "mesh: dimensions '%s' and '%s' are both -1; at most one may be", names[rest],
                         names[i]);
      rest = i;
    } else if (sizes[i] < 1) {
      return fsdp_fail(FSDP_EINVAL, "mesh: dimension '%s' has size %lld; expected a positive size or -1 (the rest)",
                       names[i], (long long)sizes[i]);
    } else {
      known = known > (int64_t)1 << 40 ? known : known * sizes[i]; /* saturate: reported below */
    }
  }
  fsdp_mesh *m = calloc(1, sizeof *m);
  if (!m) return fsdp_fail(FSDP_ENOMEM, "mesh: out of memory");
  m->ndims = ndims;
  m->device = device;
  m->world_rank = info.rank;
  m->world_size = info.size;
  for (int i = 0; i < ndims; i++) {
    snprintf(m->names[i], sizeof m->names[i], "%s", names[i]);
    m->sizes[i] = sizes[i];
  }
  if (rest >= 0) {
    if (known > info.size || info.size % known) {
      int rc = fsdp_fail(FSDP_EINVAL,
                         "mesh: dimension '%s' = -1 cannot fill the world: %d ranks are not a multiple of %lld (the "
                         "product of the other dimensions)", names[rest], info.size, (long long)known);
      free(m);
      return rc;
    }
    m->sizes[rest] = info.size / known;
  } else if (known != info.size) {
    char shape[512] = "";
    size_t len = 0;
    for (int i = 0; i < ndims; i++)
      len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%s=%lld", i ? " x " : "", names[i],
                              (long long)sizes[i]);
    int rc = fsdp_fail(FSDP_EINVAL, "mesh: %s has %lld ranks but the world has %d; change a dimension or set one to -1",
                       shape, (long long)known, info.size);
    free(m);
    return rc;
  }
  int64_t r = info.rank;
  for (int i = ndims - 1; i >= 0; i--) {
    m->stride[i] = i == ndims - 1 ? 1 : m->stride[i + 1] * m->sizes[i + 1];
    m->coord[i] = r % m->sizes[i];
    r /= m->sizes[i];
  }
  m->id = mesh_counter++;
  *out = m;
  return FSDP_OK;
}

int fsdp_mesh_destroy(fsdp_mesh *m) {
  if (!m) return FSDP_OK;
  /* a comm lives on while a unit or pool still holds it */
  for (int i = 0; i < m->ngroups; i++) fsdp_comm_release(m->groups[i].comm);
  free(m);
  return FSDP_OK;
}

int fsdp_mesh_ndims(const fsdp_mesh *m) { return m ? m->ndims : fsdp_fail(FSDP_EINVAL, "mesh: NULL mesh"); }
int fsdp_mesh_device(const fsdp_mesh *m) { return m ? m->device : fsdp_fail(FSDP_EINVAL, "mesh: NULL mesh"); }

const char *fsdp_mesh_dim_name(const fsdp_mesh *m, int dim) {
  return m && dim >= 0 && dim < m->ndims ? m->names[dim] : NULL;
}

int64_t fsdp_mesh_dim_size(const fsdp_mesh *m, int dim) {
  if (!m || dim < 0 || dim >= m->ndims) return fsdp_fail(FSDP_EINVAL, "mesh: no dimension %d", dim);
  return m->sizes[dim];
}

int64_t fsdp_mesh_coord(const fsdp_mesh *m, int dim) {
  if (!m || dim < 0 || dim >= m->ndims) return fsdp_fail(FSDP_EINVAL, "mesh: no dimension %d", dim);
  return m->coord[dim];
}

static void list_dims(const fsdp_mesh *m, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < m->ndims && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", m->names[i]);
}

int fsdp_mesh_dim_index(const fsdp_mesh *m, const char *name) {
  if (!m || !name) return fsdp_fail(FSDP_EINVAL, "mesh: NULL mesh or name");
  for (int i = 0; i < m->ndims; i++)
    if (!strcmp(m->names[i], name)) return i;
  char dims[600];
  list_dims(m, dims, sizeof dims);
  return fsdp_fail(FSDP_EINVAL, "mesh: no dimension '%s' (dimensions: %s)", name, dims);
}

/* "a,b" -> bit set; "" or "world" -> all dimensions */
static int parse_dims(const fsdp_mesh *m, const char *spec, unsigned *set) {
  *set = 0;
  if (!spec || !spec[0] || !strcmp(spec, "world")) {
    *set = (1u << m->ndims) - 1;
    return FSDP_OK;
  }
  char buf[512];
  if (strlen(spec) >= sizeof buf) return fsdp_fail(FSDP_EINVAL, "mesh group: dimension list too long");
  snprintf(buf, sizeof buf, "%s", spec);
  for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    int i = fsdp_mesh_dim_index(m, tok);
    if (i < 0) return i;
    if (*set & (1u << i)) return fsdp_fail(FSDP_EINVAL, "mesh group '%s': dimension '%s' given twice", spec, tok);
    *set |= 1u << i;
  }
  if (!*set) return fsdp_fail(FSDP_EINVAL, "mesh group '%s': no dimension named", spec);
  return FSDP_OK;
}

/* the NCCL transport lives in the CUDA backend (libfsdp_cuda.so), opened
 * on demand: looked up by name, so the device layer's table need not know
 * a dist type */
static int nccl_create(const comm_group_spec *spec, fsdp_comm **out) {
  int (*create)(const comm_group_spec *, fsdp_comm **) =
      (int (*)(const comm_group_spec *, fsdp_comm **))fsdp_cuda_symbol("fsdp_comm_nccl_create");
  if (!create) return fsdp_fail_context(FSDP_EUNSUPPORTED, "mesh: no NCCL transport");
  return create(spec, out);
}

int fsdp_mesh_group(fsdp_mesh *m, const char *dims, fsdp_comm **out) { return fsdp_mesh_group_channel(m, dims, 0, out); }

int fsdp_mesh_group_channel(fsdp_mesh *m, const char *dims, int channel, fsdp_comm **out) {
  if (!m || !out) return fsdp_fail(FSDP_EINVAL, "mesh group: NULL mesh or out");
  *out = NULL;
  if (channel < 0 || channel > 7) return fsdp_fail(FSDP_EINVAL, "mesh group: channel %d; expected 0..7", channel);
  unsigned set;
  FSDP_CHECK(parse_dims(m, dims, &set));
  for (int g = 0; g < m->ngroups; g++)
    if (m->groups[g].dims == set && m->groups[g].channel == channel) {
      *out = m->groups[g].comm;
      return FSDP_OK;
    }
  if (m->ngroups == MESH_MAX_GROUPS) return fsdp_fail(FSDP_EINVAL, "mesh: more than %d groups", MESH_MAX_GROUPS);

  /* Members: every rank that shares my coordinates outside the set, in rank
   * order (= row-major order of the set's coordinates). */
  int64_t gsize = 1, color = 0;
  for (int i = 0; i < m->ndims; i++) {
    if (set & (1u << i))
      gsize *= m->sizes[i];
    else
      color = color * m->sizes[i] + m->coord[i];
  }
  int *members = malloc(sizeof(int) * (size_t)gsize);
  if (!members) return fsdp_fail(FSDP_ENOMEM, "mesh group: out of memory");
  int nm = 0, me = -1;
  for (int r = 0; r < m->world_size; r++) {
    int64_t rr = r, keep = 1;
    for (int i = m->ndims - 1; i >= 0; i--) {
      int64_t ci = rr % m->sizes[i];
      rr /= m->sizes[i];
      if (!(set & (1u << i)) && ci != m->coord[i]) keep = 0;
    }
    if (!keep) continue;
    if (r == m->world_rank) me = nm;
    members[nm++] = r;
  }
  /* name: "dp_shard" or "dp_outer+dp_shard", then the fixed coordinates */
  char name[128], tag[96];
  size_t len = 0;
  name[0] = '\0';
  for (int i = 0; i < m->ndims; i++)
    if (set & (1u << i)) len += (size_t)snprintf(name + len, sizeof name - len, "%s%s", len ? "+" : "", m->names[i]);
  if (set == (1u << m->ndims) - 1) snprintf(name, sizeof name, "world");
  int first = 1;
  for (int i = 0; i < m->ndims && len < sizeof name; i++)
    if (!(set & (1u << i))) {
      len += (size_t)snprintf(name + len, sizeof name - len, "%s%s=%lld", first ? "{" : ",", m->names[i],
                              (long long)m->coord[i]);
      first = 0;
    }
  if (!first && len < sizeof name) len += (size_t)snprintf(name + len, sizeof name - len, "}");
  if (channel && len < sizeof name) snprintf(name + len, sizeof name - len, "#%d", channel);
  snprintf(tag, sizeof tag, "m%d.s%u.c%lld.k%d", m->id, set, (long long)color, channel);

  comm_group_spec spec = {name, tag, members, nm, me};
  fsdp_comm *c = NULL;
  int rc = m->device == FSDP_CUDA ? nccl_create(&spec, &c) : fsdp_comm_shm_create(&spec, &c);
  free(members);
  if (rc < 0) return fsdp_fail_context(rc, "mesh group '%s'", name);
  m->groups[m->ngroups].dims = set;
  m->groups[m->ngroups].channel = channel;
  m->groups[m->ngroups].comm = c;
  m->ngroups++;
  *out = c;
  return FSDP_OK;
}

int fsdp_mesh_describe(const fsdp_mesh *m, char *buf, size_t cap) {
  if (!m || !buf || !cap) return fsdp_fail(FSDP_EINVAL, "mesh_describe: NULL argument");
  size_t len = (size_t)snprintf(buf, cap, "mesh ");
  for (int i = 0; i < m->ndims && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%lld", i ? " x " : "", m->names[i], (long long)m->sizes[i]);
  if (len < cap)
    len += (size_t)snprintf(buf + len, cap - len, " (%d ranks, %s); rank %d at (", m->world_size,
                            m->device == FSDP_CUDA ? "cuda" : "cpu", m->world_rank);
  for (int i = 0; i < m->ndims && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%lld", i ? ", " : "", m->names[i], (long long)m->coord[i]);
  if (len < cap) len += (size_t)snprintf(buf + len, cap - len, ")");
  for (int g = 0; g < m->ngroups && len < cap; g++) {
    const fsdp_comm *c = m->groups[g].comm;
    len += (size_t)snprintf(buf + len, cap - len, "\n  group %s: %d ranks [", c->name, c->size);
    for (int i = 0; i < c->size && len < cap; i++)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? " " : "", c->members[i]);
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "], this rank is member %d, transport %s", c->rank,
                                           c->ops->transport);
  }
  return FSDP_OK;
}
