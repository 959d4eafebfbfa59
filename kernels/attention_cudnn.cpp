// attention_cudnn.cpp: causal grouped-query attention through cuDNN's fused
// flash attention (the cuDNN frontend's graph API), forward and backward,
// bf16 in and out, fp32 softmax statistics.
//
// Why: at sequence 4096 attention is about a fifth of a Llama step's FLOPs,
// and cuDNN's fused kernels are what PyTorch's fastest SDPA path runs on
// Hopper and Ampere. Our own kernels (attention.cu, attention_tc.cu) stay
// as the fallback and for every shape cuDNN refuses.
//
// How: a graph is built per (device, direction, B, T, H, Hkv, D) on first
// use, its execution plan chosen by cuDNN's heuristics, and both kept in a
// cache with the answer "supported or not, and why". Tensors keep our
// layouts: q, out, dq, dout [B, T, H, D], k, v, dk, dv [B, T, Hkv, D] are
// given to cuDNN as [B, H, T, D] with strides (no copies); the statistics
// are our lse [B, H, T] (natural-log log-sum-exp of the scaled scores).
// The backward runs cuDNN's deterministic algorithm by default (results
// repeat bit for bit, as our kernels' do); FSDP_CUDNN_DETERMINISTIC=0
// allows the faster one with atomics. The workspace comes from fsdp_alloc
// on the device (counted in the memory statistics) and is returned after
// the launch, reused in stream order like any activation.
//
// libcudnn is not linked: the frontend's dynamic loading is used, and
// libcudnn.so.9 (or FSDP_CUDNN_LIB) is opened on the first call, so CPU
// jobs never map it and a machine without cuDNN still runs our kernels.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>

extern "C" {
#include "../src/base/error.h"
#include "../src/fsdp_kernels.h"
}
#include "attention_cudnn.h"

// the frontend's dynamic loading reads libcudnn's handle from here
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

namespace fe = cudnn_frontend;

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

// ---- loading libcudnn once ----

std::mutex g_lock;  // the library, the handles and the plan cache
bool g_tried = false;
std::string g_lib_error;  // empty when libcudnn is loaded
char g_version[128] = "cuDNN not loaded yet";

bool load_cudnn(void) {
  if (g_tried) return g_lib_error.empty();
  g_tried = true;
  // the frontend looks for the CUDA runtime by name; name the one this
  // library is linked against, so that a second major version elsewhere on
  // the path (a Python environment's) is not taken instead
  if (!getenv("CUDNN_FRONTEND_CUDART_LIB_NAME")) {
    char name[32];
    snprintf(name, sizeof name, "libcudart.so.%d", CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", name, 0);
  }
  const char *lib = getenv("FSDP_CUDNN_LIB");
  if (!lib || !*lib) lib = "libcudnn.so.9";
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    g_lib_error = std::string("cannot load ") + lib + ": " + (e ? e : "unknown error") +
                  " (install cuDNN 9, or name the library in FSDP_CUDNN_LIB)";
    snprintf(g_version, sizeof g_version, "no cuDNN (%s not found)", lib);
    return false;
  }
  auto get_version = reinterpret_cast<size_t (*)(void)>(dlsym(h, "cudnnGetVersion"));
  size_t v = get_version ? get_version() : 0;
  if (v < 90000) {
    g_lib_error = std::string(lib) + " is cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) +
                  "; the fused attention needs cuDNN 9 or newer";
    snprintf(g_version, sizeof g_version, "no cuDNN (%s is too old)", lib);
    dlclose(h);
    return false;
  }
  fe::cudnn_dlhandle = h;
  snprintf(g_version, sizeof g_version, "cuDNN %zu.%zu.%zu (frontend %d.%d.%d)", v / 10000, v / 100 % 100, v % 100,
           CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
  return true;
}

constexpr int MAX_DEVICES = 64;
cudnnHandle_t g_handles[MAX_DEVICES];

int handle_for(int dev, cudnnHandle_t *out) {
  if (!g_handles[dev] && fe::detail::create_handle(&g_handles[dev]) != CUDNN_STATUS_SUCCESS) {
    g_handles[dev] = nullptr;
    return fsdp_fail(FSDP_EDEVICE, "cuDNN attention: cudnnCreate failed on GPU %d", dev);
  }
  *out = g_handles[dev];
  return FSDP_OK;
}

// ---- plans, one per shape and direction ----

struct Shape {
  int64_t B, T, H, Hkv, D;
};

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string why;  // empty: usable
};

