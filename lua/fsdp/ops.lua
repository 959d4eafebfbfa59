-- fsdp.ops: the model's operations on tensors, dispatched by device: the
-- CPU ops (src/ops/, fp32) or their CUDA twins (kernels/, fp32 or bf16 in
-- the tensors' dtype) on the process's compute stream. Weights and grads
-- are raw pointers bound by fully_shard; everything else is a tensor.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
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

function M.linear_forward(y, x, w, b, n, inp, out)
  if on_cuda(y) then return check(CU().fsdp_cuda_linear_forward(y.data, x.data, w, b, n, inp, out, y.dtype_id, S()), "Linear forward") end
  check(C.fsdp_linear_forward(y:ptr(), x:ptr(), w, b, n, inp, out), "Linear forward")
end

function M.linear_backward(dx, dw, db, dy, x, w, n, inp, out)
  if on_cuda(dy) then
    return check(CU().fsdp_cuda_linear_backward(dx and dx.data, dw, db, dy.data, x.data, w, n, inp, out, dy.dtype_id, S()), "Linear backward")
  end
  check(C.fsdp_linear_backward(dx and dx:ptr(), dw, db, dy:ptr(), x:ptr(), w, n, inp, out), "Linear backward")
end

function M.embedding_forward(y, ids, w, n, vocab, dim)
  if on_cuda(y) then return check(CU().fsdp_cuda_embedding_forward(y.data, ids:ptr(), w, n, vocab, dim, y.dtype_id, S()), "Embedding forward") end
  check(C.fsdp_embedding_forward(y:ptr(), ids:ptr(), w, n, vocab, dim), "Embedding forward")
end

function M.embedding_backward(dw, dy, ids, n, vocab, dim)
  if on_cuda(dy) then return check(CU().fsdp_cuda_embedding_backward(dw, dy.data, ids:ptr(), n, vocab, dim, dy.dtype_id, S()), "Embedding backward") end
  check(C.fsdp_embedding_backward(dw, dy:ptr(), ids:ptr(), n, vocab, dim), "Embedding backward")
end

function M.rmsnorm_forward(y, rstd, x, w, n, dim, eps)
  if on_cuda(y) then return check(CU().fsdp_cuda_rmsnorm_forward(y.data, rstd:ptr(), x.data, w, n, dim, eps, y.dtype_id, S()), "RMSNorm forward") end
  check(C.fsdp_rmsnorm_forward(y:ptr(), rstd:ptr(), x:ptr(), w, n, dim, eps), "RMSNorm forward")
end

function M.rmsnorm_backward(dx, dw, dy, x, w, rstd, n, dim)
  if on_cuda(dx) then
    return check(CU().fsdp_cuda_rmsnorm_backward(dx.data, dw, dy.data, x.data, w, rstd:ptr(), n, dim, dx.dtype_id, S()), "RMSNorm backward")
  end
  check(C.fsdp_rmsnorm_backward(dx:ptr(), dw, dy:ptr(), x:ptr(), w, rstd:ptr(), n, dim), "RMSNorm backward")
end

-- cos/sin tables [seq, head_dim] (fp32) on the device that will use them
function M.rope_tables(seq, hd, theta, scaling, device)
  local cos, sin = tensor.new({ seq, hd }), tensor.new({ seq, hd })
  local sc = nil
  if scaling then
    sc = ffi.new("fsdp_rope_scaling", { scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
      scaling.original_max_position_embeddings })
  end
  check(C.fsdp_rope_table(cos:ptr(), sin:ptr(), seq, hd, theta, sc), "rope table")
  if device == "cuda" then
    cos = tensor.new({ seq, hd }, "fp32", "cuda"):copy_from(cos)
    sin = tensor.new({ seq, hd }, "fp32", "cuda"):copy_from(sin)
  end
  return { cos = cos, sin = sin, seq = seq, device = device }
end

function M.rope(x, t, B, T, heads, hd, backward)
  if on_cuda(x) then
    local f = backward and CU().fsdp_cuda_rope_backward or CU().fsdp_cuda_rope_forward
    return check(f(x.data, t.cos:ptr(), t.sin:ptr(), B, T, heads, hd, x.dtype_id, S()), "rope")
  end
  local f = backward and C.fsdp_rope_backward or C.fsdp_rope_forward
  check(f(x:ptr(), t.cos:ptr(), t.sin:ptr(), B, T, heads, hd), "rope")
end

function M.attention_forward(out, lse, q, k, v, B, T, nh, nkv, hd)
  if on_cuda(out) then
    return check(CU().fsdp_cuda_attention_forward(out.data, lse:ptr(), q.data, k.data, v.data, B, T, nh, nkv, hd, out.dtype_id, S()), "attention")
  end
  check(C.fsdp_attention_forward(out:ptr(), lse:ptr(), q:ptr(), k:ptr(), v:ptr(), B, T, nh, nkv, hd), "attention")
end

function M.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, nh, nkv, hd)
  if on_cuda(dq) then
    return check(CU().fsdp_cuda_attention_backward(dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data,
      lse:ptr(), B, T, nh, nkv, hd, dq.dtype_id, S()), "attention backward")
  end
  check(C.fsdp_attention_backward(dq:ptr(), dk:ptr(), dv:ptr(), dout:ptr(), q:ptr(), k:ptr(), v:ptr(), out:ptr(), lse:ptr(),
    B, T, nh, nkv, hd), "attention backward")
