-- fsdp.tp: tensor parallelism, Megatron-style with sequence parallelism,
-- over a tp group of the mesh (docs/SHARDING.md, "Parallelism").
--
-- A column-parallel Linear holds rows [r*out/tp, (r+1)*out/tp) of its
-- weight (its output features), a row-parallel one columns (its input
-- features); a vocab-parallel embedding or head rows of the vocabulary.
-- Between the tensor-parallel blocks the activations are sequence
-- parallel: rank r holds rows [r*n/tp, (r+1)*n/tp) of the n = B*T rows,
-- so norms and residuals run on 1/tp of the rows. Entering a block,
-- GatherRows all-gathers the rows (its backward reduce-scatters the
-- gradient); leaving it, ScatterRows reduce-scatters the partial sums of
-- the row-parallel layer (its backward all-gathers).
--
-- Parameters every tp rank holds whole (norm weights; kv projections
-- when there are fewer kv heads than tp ranks) get each call's gradient
-- summed over the group (reduce_grad), so that all tp ranks hold the same
-- full gradient; the grad norm counts them once (fsdp.shard).
--
-- The group: tp.group(comm) for a mesh's "tp" communicator, or
-- tp.group(nil, size, rank) for a dry run (the planner's: no comm; the
-- collectives then only allocate what they would).
--
-- Devices: on CPU ranks the ops run on the calling thread and each
-- collective is waited for (comm:synchronize) before its result is read.
-- On a GPU everything runs in the compute stream's order with no host
-- wait (M.start, M.done): the comm's stream waits for the compute stream
-- before a collective, the compute stream for the comm's after it; the
-- vocab-parallel ops run their CUDA twins on the compute stream, and the
-- cross-entropy's loss stays on the device (ops.deferred), as ops.cross_entropy's.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local autograd = require "fsdp.autograd"
local ops = require "fsdp.ops"
local streams = require "fsdp.stream"
local ffi, C, check, CU = base.ffi, base.C, base.check, base.cuda

local M = {}
local Group = {}
Group.__index = Group

function M.group(comm, size, rank)
  size, rank = size or (comm and comm:size()), rank or (comm and comm:rank())
  if type(size) ~= "number" or size < 1 or size % 1 ~= 0 or type(rank) ~= "number" or rank < 0 or rank >= size then
    error(string.format("fsdp.tp.group: size %s, rank %s; expected a comm or a size >= 1 and a rank below it",
      tostring(size), tostring(rank)), 2)
  end
  return setmetatable({ comm = comm, size = size, rank = rank, overlap = true }, Group)
end

