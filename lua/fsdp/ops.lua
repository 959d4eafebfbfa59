-- fsdp.ops: the model's operations on tensors, dispatched by device: the
-- CPU ops (src/ops/, fp32) or their CUDA twins (kernels/, fp32 or bf16 in
-- the tensors' dtype) on the process's compute stream. Weights and grads
-- are raw pointers bound by fully_shard; everything else is a tensor.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local autograd = require "fsdp.autograd"
local streams = require "fsdp.stream"
local ffi, C, check, CU = base.ffi, base.C, base.check, base.cuda

local M = {}

-- One compute stream per process for every CUDA op; fully_shard orders the
-- units' collectives against it with events.
local compute
function M.compute_stream()
  if not compute then compute = streams.stream("cuda") end
  return compute
end
local function S() return M.compute_stream():live("ops") end

local function on_cuda(t) return t.device == "cuda" end

-- a new tensor on x's device, in x's dtype unless given
function M.like(x, shape, dtype) return tensor.new(shape or x.shape, dtype or x.dtype, x.device) end

local function cpu_only(t, what)
  if on_cuda(t) then error(what .. ": there is no CUDA version of this op", 3) end
end

-- The one liveness check for both devices: every op turns its tensors into
-- pointers here before it picks the CPU op or the CUDA kernel, so a freed
-- tensor (or a view of one) is an error naming the op on either device,
-- never a NULL or stale pointer handed to a kernel. nil (an optional
-- tensor) stays nil.
local function ptrs(what, ...)
  local n, out = select("#", ...), {}
  for i = 1, n do
    local t = select(i, ...)
    if t ~= nil then
      if tensor.dead(t) then error(string.format("%s: tensor argument %d used after free() (of it or of the tensor it views)", what, i), 3) end
      out[i] = t:ptr()
    end
  end
  return unpack(out, 1, n)
end
M.ptrs = ptrs

-- count elements of src from its element si into dst from its element di
-- (the reorders of fsdp.tp and fsdp.cp; the views are nobody's): on a GPU
-- a copy on the compute stream, in its order; on the CPU at once
function M.copy(dst, di, src, si, count)
  dst:view(di, count):copy_from(src:view(si, count), on_cuda(dst) and M.compute_stream() or nil)
end

function M.linear_forward(y, x, w, b, n, inp, out)
  local yp, xp = ptrs("Linear forward", y, x)
  if on_cuda(y) then return check(CU().fsdp_cuda_linear_forward(yp, xp, w, b, n, inp, out, y.dtype_id, S()), "Linear forward") end
  check(C.fsdp_linear_forward(yp, xp, w, b, n, inp, out), "Linear forward")
end

function M.linear_backward(dx, dw, db, dy, x, w, n, inp, out)
  local dxp, dyp, xp = ptrs("Linear backward", dx, dy, x)
  if on_cuda(dy) then
    return check(CU().fsdp_cuda_linear_backward(dxp, dw, db, dyp, xp, w, n, inp, out, dy.dtype_id, S()), "Linear backward")
  end
  check(C.fsdp_linear_backward(dxp, dw, db, dyp, xp, w, n, inp, out), "Linear backward")
end

-- first, rows (default 0, vocab): a vocab-parallel slice's rows of the
-- table (fsdp.tp): ids outside them give zero rows and no gradient
function M.embedding_forward(y, ids, w, n, vocab, dim, first, rows)
  local yp, idp = ptrs("Embedding forward", y, ids)
  first, rows = first or 0, rows or vocab
  if on_cuda(y) then
    return check(CU().fsdp_cuda_embedding_forward_slice(yp, idp, w, n, vocab, first, rows, dim, y.dtype_id, S()),
      "Embedding forward")
  end
  check(C.fsdp_embedding_forward_slice(yp, idp, w, n, vocab, first, rows, dim), "Embedding forward")
end

function M.embedding_backward(dw, dy, ids, n, vocab, dim, first, rows)
  local dyp, idp = ptrs("Embedding backward", dy, ids)
  first, rows = first or 0, rows or vocab
  if on_cuda(dy) then
    return check(CU().fsdp_cuda_embedding_backward_slice(dw, dyp, idp, n, vocab, first, rows, dim, dy.dtype_id, S()),
      "Embedding backward")
  end
  check(C.fsdp_embedding_backward_slice(dw, dyp, idp, n, vocab, first, rows, dim), "Embedding backward")
end

function M.rmsnorm_forward(y, rstd, x, w, n, dim, eps)
  local yp, rp, xp = ptrs("RMSNorm forward", y, rstd, x)
  if on_cuda(y) then return check(CU().fsdp_cuda_rmsnorm_forward(yp, rp, xp, w, n, dim, eps, y.dtype_id, S()), "RMSNorm forward") end
  check(C.fsdp_rmsnorm_forward(yp, rp, xp, w, n, dim, eps), "RMSNorm forward")
end

function M.rmsnorm_backward(dx, dw, dy, x, w, rstd, n, dim)
  local dxp, dyp, xp, rp = ptrs("RMSNorm backward", dx, dy, x, rstd)
  if on_cuda(dx) then
    return check(CU().fsdp_cuda_rmsnorm_backward(dxp, dw, dyp, xp, w, rp, n, dim, dx.dtype_id, S()), "RMSNorm backward")
  end
  check(C.fsdp_rmsnorm_backward(dxp, dw, dyp, xp, w, rp, n, dim), "RMSNorm backward")
end

-- cos/sin tables [seq, head_dim] (fp32) on the device that will use them
function M.rope_tables(seq, hd, theta, scaling, device)
  local cos, sin = tensor.new({ seq, hd }), tensor.new({ seq, hd })
  local sc = nil
  if scaling then
    sc = ffi.new("fsdp_rope_scaling", { factor = scaling.factor, low_freq_factor = scaling.low_freq_factor,
      high_freq_factor = scaling.high_freq_factor,
      original_max_position_embeddings = scaling.original_max_position_embeddings })
  end
  check(C.fsdp_rope_table(cos:ptr(), sin:ptr(), seq, hd, theta, sc), "rope table")
  if device == "cuda" then -- (the host tables freed at once: nobody's scope owns them)
    local hc, hs = cos, sin
    cos = tensor.new({ seq, hd }, "fp32", "cuda"):copy_from(hc)
    sin = tensor.new({ seq, hd }, "fp32", "cuda"):copy_from(hs)
    hc:free()
    hs:free()
  end
  return { cos = cos, sin = sin, seq = seq, device = device }
end

-- (lasting state, nobody's activation: its owner frees it when done)
function M.rope_tables_free(t)
  t.cos:free()
  t.sin:free()
end

-- Packed rows (several documents in a row of T): doc_start, an int32
-- {B, T} CPU tensor, holds the first position of the document each
-- position is in (fsdp_doc_start_check says what is allowed). The layout
-- the ops read: it checked, each position's place in its document (pos,
-- rope's table row) and, on a GPU, both on the device.
function M.doc_layout(doc_start, device)
  local B, T = doc_start.shape[1], doc_start.shape[2]
  local l = { start = doc_start, pos = tensor.new({ B, T }, "int32") }
  if device == "cuda" then l.start_dev, l.pos_dev = tensor.new({ B, T }, "int32", "cuda"), tensor.new({ B, T }, "int32", "cuda") end
  if doc_start.meta then return l end -- (a dry run: the same tensors, nothing to read)
  local ds, pp = doc_start:ptr(), l.pos:ptr()
  check(C.fsdp_doc_start_check(ds, B, T), "packed rows")
  for i = 0, B * T - 1 do pp[i] = i % T - ds[i] end
  if device == "cuda" then
    l.start_dev:copy_from(doc_start)
    l.pos_dev:copy_from(l.pos)
  end
  return l
end

-- pos: the first position of x's T (generation's new tokens; default 0):
-- the tables' rows from there on, which must exist. docs (packed rows,
-- M.doc_layout): each position turns by its place in its document.
function M.rope(x, t, B, T, heads, hd, backward, pos, docs)
  pos = pos or 0
  if pos + T > t.seq then error(string.format("rope: positions up to %d with tables of %d", pos + T, t.seq), 2) end
  local xp, cp, sp = ptrs("rope", x, t.cos, t.sin)
  cp, sp = cp + pos * hd, sp + pos * hd
  if docs then
    if on_cuda(x) then
      local f = backward and CU().fsdp_cuda_rope_backward_at or CU().fsdp_cuda_rope_forward_at
      return check(f(xp, cp, sp, docs.pos_dev:ptr(), B, T, heads, hd, x.dtype_id, S()), "rope")
    end
    local f = backward and C.fsdp_rope_backward_at or C.fsdp_rope_forward_at
    return check(f(xp, cp, sp, docs.pos:ptr(), B, T, heads, hd), "rope")
  end
  if on_cuda(x) then
    local f = backward and CU().fsdp_cuda_rope_backward or CU().fsdp_cuda_rope_forward
    return check(f(xp, cp, sp, B, T, heads, hd, x.dtype_id, S()), "rope")
  end
  local f = backward and C.fsdp_rope_backward or C.fsdp_rope_forward
  check(f(xp, cp, sp, B, T, heads, hd), "rope")
end

-- docs (packed rows, M.doc_layout): no query sees a key of another document
function M.attention_forward(out, lse, q, k, v, B, T, nh, nkv, hd, docs)
  local op, lp, qp, kp, vp = ptrs("attention", out, lse, q, k, v)
  if docs then
    if on_cuda(out) then
      return check(CU().fsdp_cuda_attention_forward_docs(op, lp, qp, kp, vp, docs.start_dev:ptr(), B, T, nh, nkv, hd,
        out.dtype_id, S()), "attention")
    end
    return check(C.fsdp_attention_forward_docs(op, lp, qp, kp, vp, docs.start:ptr(), B, T, nh, nkv, hd), "attention")
  end
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_forward(op, lp, qp, kp, vp, B, T, nh, nkv, hd, out.dtype_id, S()), "attention")
  end
  check(C.fsdp_attention_forward(op, lp, qp, kp, vp, B, T, nh, nkv, hd), "attention")
end

function M.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nh, nkv, hd, docs)
  local dqp, dkp, dvp, dop, qp, kp, vp, op, lp = ptrs("attention backward", dq, dk, dv, dout, q, k, v, out, lse)
  if docs then
    if on_cuda(dq) then
      return check(CU().fsdp_cuda_attention_backward_docs(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, docs.start_dev:ptr(), B, T,
        nh, nkv, hd, dq.dtype_id, S()), "attention backward")
    end
    return check(C.fsdp_attention_backward_docs(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, docs.start:ptr(), B, T, nh, nkv,
      hd), "attention backward")
  end
  if on_cuda(dq) then
    return check(CU().fsdp_cuda_attention_backward(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, B, T, nh, nkv, hd, dq.dtype_id, S()),
      "attention backward")
  end
  check(C.fsdp_attention_backward(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, B, T, nh, nkv, hd), "attention backward")
