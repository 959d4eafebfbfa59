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
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local autograd = require "fsdp.autograd"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}
local Group = {}
Group.__index = Group

function M.group(comm, size, rank)
  size, rank = size or (comm and comm:size()), rank or (comm and comm:rank())
  if type(size) ~= "number" or size < 1 or size % 1 ~= 0 or type(rank) ~= "number" or rank < 0 or rank >= size then
    error(string.format("fsdp.tp.group: size %s, rank %s; expected a comm or a size >= 1 and a rank below it",
      tostring(size), tostring(rank)), 2)
  end
  return setmetatable({ comm = comm, size = size, rank = rank }, Group)
end

-- the part [first, first + count) of n things (n divisible by the size:
-- the model's config checks say which field when it is not)
function Group:part(n)
  local c = n / self.size
  if c % 1 ~= 0 then error(string.format("fsdp.tp: %d does not split over %d tp ranks", n, self.size), 2) end
  return self.rank * c, c
end

local function counting() return tensor.is_counting() end

local function cpu(t, what)
  if t.device ~= "cpu" then
    error(what .. ": tensor parallelism runs on CPU ranks for now (its GPU collectives and vocab-slice kernels are not built)", 3)
  end
end

local function done(g) g.comm:synchronize() end

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
  cpu(x, "fsdp.tp gather")
  g.comm:all_gather(y, x)
  done(g)
  return y
end

-- x: partial sums of every row ({B, T, d}); returns this rank's rows, summed over the group
function M.scatter_rows(g, x)
  local d = x.shape[#x.shape]
  local y = tensor.new({ x:numel() / d / g.size, d }, x.dtype, x.device)
  sent(g, "reduce_scatter", x)
  if counting() then return y end
  cpu(x, "fsdp.tp scatter")
  g.comm:reduce_scatter(y, x, "sum")
  done(g)
  return y
end

-- fn(p) adds one call's gradient of a parameter every tp rank holds whole
-- into p (n floats); the calls of all tp ranks are summed into grad, the
-- same on every rank
function M.reduce_grad(g, grad, n, fn)
  local t = tensor.new(n)
  sent(g, "all_reduce", t, 2)
  if counting() then
    fn(nil)
  else
    t:fill(0)
    fn(t:ptr())
    g.comm:all_reduce(t, t, "sum")
    done(g)
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
function GatherRows:backward(_, dy) return M.scatter_rows(self.tp, dy) end

-- Leaving one: partial sums of all rows -> this rank's rows, summed
local ScatterRows = class("tp.ScatterRows")
function M.ScatterRows(g) return setmetatable({ params = {}, tp = g }, ScatterRows) end
function ScatterRows:forward(_, x) return M.scatter_rows(self.tp, x) end
function ScatterRows:backward(_, dy) return M.gather_rows(self.tp, dy) end

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
  cpu(x, "fsdp.tp gather columns")
  g.comm:all_gather(all, x)
  done(g)
  local src, dst, es = ffi.cast("uint8_t *", all:ptr()), ffi.cast("uint8_t *", y:ptr()), x.esize
  for r = 0, g.size - 1 do
    for i = 0, n - 1 do ffi.copy(dst + (i * cols * g.size + r * cols) * es, src + ((r * n + i) * cols) * es, cols * es) end
  end
  autograd.consume(all)
  return y
end
function GatherColumns:backward(_, dy)
  local g, s = self.tp, self.saved
  local dx = tensor.new({ s.n, s.cols }, dy.dtype, dy.device)
  if counting() then return dx end
  local src, dst, es = ffi.cast("uint8_t *", dy:ptr()), ffi.cast("uint8_t *", dx:ptr()), dy.esize
  for i = 0, s.n - 1 do ffi.copy(dst + i * s.cols * es, src + (i * s.cols * g.size + g.rank * s.cols) * es, s.cols * es) end
  return dx
end

---------------------------------------------------------------- vocab-parallel ops
function M.embedding_forward(y, ids, w, n, vocab, first, rows, dim)
  if counting() then return end
  cpu(y, "Embedding (vocab-parallel)")
  check(C.fsdp_embedding_forward_slice(y:ptr(), ids:ptr(), w, n, vocab, first, rows, dim), "Embedding forward")
end

function M.embedding_backward(dw, dy, ids, n, vocab, first, rows, dim)
  if counting() then return end
  cpu(dy, "Embedding (vocab-parallel)")
  check(C.fsdp_embedding_backward_slice(dw, dy:ptr(), ids:ptr(), n, vocab, first, rows, dim), "Embedding backward")
end

-- The cross-entropy of n rows of logits of which this rank holds columns
-- [first, first + cols): the sum of the rows' losses (the same on every
-- tp rank) and, with grad_scale, dlogits written over the logits. Two
-- collectives: an all-gather of each row's local max and target logit,
-- an all-reduce of the sums of exponentials.
function M.cross_entropy(g, logits, targets, n, V, first, ignore_index, grad_scale)
  local cols = logits:numel() / n
  local st, all, sums = tensor.new(2 * n), tensor.new({ g.size, 2 * n }), tensor.new(n)
  sent(g, "all_gather", all)
  sent(g, "all_reduce", sums, 2)
  if counting() then return 0 end
  cpu(logits, "cross entropy (vocab-parallel)")
  local sp, lp, tp = st:ptr(), logits:ptr(), targets:ptr()
  check(C.fsdp_cross_entropy_vocab_stats(sp, sp + n, lp, tp, n, V, first, cols, ignore_index), "cross entropy")
  g.comm:all_gather(all, st)
  done(g)
  local a = all:ptr()
  for i = 0, n - 1 do -- the max over the group, the target's logit from its owner (0 elsewhere)
    local m, t = a[i], a[n + i]
    for r = 1, g.size - 1 do
      m = math.max(m, a[r * 2 * n + i])
      t = t + a[r * 2 * n + n + i]
    end
    sp[i], sp[n + i] = m, t
  end
  check(C.fsdp_cross_entropy_vocab_sum(sums:ptr(), lp, sp, n, cols), "cross entropy")
  g.comm:all_reduce(sums, sums, "sum")
  done(g)
  local sum, cnt = ffi.new("double[1]"), ffi.new("int64_t[1]")
  check(C.fsdp_cross_entropy_vocab_finish(sum, cnt, grad_scale and lp or nil, lp, tp, sp, sums:ptr(), sp + n, n, V,
    first, cols, ignore_index, grad_scale or 0), "cross entropy")
  return base.f64(sum)
end

-- The spec fields of a parameter slice: rows [row0, row0 + rows) and
-- columns [col0, col0 + cols) of a full {R, gcols} weight (meta init and
-- checkpoints read it)
function M.slice(full_shape, row0, rows, col0, cols)
  return { full = full_shape, row0 = row0, rows = rows, col0 = col0, cols = cols }
end

M.Group = Group
return M