using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t>;
std::map<Key, Plan> g_plans;
constexpr size_t MAX_PLANS = 256;  // shapes are few in training; past this, start over

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// [B, heads, T, D] logical dims over our [B, T, heads, D] memory
Tensor bthd(const std::shared_ptr<fe::graph::Graph> &g, const char *name, int64_t uid, const Shape &s, int64_t heads) {
  return g->tensor(fe::graph::Tensor_attributes()
                       .set_name(name)
                       .set_uid(uid)
                       .set_dim({s.B, heads, s.T, s.D})
                       .set_stride({s.T * heads * s.D, s.D, heads * s.D, 1}));
}

void as_bthd(const Tensor &t, int64_t uid, const Shape &s, int64_t heads) {
  t->set_output(true).set_uid(uid).set_dim({s.B, heads, s.T, s.D}).set_stride({s.T * heads * s.D, s.D, heads * s.D, 1});
}

// our lse [B, H, T] as cuDNN's statistics [B, H, T, 1], fp32
void as_stats(const Tensor &t, const Shape &s) {
  t->set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.H, s.T, 1}).set_stride({s.H * s.T, s.T, 1, 1});
}

bool deterministic(void) {
  const char *e = getenv("FSDP_CUDNN_DETERMINISTIC");
  return !(e && !strcmp(e, "0"));
}