end

-- generation: the queries q [B, tq, nh*hd] of positions pos .. pos + tq - 1
-- against the KV cache kc, vc [B, cap, nkv*hd] that holds positions up to
-- theirs (fsdp_attention_cached)
function M.attention_cached(out, q, kc, vc, B, tq, pos, cap, nh, nkv, hd)
  local op, qp, kp, vp = ptrs("attention_cached", out, q, kc, vc)
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_cached(op, qp, kp, vp, B, tq, pos, cap, nh, nkv, hd, out.dtype_id, S()),
      "attention_cached")
  end
  check(C.fsdp_attention_cached(op, qp, kp, vp, B, tq, pos, cap, nh, nkv, hd), "attention_cached")
end

-- Queries at given positions (context parallelism: a rank's chunks of the
-- sequence, fsdp_attention_forward_pos): q_pos, an int32 {Tq} CPU tensor,
-- holds each query row's position among the Tk keys (k, v: the whole
-- sequence, in order), and query i sees keys 0 .. q_pos[i]. On a GPU the
-- kernels read q_pos_dev, its device copy; the host copy is checked here.
-- dk, dv: the whole sequence's gradients, overwritten.
local function pos_arg(what, out, q_pos, q_pos_dev, Tq, Tk)
  local pp = ptrs(what, q_pos)
  if not on_cuda(out) then return pp end
  if q_pos_dev == nil then error(what .. ": on a GPU, q_pos_dev (the device copy of q_pos) is needed", 3) end
  check(C.fsdp_attention_pos_check(pp, Tq, Tk), what)
  return ptrs(what, q_pos_dev)