end

-- which CUDA attention kernels a step of this shape runs, as a line for the
-- user: cuDNN's fused attention and its version, or ours and why not cuDNN
function M.attention_choice(dtype, B, T, nh, nkv, hd)
  local desc = ffi.new("char[512]")
  local id = dtype == "bf16" and C.FSDP_BF16 or C.FSDP_FP32
  check(CU().fsdp_cuda_attention_choice(id, B, T, nh, nkv, hd, 0, desc, 512), "attention choice")
  return ffi.string(desc)
end

function M.swiglu_forward(y, g, u)
  if on_cuda(y) then return check(CU().fsdp_cuda_swiglu_forward(y.data, g.data, u.data, y:numel(), y.dtype_id, S()), "swiglu") end
  check(C.fsdp_swiglu_forward(y:ptr(), g:ptr(), u:ptr(), y:numel()), "swiglu")
end

function M.swiglu_backward(dg, du, dy, g, u)
  if on_cuda(dy) then
    return check(CU().fsdp_cuda_swiglu_backward(dg.data, du.data, dy.data, g.data, u.data, dy:numel(), dy.dtype_id, S()), "swiglu backward")
  end
  check(C.fsdp_swiglu_backward(dg:ptr(), du:ptr(), dy:ptr(), g:ptr(), u:ptr(), dy:numel()), "swiglu backward")
end

-- y = a + b (y may be a or b)
function M.add(y, a, b)
  if on_cuda(y) then return check(CU().fsdp_cuda_add(y.data, a.data, b.data, y:numel(), y.dtype_id, S()), "add") end
  check(C.fsdp_add(y:ptr(), a:ptr(), b:ptr(), y:numel()), "add")
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
    if buf.device then
      M.compute_stream():synchronize()
      local host = ffi.new("double[1]")
      check(C.fsdp_memcpy(host, buf.device.data, 8, nil), "deferred loss")
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
  if on_cuda(logits) then
    local sums = tensor.new(2, "fp64", "cuda") -- from the caching allocator
    check(CU().fsdp_cuda_cross_entropy(ffi.cast("double *", sums.data), ffi.cast("int64_t *", sums.data) + 1, logits.data,
      logits.data, tdev:ptr(), n, V, ignore_index, grad_scale, logits.dtype_id, S()), "cross entropy")
    return deferred({ device = sums }, 1)
  end
  local sum, cnt = ffi.new("double[1]"), ffi.new("int64_t[1]")
  check(C.fsdp_cross_entropy(sum, cnt, logits:ptr(), logits:ptr(), targets:ptr(), n, V, ignore_index, grad_scale), "cross entropy")
  return base.f64(sum)
end

function M.tanh_forward(y, x) cpu_only(y, "Tanh") check(C.fsdp_tanh_forward(y:ptr(), x:ptr(), x:numel()), "Tanh forward") end
function M.tanh_backward(dx, dy, y) cpu_only(dx, "Tanh") check(C.fsdp_tanh_backward(dx:ptr(), dy:ptr(), y:ptr(), dy:numel()), "Tanh backward") end

return M