Plan build_plan(cudnnHandle_t h, const Shape &s, bool backward) {
  Plan p;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  Tensor q = bthd(g, "q", UID_Q, s, s.H), k = bthd(g, "k", UID_K, s, s.Hkv), v = bthd(g, "v", UID_V, s, s.Hkv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  if (!backward) {
    auto opts = fe::graph::SDPA_attributes().set_name("fsdp_attention").set_generate_stats(true).set_causal_mask(true)
                    .set_attn_scale(scale);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    as_bthd(o, UID_O, s, s.H);
    stats->set_output(true);
    as_stats(stats, s);
  } else {
    Tensor o = bthd(g, "o", UID_O, s, s.H), dout = bthd(g, "dout", UID_DO, s, s.H);
    Tensor stats = g->tensor(fe::graph::Tensor_attributes().set_name("stats"));
    as_stats(stats, s);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("fsdp_attention_backward")
                    .set_causal_mask(true)
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(deterministic());
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
    as_bthd(dq, UID_DQ, s, s.H);
    as_bthd(dk, UID_DK, s, s.Hkv);
    as_bthd(dv, UID_DV, s, s.Hkv);
  }
  auto st = g->build(h, {fe::HeurMode_t::A});
  if (st.is_good()) st = g->get_workspace_size(p.workspace);
  if (st.is_bad()) {
    p.why = "cuDNN has no plan for this shape: " + st.get_message();
    return p;
  }
  p.graph = g;
  return p;
}

int current_device(void) {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MAX_DEVICES ? dev : -1;
}

// the cached plan for this call, built on first use; nullptr with why set
// when cuDNN cannot take it. Callers hold g_lock.
const Plan *plan_for(const Shape &s, bool backward, cudnnHandle_t *h, std::string *why) {
  if (!load_cudnn()) {
    *why = g_lib_error;
    return nullptr;
  }
  int dev = current_device();
  if (dev < 0) {
    *why = std::string("no current CUDA device (") + g_version + " is loaded)";
    return nullptr;
  }
  Key key{dev, backward ? 1 : 0, s.B, s.T, s.H, s.Hkv, s.D};
  auto it = g_plans.find(key);
  if (it == g_plans.end()) {
    if (handle_for(dev, h) != FSDP_OK) {
      *why = fsdp_last_error();
      return nullptr;
    }
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    Plan p;
    if (major < 8) p.why = "cuDNN's fused attention needs a GPU of compute capability 8.0 or newer";
    else {
      try {
        p = build_plan(*h, s, backward);
      } catch (const std::exception &e) {
        p = Plan{};
        p.why = std::string("cuDNN: ") + e.what();
      }
    }
    if (g_plans.size() >= MAX_PLANS) g_plans.clear();
    it = g_plans.emplace(key, std::move(p)).first;
  }
  if (!it->second.why.empty()) {
    *why = it->second.why;
    return nullptr;
  }
  if (handle_for(dev, h) != FSDP_OK) {
    *why = fsdp_last_error();
    return nullptr;
  }
  return &it->second;
}

int run(const Shape &s, bool backward, std::unordered_map<int64_t, void *> &pack, void *stream, const char *what) {
  std::lock_guard<std::mutex> lock(g_lock);
  cudnnHandle_t h = nullptr;
  std::string why;
  const Plan *p = plan_for(s, backward, &h, &why);
  if (!p) return fsdp_fail(FSDP_EUNSUPPORTED, "%s: %s", what, why.c_str());
  void *ws = nullptr;
  if (p->workspace > 0)
    FSDP_CHECK(fsdp_alloc(FSDP_CUDA, static_cast<size_t>(p->workspace), &ws));
  int rc = FSDP_OK;
  try {
    if (fe::detail::set_stream(h, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS)
      rc = fsdp_fail(FSDP_EDEVICE, "%s: cudnnSetStream failed", what);
    else {
      auto st = p->graph->execute(h, pack, ws);
      if (st.is_bad()) rc = fsdp_fail(FSDP_EDEVICE, "%s: %s", what, st.get_message().c_str());
    }
  } catch (const std::exception &e) {
    rc = fsdp_fail(FSDP_EDEVICE, "%s: %s", what, e.what());
  }
  if (ws) fsdp_free(FSDP_CUDA, ws);  // reused in stream order, as activations are
  return rc;
}

}  // namespace

extern "C" int fsdp_attention_cudnn_applies(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward,
                                            char *why, size_t why_len) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(g_lock);
    cudnnHandle_t h = nullptr;
    if (plan_for(Shape{B, T, H, Hkv, D}, backward != 0, &h, &reason)) return 1;
  }
  if (why && why_len) snprintf(why, why_len, "%s", reason.c_str());
  return 0;
}

extern "C" int64_t fsdp_attention_cudnn_workspace(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                                  int backward) {
  std::lock_guard<std::mutex> lock(g_lock);
  cudnnHandle_t h = nullptr;
  std::string why;
  const Plan *p = plan_for(Shape{B, T, H, Hkv, D}, backward != 0, &h, &why);
  return p ? p->workspace : -1;
}

extern "C" int fsdp_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream) {
  std::unordered_map<int64_t, void *> pack{{UID_Q, const_cast<void *>(q)},
                                           {UID_K, const_cast<void *>(k)},
                                           {UID_V, const_cast<void *>(v)},
                                           {UID_O, out},
                                           {UID_STATS, lse}};
  return run(Shape{B, T, H, Hkv, D}, false, pack, stream, "cuDNN attention forward");
}

extern "C" int fsdp_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                             const void *k, const void *v, const void *out, const float *lse,
                                             int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream) {
  std::unordered_map<int64_t, void *> pack{{UID_Q, const_cast<void *>(q)},
                                           {UID_K, const_cast<void *>(k)},
                                           {UID_V, const_cast<void *>(v)},
                                           {UID_O, const_cast<void *>(out)},
                                           {UID_DO, const_cast<void *>(dout)},
                                           {UID_STATS, const_cast<float *>(lse)},
                                           {UID_DQ, dq},
                                           {UID_DK, dk},
                                           {UID_DV, dv}};
  return run(Shape{B, T, H, Hkv, D}, true, pack, stream, "cuDNN attention backward");
}

extern "C" const char *fsdp_attention_cudnn_version(void) {
  std::lock_guard<std::mutex> lock(g_lock);
  load_cudnn();
  return g_version;
}