end

function M.attention_forward_pos(out, lse, q, k, v, q_pos, B, Tq, Tk, nh, nkv, hd, q_pos_dev)
  local what = "attention_forward_pos"
  local op, lp, qp, kp, vp = ptrs(what, out, lse, q, k, v)
  local pp = pos_arg(what, out, q_pos, q_pos_dev, Tq, Tk)
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_forward_pos(op, lp, qp, kp, vp, pp, B, Tq, Tk, nh, nkv, hd, out.dtype_id, S()),
      what)
  end
  check(C.fsdp_attention_forward_pos(op, lp, qp, kp, vp, pp, B, Tq, Tk, nh, nkv, hd), what)
end

function M.attention_backward_pos(dq, dk, dv, dout, q, k, v, out, lse, q_pos, B, Tq, Tk, nh, nkv, hd, q_pos_dev)
  local what = "attention_backward_pos"
  local dqp, dkp, dvp, dop, qp, kp, vp, op, lp = ptrs(what, dq, dk, dv, dout, q, k, v, out, lse)
  local pp = pos_arg(what, dk, q_pos, q_pos_dev, Tq, Tk)
  if on_cuda(dk) then
    return check(CU().fsdp_cuda_attention_backward_pos(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, pp, B, Tq, Tk, nh, nkv,
      hd, dk.dtype_id, S()), what)
  end
  check(C.fsdp_attention_backward_pos(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, pp, B, Tq, Tk, nh, nkv, hd), what)