-- the part [first, first + count) of n things (n divisible by the size:
-- the model's config checks say which field when it is not)
function Group:part(n)
  local c = n / self.size
  if c % 1 ~= 0 then error(string.format("fsdp.tp: %d does not split over %d tp ranks", n, self.size), 2) end
  return self.rank * c, c
end

local function counting() return tensor.is_counting() end

-- A collective of group g on tensors of `device`, between M.start(g,
-- device) and M.done(g, device) (fsdp.cp's too). CPU ranks: the inputs
-- are ready when the host issues it; done waits for the comm's worker.
-- GPU: the comm's stream waits for the compute stream's work so far (the
-- collective's inputs), and done makes the compute stream wait for the
-- collective (its outputs), both with events: the host never waits. Done
-- also lets the comm drop its hold on the buffers (comm:release_held;
-- mesh.lua keeps them until a synchronize that never comes here): every
-- later use of their memory, which the caching allocator hands to the
-- compute stream, is ordered after the collective on it.
local function events(g)
  local e = g.events
  if not e then
    e = { inputs = streams.event("cuda"), outputs = streams.event("cuda"), stream = g.comm:stream() }
    g.events = e
  end
  return e
end

function M.start(g, device)
  if device ~= "cuda" then return end
  local e = events(g)
  e.inputs:record(ops.compute_stream())
  e.stream:wait(e.inputs)
end

function M.done(g, device)
  if device ~= "cuda" then return g.comm:synchronize() end
  local e = events(g)
  e.outputs:record(e.stream)
  ops.compute_stream():wait(e.outputs)
  g.comm:release_held()
end
local start, done = M.start, M.done

-- Bytes this rank sends in the tp collectives (ring algorithms: (P-1)/P of
-- the whole buffer for an all-gather or a reduce-scatter, twice that for an
-- all-reduce), counted on the counting device as on a real one: the
-- planner's per-step figure (fsdp.dry_run) and a run's measured one.
M.sent = { all_gather = 0, reduce_scatter = 0, all_reduce = 0 }
local function sent(g, kind, t, factor)
  M.sent[kind] = M.sent[kind] + (factor or 1) * (g.size - 1) / g.size * t:numel() * t.esize
end

-- x: this rank's rows; returns every rank's, shaped {B, T, d} (g.rows:
-- {B, T}, set by the model's forward)
function M.gather_rows(g, x)
  local d = x.shape[#x.shape]
  local y = tensor.new({ g.rows[1], g.rows[2], d }, x.dtype, x.device)
  if y:numel() ~= x:numel() * g.size then
    error(string.format("fsdp.tp: %d rows of %d gathered from %d ranks do not make {%d, %d}", x:numel() / d, d, g.size,
      g.rows[1], g.rows[2]), 2)
  end
  sent(g, "all_gather", y)
  if counting() then return y end
  start(g, x.device)
  g.comm:all_gather(y, x)
  done(g, x.device)
  return y
end

-- x: partial sums of every row ({B, T, d}); returns this rank's rows,
-- summed over the group. meanwhile (optional): a function run between the
-- reduce-scatter's start and its wait (work that does not read y: the
-- weight gradients of nn.linears_backward)
function M.scatter_rows(g, x, meanwhile)
  local d = x.shape[#x.shape]
  local y = tensor.new({ x:numel() / d / g.size, d }, x.dtype, x.device)
  sent(g, "reduce_scatter", x)
  if counting() then
    if meanwhile then meanwhile() end
    return y
  end
  start(g, x.device)
  g.comm:reduce_scatter(y, x, "sum")
  if meanwhile then meanwhile() end
  done(g, x.device)
  return y
end

-- x: partial sums of every row, summed over the group in place
-- (generation: every tp rank holds all rows, so a row-parallel layer's
-- output is all-reduced rather than reduce-scattered into sequence shards)
function M.sum_rows(g, x)
  sent(g, "all_reduce", x, 2)
  if counting() then return x end
  start(g, x.device)
  g.comm:all_reduce(x, x, "sum")
  done(g, x.device)
  return x
end

-- fn(p) adds one call's gradient of a parameter every tp rank holds whole
-- into p (n elements of the grad's dtype: fp32 on CPU ranks, dy's on a
-- GPU, the units' compute dtype); the calls of all tp ranks are summed into
-- grad, the same on every rank. dy: the call's output gradient (its device).
function M.reduce_grad(g, grad, n, fn, dy)
  local gpu = dy.device == "cuda"
  local t = tensor.new(n, gpu and dy.dtype or "fp32", dy.device)
  sent(g, "all_reduce", t, 2)
  if counting() then
    fn(nil)
  elseif gpu then
    local s = ops.compute_stream()
    check(C.fsdp_memset(t:ptr(), 0, t:nbytes(), s:live("fsdp.tp gradient")), "fsdp.tp gradient")
    fn(t:ptr())
    start(g, "cuda")
    g.comm:all_reduce(t, t, "sum")
    done(g, "cuda")
    check(CU().fsdp_cuda_scale_add(grad, 1, t:ptr(), n, t.dtype_id, s:live("fsdp.tp gradient")), "fsdp.tp gradient")
  else
    t:fill(0)
    fn(t:ptr())
    g.comm:all_reduce(t, t, "sum")
    done(g, "cpu")
    check(C.fsdp_scale_add(grad, 1, t:ptr(), n), "fsdp.tp gradient")
  end
  autograd.consume(t)
end

---------------------------------------------------------------- modules
-- (fsdp.nn's module classes; nn requires this file, so not from there)
local function class(kind) local c = { kind = kind }; c.__index = c; return c end

-- Entering a tensor-parallel block: this rank's rows -> all rows
local GatherRows = class("tp.GatherRows")
function M.GatherRows(g) return setmetatable({ params = {}, tp = g }, GatherRows) end
function GatherRows:forward(_, x) return M.gather_rows(self.tp, x) end
function GatherRows:backward(_, dy)
  local fn = self.meanwhile -- (set by nn.linears_backward, used once)
  self.meanwhile = nil
  return M.scatter_rows(self.tp, dy, fn)
end

-- Leaving one: partial sums of all rows -> this rank's rows, summed
local ScatterRows = class("tp.ScatterRows")
function M.ScatterRows(g) return setmetatable({ params = {}, tp = g }, ScatterRows) end
function ScatterRows:forward(_, x) return M.scatter_rows(self.tp, x) end
function ScatterRows:backward(_, dy) return M.gather_rows(self.tp, dy) end

-- The embedding's partial sums of all rows -> summed, all rows on every
-- rank (generation's trunk; forward only)
local SumRows = class("tp.SumRows")
function M.SumRows(g) return setmetatable({ params = {}, tp = g }, SumRows) end
function SumRows:forward(_, x) return M.sum_rows(self.tp, x) end
function SumRows:backward() error("fsdp.tp: SumRows is generation's (forward only)", 2) end

-- Logits split over the vocabulary -> whole rows {n, V} (a forward that
-- returns logits); the backward takes this rank's columns back
local GatherColumns = class("tp.GatherColumns")
function M.GatherColumns(g) return setmetatable({ params = {}, tp = g }, GatherColumns) end
function GatherColumns:forward(_, x)
  local g, cols = self.tp, x.shape[#x.shape]
  local n = x:numel() / cols
  local y, all = tensor.new({ n, cols * g.size }, x.dtype, x.device), tensor.new({ g.size, n, cols }, x.dtype, x.device)
  self.saved = { n = n, cols = cols }
  sent(g, "all_gather", all)
  if counting() then
    autograd.consume(all)
    return y
  end
  start(g, x.device)
  g.comm:all_gather(all, x)
  done(g, x.device)
  for r = 0, g.size - 1 do
    for i = 0, n - 1 do ops.copy(y, (i * g.size + r) * cols, all, (r * n + i) * cols, cols) end
  end
  autograd.consume(all)
  return y
end
function GatherColumns:backward(_, dy)
  local g, s = self.tp, self.saved
  local dx = tensor.new({ s.n, s.cols }, dy.dtype, dy.device)
  if counting() then return dx end
  for i = 0, s.n - 1 do ops.copy(dx, i * s.cols, dy, (i * g.size + g.rank) * s.cols, s.cols) end
  return dx
end

---------------------------------------------------------------- vocab-parallel ops
-- (the CUDA twins on the compute stream, as fsdp.ops runs its ops)
local function stream(what) return ops.compute_stream():live(what) end

-- (CPU ranks) the group's max of each row and its target's logit from its
-- owner (0 elsewhere) into sp (n maxima, then n target logits), from the
-- gathered stats {ranks, 2n}: the CPU twin of the combine kernel
local function combine(g, all, sp, n)
  local a = all:ptr()
  for i = 0, n - 1 do
    local m, t = a[i], a[n + i]
    for r = 1, g.size - 1 do
      m = math.max(m, a[r * 2 * n + i])
      t = t + a[r * 2 * n + n + i]
    end
    sp[i], sp[n + i] = m, t
  end
end

-- The passes the vocab-parallel ops share, around their two collectives:
-- each row's max over the group and its target's logit from its owner
-- (into st: n maxima, then n target logits; all: the gathered {ranks, 2n}),
-- then this rank's sums (sums_fn(sp), the op's own) summed over the group.
-- tptr: the targets on the logits' device. Returns st's pointer.
local function row_stats(g, what, logits, tptr, st, all, sums, n, V, first, ignore_index, sums_fn)
  local dev, cols, sp = logits.device, logits:numel() / n, st:ptr()
  if dev == "cuda" then
    local X, s = CU(), stream(what)
    check(X.fsdp_cuda_cross_entropy_vocab_stats(sp, sp + n, logits:ptr(), tptr, n, V, first, cols, ignore_index,
      logits.dtype_id, s), what)
    start(g, dev)
    g.comm:all_gather(all, st)
    done(g, dev)
    check(X.fsdp_cuda_cross_entropy_vocab_combine(sp, sp + n, all:ptr(), n, g.size, s), what)
  else
    check(C.fsdp_cross_entropy_vocab_stats(sp, sp + n, logits:ptr(), tptr, n, V, first, cols, ignore_index), what)
    g.comm:all_gather(all, st)
    done(g, dev)
    combine(g, all, sp, n)
  end
  sums_fn(sp)
  start(g, dev)
  g.comm:all_reduce(sums, sums, "sum")
  done(g, dev)
  return sp
end

-- The cross-entropy of n rows of logits of which this rank holds columns
-- [first, first + cols): the sum of the rows' losses (the same on every
-- tp rank) and, with grad_scale, dlogits written over the logits. Two
-- collectives: an all-gather of each row's local max and target logit,
-- an all-reduce of the sums of exponentials. targets: the CPU int32
-- tensor; on a GPU tdev is its device copy, and the sum is an
-- ops.deferred (the gathered stats combined by a kernel: no host read).
function M.cross_entropy(g, logits, targets, tdev, n, V, first, ignore_index, grad_scale)
  local cols, dev = logits:numel() / n, logits.device
  local st, all, sums = tensor.new(2 * n, "fp32", dev), tensor.new({ g.size, 2 * n }, "fp32", dev), tensor.new(n, "fp32", dev)
  sent(g, "all_gather", all)
  sent(g, "all_reduce", sums, 2)
  if dev == "cuda" then return M.cross_entropy_cuda(g, logits, tdev, n, V, first, cols, ignore_index, grad_scale, st, all, sums) end
  if counting() then return 0 end
  local what, lp, tp, smp = "cross entropy", logits:ptr(), targets:ptr(), sums:ptr()
  local sp = row_stats(g, what, logits, tp, st, all, sums, n, V, first, ignore_index, function(sp)
    check(C.fsdp_cross_entropy_vocab_sum(smp, lp, sp, n, cols), what)
  end)
  local sum, cnt = ffi.new("double[1]"), ffi.new("int64_t[1]")
  check(C.fsdp_cross_entropy_vocab_finish(sum, cnt, grad_scale and lp or nil, lp, tp, sp, smp, sp + n, n, V,
    first, cols, ignore_index, grad_scale or 0), what)
  return base.f64(sum)
end

-- (M.cross_entropy on a GPU: the same passes, collectives and combine in
-- the compute stream's order; the loss sum and count in a device buffer
-- the step reads once, with the other micro-batches' losses)
function M.cross_entropy_cuda(g, logits, tdev, n, V, first, cols, ignore_index, grad_scale, st, all, sums)
  local what = "cross entropy (vocab-parallel)"
  -- from the caching allocator; read after the step: nobody's activation
  local loss = autograd.untracked(tensor.new, 2, "fp64", "cuda")
  if counting() then return ops.deferred({ device = loss }, 1) end
  if tdev == nil then error(what .. ": on a GPU the targets' device copy is needed", 3) end
  local lp, tp, smp, lsp = ops.ptrs(what, logits, tdev, sums, loss)
  local dt, X = logits.dtype_id, CU()
  local sp = row_stats(g, what, logits, tp, st, all, sums, n, V, first, ignore_index, function(sp)
    check(X.fsdp_cuda_cross_entropy_vocab_sum(smp, lp, sp, n, cols, dt, stream(what)), what)
  end)
  check(X.fsdp_cuda_cross_entropy_vocab_finish(lsp, ffi.cast("int64_t *", lsp) + 1, grad_scale and lp or nil, lp, tp, sp,
    smp, sp + n, n, V, first, cols, ignore_index, grad_scale or 0, dt, stream(what)), what)
  return ops.deferred({ device = loss }, 1)
end

-- Each of n rows' log-probability of its target (and with en its entropy)
-- from logits of which this rank holds columns [first, first + cols), and
-- with coef (dL/dlogp per row) the gradient coef (onehot - softmax) written
-- over the logits (fsdp_token_logprobs_vocab_*): the post-training
-- engine's log-probs and losses over them (fsdp.engine) at tp > 1. The
-- passes of M.cross_entropy: an all-gather of each row's local max and
-- target logit, an all-reduce of its sums of exponentials (and, for the
-- entropy, of exp(x - max) x). lp, en: fp32 {n} on the logits' device, or
-- nil; every tp rank gets the same values. targets: the CPU int32 tensor;
-- on a GPU tdev is its device copy.
function M.token_logprobs(g, logits, targets, tdev, coef, lp, en, n, V, first, ignore_index)
  local cols, dev = logits:numel() / n, logits.device
  local what = "token log-probs (vocab-parallel)"
  local st, all = tensor.new(2 * n, "fp32", dev), tensor.new({ g.size, 2 * n }, "fp32", dev)
  local sums = tensor.new(en and 2 * n or n, "fp32", dev) -- (n sums, then n sums of exp(x - max) x)
  sent(g, "all_gather", all)
  sent(g, "all_reduce", sums, 2)
  if counting() then return end
  local gpu = dev == "cuda"
  if gpu and tdev == nil then error(what .. ": on a GPU the targets' device copy is needed", 2) end
  local lgp, tp, smp = logits:ptr(), (gpu and tdev or targets):ptr(), sums:ptr()
  local xs = en and smp + n or nil
  local lpp, enp, cfp = ops.ptrs(what, lp, en, coef)
  local dl = coef and lgp or nil
  if gpu then
    local X, dt = CU(), logits.dtype_id
    local sp = row_stats(g, what, logits, tp, st, all, sums, n, V, first, ignore_index, function(sp)
      check(X.fsdp_cuda_token_logprobs_vocab_sums(smp, xs, lgp, sp, n, cols, dt, stream(what)), what)
    end)
    check(X.fsdp_cuda_token_logprobs_vocab_finish(lpp, enp, dl, lgp, tp, cfp, sp, smp, xs, sp + n, n, V, first, cols,
      ignore_index, dt, stream(what)), what)
  else
    local sp = row_stats(g, what, logits, tp, st, all, sums, n, V, first, ignore_index, function(sp)
      check(C.fsdp_token_logprobs_vocab_sums(smp, xs, lgp, sp, n, cols), what)
    end)
    check(C.fsdp_token_logprobs_vocab_finish(lpp, enp, dl, lgp, tp, cfp, sp, smp, xs, sp + n, n, V, first, cols,
      ignore_index), what)
  end
end

-- The spec fields of a parameter slice: rows [row0, row0 + rows) and
-- columns [col0, col0 + cols) of a full {R, gcols} weight (meta init and
-- checkpoints read it)
function M.slice(full_shape, row0, rows, col0, cols)
  return { full = full_shape, row0 = row0, rows = rows, col0 = col0, cols = cols }
end

M.Group = Group
return M