end

-- The same with packed rows (context parallelism over documents,
-- fsdp_attention_forward_pos_docs): q_lo, an int32 {B, Tq} CPU tensor, the
-- first key each query of each batch row sees (its document's first in
-- this block of keys), so query i sees keys q_lo[b, i] .. q_pos[i]; on a
-- GPU the kernels read q_lo_dev, its device copy (both checked here).
local function pos_docs_arg(what, out, q_pos, q_lo, q_pos_dev, q_lo_dev, B, Tq, Tk)
  local pp, lo = ptrs(what, q_pos, q_lo)
  if not on_cuda(out) then return pp, lo end
  if q_pos_dev == nil or q_lo_dev == nil then error(what .. ": on a GPU, the device copies of q_pos and q_lo are needed", 3) end
  check(C.fsdp_attention_pos_docs_check(pp, lo, B, Tq, Tk), what)
  return ptrs(what, q_pos_dev, q_lo_dev)
end

function M.attention_forward_pos_docs(out, lse, q, k, v, q_pos, q_lo, B, Tq, Tk, nh, nkv, hd, q_pos_dev, q_lo_dev)
  local what = "attention_forward_pos_docs"
  local op, lp, qp, kp, vp = ptrs(what, out, lse, q, k, v)
  local pp, lo = pos_docs_arg(what, out, q_pos, q_lo, q_pos_dev, q_lo_dev, B, Tq, Tk)
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_forward_pos_docs(op, lp, qp, kp, vp, pp, lo, B, Tq, Tk, nh, nkv, hd,
      out.dtype_id, S()), what)
  end
  check(C.fsdp_attention_forward_pos_docs(op, lp, qp, kp, vp, pp, lo, B, Tq, Tk, nh, nkv, hd), what)
end

function M.attention_backward_pos_docs(dq, dk, dv, dout, q, k, v, out, lse, q_pos, q_lo, B, Tq, Tk, nh, nkv, hd, q_pos_dev,
                                       q_lo_dev)
  local what = "attention_backward_pos_docs"
  local dqp, dkp, dvp, dop, qp, kp, vp, op, lp = ptrs(what, dq, dk, dv, dout, q, k, v, out, lse)
  local pp, lo = pos_docs_arg(what, dk, q_pos, q_lo, q_pos_dev, q_lo_dev, B, Tq, Tk)
  if on_cuda(dk) then
    return check(CU().fsdp_cuda_attention_backward_pos_docs(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, pp, lo, B, Tq, Tk, nh,
      nkv, hd, dk.dtype_id, S()), what)
  end
  check(C.fsdp_attention_backward_pos_docs(dqp, dkp, dvp, dop, qp, kp, vp, op, lp, pp, lo, B, Tq, Tk, nh, nkv, hd), what)
end

-- Ring attention's combine (context parallelism, fsdp_attention_merge):
-- the partial result of one block of keys, out_b [B, T, nh*hd] and its
-- lse_b {B, nh, T} (fp32), merged into the accumulator out, lse in place
-- by their log-sum-exps; a row whose lse is -inf saw no key
function M.attention_merge(out, lse, out_b, lse_b, B, T, nh, hd)
  local what = "attention_merge"
  local op, lp, obp, lbp = ptrs(what, out, lse, out_b, lse_b)
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_merge(op, lp, obp, lbp, B, T, nh, hd, out.dtype_id, S()), what)
  end
  check(C.fsdp_attention_merge(op, lp, obp, lbp, B, T, nh, hd), what)
end

-- which CUDA attention kernels a step of this shape runs, as a line for the
-- user: cuDNN's fused attention and its version, or ours and why not cuDNN
function M.attention_choice(dtype, B, T, nh, nkv, hd)
  local desc = ffi.new("char[512]")
  local id = dtype == "bf16" and C.FSDP_BF16 or C.FSDP_FP32
  check(CU().fsdp_cuda_attention_choice(id, B, T, nh, nkv, hd, 0, desc, 512), "attention choice")
  return ffi.string(desc)
end

-- the device bytes the attention kernels of a step of this shape take from
-- the allocator while they run: { forward = n, backward = n } (cuDNN's
-- workspaces; 0 for our own kernels). Builds cuDNN's plans if need be.
function M.attention_workspace(dtype, B, T, nh, nkv, hd)
  local id = dtype == "bf16" and C.FSDP_BF16 or C.FSDP_FP32
  local n, out = ffi.new("int64_t[1]"), {}
  for dir, backward in pairs({ forward = 0, backward = 1 }) do
    check(CU().fsdp_cuda_attention_workspace(id, B, T, nh, nkv, hd, backward, n), "attention workspace")
    out[dir] = tonumber(n[0])
  end
  return out
end

function M.swiglu_forward(y, g, u)
  local yp, gp, up = ptrs("swiglu", y, g, u)
  if on_cuda(y) then return check(CU().fsdp_cuda_swiglu_forward(yp, gp, up, y:numel(), y.dtype_id, S()), "swiglu") end
  check(C.fsdp_swiglu_forward(yp, gp, up, y:numel()), "swiglu")
end

function M.swiglu_backward(dg, du, dy, g, u)
  local dgp, dup, dyp, gp, up = ptrs("swiglu backward", dg, du, dy, g, u)
  if on_cuda(dy) then
    return check(CU().fsdp_cuda_swiglu_backward(dgp, dup, dyp, gp, up, dy:numel(), dy.dtype_id, S()), "swiglu backward")
  end
  check(C.fsdp_swiglu_backward(dgp, dup, dyp, gp, up, dy:numel()), "swiglu backward")
end

-- y = a + b (y may be a or b)
function M.add(y, a, b)
  local yp, ap, bp = ptrs("add", y, a, b)
  if on_cuda(y) then return check(CU().fsdp_cuda_add(yp, ap, bp, y:numel(), y.dtype_id, S()), "add") end
  check(C.fsdp_add(yp, ap, bp, y:numel()), "add")
end

-- A scalar the GPU has not finished computing: the loss of a micro-batch
-- stays on the device until the step reads every micro-batch's at once
-- (M.value), so the host never waits for the compute stream inside a step.
-- Scaling by a number (x / n, x * n) stays deferred.
local Deferred = {}
Deferred.__index = Deferred
local function deferred(buf, mul) return setmetatable({ buf = buf, mul = mul }, Deferred) end
-- (a sum of deferred losses: parts, plus base, times mul)
local function with_mul(a, mul) return setmetatable({ buf = a.buf, parts = a.parts, base = a.base, mul = mul }, Deferred) end
Deferred.__div = function(a, b)
  if type(b) ~= "number" then error("a deferred loss divides by numbers only", 2) end
  return with_mul(a, a.mul / b)
end
Deferred.__mul = function(a, b)
  if type(a) == "number" then a, b = b, a end
  if type(b) ~= "number" then error("a deferred loss multiplies by numbers only", 2) end
  return with_mul(a, a.mul * b)
end
M.deferred = deferred

-- The sum of losses, numbers or deferred (then deferred itself).
function M.sum(parts)
  local base, pending = 0, {}
  for _, p in ipairs(parts) do
    if type(p) == "number" then base = base + p else pending[#pending + 1] = p end
  end
  if #pending == 0 then return base end
  return setmetatable({ parts = pending, base = base, mul = 1 }, Deferred)
end

-- the number x stands for (waits for the compute stream the first time a
-- buffer is read; the others are ready by then)
function M.value(x)
  if type(x) == "number" then return x end
  if x.parts then
    local s = x.base
    for _, p in ipairs(x.parts) do s = s + M.value(p) end
    return s * x.mul
  end
  local buf = x.buf
  if not buf.host then
    if buf.device and buf.device.meta then -- (a dry run's: no value, and its bytes go now)
      buf.device:free()
      buf.host, buf.device = 0, nil
    elseif buf.device then
      M.compute_stream():synchronize()
      local host = ffi.new("double[1]")
      check(C.fsdp_memcpy(host, buf.device:ptr(), 8, nil), "deferred loss")
      buf.device:free()
      buf.host, buf.device = base.f64(host), nil
    else
      buf.host = buf.read() -- a CPU stand-in (tests)
    end
  end
  return buf.host * x.mul
end

-- Mean cross-entropy pieces: the loss summed over the rows whose target is
-- not ignore_index (CPU: a number; CUDA: deferred), and the gradient
-- written over the logits; targets is a CPU int32 tensor (counted and
-- checked by the caller), tdev its device copy or nil.
function M.cross_entropy(logits, targets, tdev, n, V, ignore_index, grad_scale)
  local lp, tp = ptrs("cross entropy", logits, on_cuda(logits) and tdev or targets)
  if on_cuda(logits) then
    -- from the caching allocator; read after the step: nobody's activation
    local sums = autograd.untracked(tensor.new, 2, "fp64", "cuda")
    local sp = sums:ptr()
    check(CU().fsdp_cuda_cross_entropy(sp, ffi.cast("int64_t *", sp) + 1, lp, lp, tp, n, V, ignore_index, grad_scale,
      logits.dtype_id, S()), "cross entropy")
    return deferred({ device = sums }, 1)
  end
  local sum, cnt = ffi.new("double[1]"), ffi.new("int64_t[1]")
  check(C.fsdp_cross_entropy(sum, cnt, lp, lp, tp, n, V, ignore_index, grad_scale), "cross entropy")
  return base.f64(sum)
end

-- Per-token log-probabilities of the targets (post-training, fsdp.engine):
-- logp and entropy (each may be nil) {n} fp32 tensors on the logits'
-- device; with coef (dL/dlogp per row, on the logits' device) the logits
-- are overwritten by the gradient coef (onehot - softmax) of a loss written
-- over them. targets: the CPU tensor; on CUDA tdev is its device copy.
function M.token_logprobs(logp, entropy, logits, targets, tdev, coef, n, V, ignore_index)
  local lpp, enp, xp, tp, cp = ptrs("token log-probs", logp, entropy, logits, on_cuda(logits) and tdev or targets, coef)
  if on_cuda(logits) then
    return check(CU().fsdp_cuda_token_logprobs(lpp, enp, cp and xp or nil, xp, tp, cp, n, V, ignore_index, logits.dtype_id,
      S()), "token log-probs")
  end
  check(C.fsdp_token_logprobs(lpp, enp, cp and xp or nil, xp, tp, cp, n, V, ignore_index), "token log-probs")
end

function M.tanh_forward(y, x)
  cpu_only(y, "Tanh")
  local yp, xp = ptrs("Tanh forward", y, x)
  check(C.fsdp_tanh_forward(yp, xp, x:numel()), "Tanh forward")
end
function M.tanh_backward(dx, dy, y)
  cpu_only(dx, "Tanh")
  local dxp, dyp, yp = ptrs("Tanh backward", dx, dy, y)
  check(C.fsdp_tanh_backward(dxp, dyp, yp, dy:numel()), "Tanh backward")
end

-- The counting device (fsdp.dry_run): while tensor.counting runs, the ops
-- do no work (their tensors are meta tensors); what an op holds besides
-- its tensors is counted as the real one holds it: the attention kernels'
-- workspaces (M.counting_workspace: {forward, backward} bytes) for the
-- moment they run,
-- a GPU's loss sums until the step reads them.
M.counting_workspace = nil
local function workspace(dir, t)
  local ws = M.counting_workspace
  if t.device == "cuda" and ws then tensor.count_transient(ws[dir]) end
end
local dry = {
  attention_forward = function(out) workspace("forward", out) end,
  attention_backward = function(dq) workspace("backward", dq) end,
  cross_entropy = function(logits)
    if not on_cuda(logits) then return 0 end
    return deferred({ device = autograd.untracked(tensor.new, 2, "fp64", "cuda") }, 1)
  end,
  rope_tables = function(seq, hd, _, _, device)
    return { cos = tensor.new({ seq, hd }, "fp32", device), sin = tensor.new({ seq, hd }, "fp32", device), seq = seq, device = device }
  end,
}
for _, name in ipairs({ "copy", "linear_forward", "linear_backward", "embedding_forward", "embedding_backward", "rmsnorm_forward",
  "rmsnorm_backward", "rope_tables", "rope", "attention_forward", "attention_backward", "attention_cached",
  "attention_forward_pos", "attention_backward_pos", "attention_forward_pos_docs", "attention_backward_pos_docs",
  "swiglu_forward",
  "swiglu_backward", "add", "cross_entropy", "token_logprobs", "tanh_forward", "tanh_backward" }) do
  local work, shape_only = M[name], dry[name]
  M[name] = function(...)
    if tensor.is_counting() then
      if shape_only then return shape_only(...) end
      return
    end
    return work(...)
  end
end

return M
