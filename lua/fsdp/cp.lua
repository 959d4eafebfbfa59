-- fsdp.cp: context parallelism over a cp group of the mesh (docs/SHARDING.md,
-- "Parallelism"). A sequence of T tokens is cut into 2 x cp chunks of
-- c = T / (2 cp); rank r holds chunks r and 2cp-1-r (the causal load
-- balance: every rank then has as much attention work) and runs every
-- per-token layer on them. The model is whole on every cp rank (FSDP
-- shards it over dp_shard x cp), so the loss of the sequence is the mean
-- over all cp ranks' tokens.
--
-- Attention reaches the other ranks' keys and values, here, as an
-- all-gather (the default), or as a ring (fsdp.cp_ring,
-- train.cp_attention = "ring", which keeps less for the backward):
-- every rank's block of keys and values gathered (one block a rank, as
-- the ranks hold them) while the queries attend to the rank's own block,
-- then to each other block as it is seen from this rank's positions
-- (M.block_positions: the same three shapes as the ring's steps), the
-- partial results merged by their log-sum-exp. The backward attends to
-- each block again and reduce-scatters the blocks' key and value
-- gradients to their owners.
--
-- The group: fsdp.tp.group(comm) for the mesh's "cp" communicator, or
-- fsdp.tp.group(nil, size, rank) for a dry run (the collectives then only
-- allocate what they would).
--
-- Devices: copies on the compute stream (ops.copy) and the collectives
-- ordered as fsdp.tp's (tp.start, tp.done: on a GPU by events, no host
-- wait).
local tensor = require "fsdp.tensor"
local autograd = require "fsdp.autograd"
local ops = require "fsdp.ops"
local tpm = require "fsdp.tp"

local M = {}

M.group = tpm.group

-- Bytes this rank sends in the cp collectives (ring algorithms), counted
-- on the counting device as on a real one (the planner's figure).
M.sent = { all_gather = 0, reduce_scatter = 0, shift = 0 }

-- How attention reaches the other cp ranks' keys and values
-- (train.cp_attention): "all_gather" (below, the default) or "ring"
-- (fsdp.cp_ring)
M.attention_ways = { all_gather = true, ring = true }

local function counting() return tensor.is_counting() end

-- Why T does not split over size cp ranks (nil when it does)
function M.check(T, size)
  if T % (2 * size) ~= 0 then
    local ok = {}
    for c = 2, 64 do if T % (2 * c) == 0 then ok[#ok + 1] = c end end
    return string.format("data.seq = %d does not split into 2 x cp = %d equal chunks (cp sizes that do: %s)", T,
      2 * size, #ok > 0 and table.concat(ok, ", ", 1, math.min(#ok, 8)) or "none")
  end
end

-- The sequence's chunk that half h (0 or 1) of rank r's tokens is, of
-- P ranks' 2P chunks: the causal load balance
function M.chunk(P, r, h) return h == 0 and r or 2 * P - 1 - r end
local chunk = M.chunk

-- the local token i's chunk and its place in it (c tokens a chunk)
local function chunk_of(g, c, i)
  local h = i < c and 0 or 1
  return chunk(g.size, g.rank, h), i - h * c
end

-- The global positions of this rank's T / cp tokens: an int32 {Tl} CPU tensor
function M.positions(g, T)
  local c = T / (2 * g.size)
  local p = tensor.new({ 2 * c }, "int32")
  if counting() then return p end
  local pp = p:ptr()
  for i = 0, 2 * c - 1 do
    local k, j = chunk_of(g, c, i)
    pp[i] = k * c + j
  end
  return p
end

-- The query positions with which this rank's 2c tokens see a block of
-- 2c keys and values, one rank's (P ranks): {own, below, above}, each
-- {host = int32 {2c}, dev = its device copy or nil}, copied on the
-- compute stream (its memory may come from a block the stream still uses):
--   own: this rank's own block, causal over its two chunks in order (i);
--   below: a lower rank's: every query sees its first chunk (c - 1), none
--     its second (both of this rank's chunks lie between them);
--   above: a higher rank's: the first chunk's queries see none of it (-1),
--     the second chunk's all of it (2c - 1).
function M.block_positions(T, P, device)
  local c = T / (2 * P)
  local function make(fill)
    local p = { host = tensor.new({ 2 * c }, "int32") }
    if not counting() then
      local pp = p.host:ptr()
      for i = 0, 2 * c - 1 do pp[i] = fill(i) end
    end
    if device == "cuda" then
      p.dev = tensor.new(p.host.shape, "int32", "cuda")
      if not counting() then p.dev:copy_from(p.host, ops.compute_stream()) end
    end
    return p
  end
  return { own = make(function(i) return i end), below = make(function() return c - 1 end),
    above = make(function(i) return i < c and -1 or 2 * c - 1 end) }
end

-- the positions this rank sees rank src's block with (layout l)
function M.block_of(l, src)
  local r = l.g.rank
  return src == r and l.blocks.own or src < r and l.blocks.below or l.blocks.above
end

-- Packed rows (documents one after another in a row): the first key of
-- rank src's block that each of this rank's queries sees, its document's
-- first there, for every block: {[src] = {host = int32 {B, 2c}, dev}}.
-- A block's keys are its two chunks in order, so the keys before a global
-- position form a prefix: those of each chunk below the document's start.
-- doc_start: int32 {B, T} CPU, each position's document's first position.
function M.doc_bounds(g, T, doc_start, device)
  local P, B, c = g.size, doc_start.shape[1], T / (2 * g.size)
  local out = {}
  for src = 0, P - 1 do
    local lo = { host = tensor.new({ B, 2 * c }, "int32") }
    if device == "cuda" then lo.dev = tensor.new(lo.host.shape, "int32", "cuda") end
    out[src] = lo
  end
  if counting() then return out end
  local ds, a, hp = doc_start:ptr(), {}, {}
  for src = 0, P - 1 do a[src], hp[src] = { chunk(P, src, 0) * c, chunk(P, src, 1) * c }, out[src].host:ptr() end
  for b = 0, B - 1 do
    for i = 0, 2 * c - 1 do
      local k, j = chunk_of(g, c, i)
      local first = ds[b * T + k * c + j]
      for src = 0, P - 1 do
        local s0, s1 = a[src][1], a[src][2]
        hp[src][b * 2 * c + i] = math.min(math.max(first - s0, 0), c) + math.min(math.max(first - s1, 0), c)
      end
    end
  end
  for src = 0, P - 1 do
    local lo = out[src]
    if lo.dev then lo.dev:copy_from(lo.host, ops.compute_stream()) end
  end
  return out
end

-- Attention of the queries q {B, Tl, nh * hd} to rank src's block of keys
-- and values kb, vb {B, Tl, nkv * hd}: into (out, lse) for the first block
-- attended, else into (po, pl) and merged into them by log-sum-exp (the
-- all-gather's and the ring's step alike). Packed rows (l.lo, M.doc_bounds):
-- each query sees its document's keys alone.
function M.attend_block(l, src, first, out, lse, po, pl, q, kb, vb, B, Tl, nh, nkv, hd)
  local p, lo = M.block_of(l, src), l.lo and l.lo[src]
  local o, ls = first and out or po, first and lse or pl
  if lo then
    ops.attention_forward_pos_docs(o, ls, q, kb, vb, p.host, lo.host, B, Tl, Tl, nh, nkv, hd, p.dev, lo.dev)
  else
    ops.attention_forward_pos(o, ls, q, kb, vb, p.host, B, Tl, Tl, nh, nkv, hd, p.dev)
  end
  if not first then ops.attention_merge(out, lse, po, pl, B, Tl, nh, hd) end
end

-- Its backward, with the whole out and lse: the block's dkb, dvb written;
-- dq written for the first block, else dqs written and added to it
function M.attend_block_backward(l, src, first, dq, dqs, dkb, dvb, dout, q, kb, vb, out, lse, B, Tl, nh, nkv, hd)
  local p, lo = M.block_of(l, src), l.lo and l.lo[src]
  local d = first and dq or dqs
  if lo then
    ops.attention_backward_pos_docs(d, dkb, dvb, dout, q, kb, vb, out, lse, p.host, lo.host, B, Tl, Tl, nh, nkv, hd, p.dev,
      lo.dev)
  else
    ops.attention_backward_pos(d, dkb, dvb, dout, q, kb, vb, out, lse, p.host, B, Tl, Tl, nh, nkv, hd, p.dev)
  end
  if not first then ops.add(dq, dq, dqs) end
end

-- The layout of rows of T the model keeps: {g, T, way, blocks =
-- M.block_positions}. way: M.attention_ways' ("all_gather" if nil).
function M.layout(g, T, device, way)
  way = way or "all_gather"
  if not M.attention_ways[way] then
    error(string.format("fsdp.cp.layout: attention way %s; expected 'ring' or 'all_gather'", tostring(way)), 2)
  end
  return { g = g, T = T, way = way, blocks = M.block_positions(T, g.size, device) }
end
function M.layout_free(l)
  for _, p in pairs(l.blocks) do
    p.host:free()
    if p.dev then p.dev:free() end
  end
end

-- This rank's tokens of x ({B, T} or {B * T}, any dtype), as {B, T / cp}
-- (or {B * T / cp}); rows of B from x's shape or B
function M.split(g, x, B)
  local T = x:numel() / B
  local c = T / (2 * g.size)
  local y = tensor.new(#x.shape == 1 and { B * 2 * c } or { B, 2 * c }, x.dtype, x.device)
  if counting() then return y end
  for b = 0, B - 1 do
    for h = 0, 1 do
      ops.copy(y, b * 2 * c + h * c, x, b * T + chunk(g.size, g.rank, h) * c, c)
    end
  end
  return y
end

-- The inverse of M.split: every cp rank's tokens x ({B * T / cp}, any
-- dtype) all-gathered and put in the sequence's order, {B * T} (the
-- post-training engine's per-token log-probs: the same on every cp rank)
function M.join(g, x, B)
  local P, c = g.size, x:numel() / (2 * B)
  local all, y = tensor.new({ P, x:numel() }, x.dtype, x.device), tensor.new({ B * 2 * c * P }, x.dtype, x.device)
  M.sent.all_gather = M.sent.all_gather + (P - 1) / P * all:numel() * all.esize
  if not counting() then
    tpm.start(g, x.device)
    g.comm:all_gather(all, x)
    tpm.done(g, x.device)
    for r = 0, P - 1 do
      for b = 0, B - 1 do
        for h = 0, 1 do
          ops.copy(y, b * 2 * c * P + chunk(P, r, h) * c, all, r * x:numel() + b * 2 * c + h * c, c)
        end
      end
    end
  end
  autograd.consume(all)
  return y
end

-- out {B, Tl, nh * hd}, lse {B, nh, Tl} of queries q {B, Tl, nh * hd}
-- against the whole sequence's keys and values, of which this rank holds
-- k, v {B, Tl, nkv * hd}; also every rank's k and v all-gathered, {P, B,
-- Tl, nkv * hd} (the backward's)
function M.attention_forward(l, q, k, v, B, Tl, nh, nkv, hd)
  local g, dev = l.g, q.device
  local P, w = g.size, nkv * hd
  local ka, va = tensor.new({ P, B, Tl, w }, k.dtype, dev), tensor.new({ P, B, Tl, w }, v.dtype, dev)
  M.sent.all_gather = M.sent.all_gather + 2 * (P - 1) / P * ka:numel() * ka.esize
  local out, lse = ops.like(q, { B, Tl, nh * hd }), tensor.new({ B, nh, Tl }, "fp32", dev)
  local po, pl = ops.like(out), tensor.new(lse.shape, "fp32", dev)
  if not counting() then
    tpm.start(g, dev)
    g.comm:all_gather(ka, k)
    g.comm:all_gather(va, v)
    M.attend_block(l, g.rank, true, out, lse, po, pl, q, k, v, B, Tl, nh, nkv, hd) -- (while the others' blocks come)
    tpm.done(g, dev)
    for src = 0, P - 1 do
      if src ~= g.rank then
        local at = src * B * Tl * w
        M.attend_block(l, src, false, out, lse, po, pl, q, ka:view(at, { B, Tl, w }), va:view(at, { B, Tl, w }), B, Tl,
          nh, nkv, hd)
      end
    end
  end
  autograd.consume(po)
  autograd.consume(pl)
  return out, lse, ka, va
end

-- dq {B, Tl, nh * hd} and this rank's dk, dv {B, Tl, nkv * hd} from dout,
-- the all-gathered ka, va and what forward gave
function M.attention_backward(l, dout, q, ka, va, out, lse, B, Tl, nh, nkv, hd)
  local g, dev = l.g, q.device
  local P, w = g.size, nkv * hd
  local dq, dqs = ops.like(q), ops.like(q)
  local dka, dva = ops.like(ka), ops.like(va)
  if not counting() then
    for src = 0, P - 1 do
      local at = src * B * Tl * w
      M.attend_block_backward(l, src, src == 0, dq, dqs, dka:view(at, { B, Tl, w }), dva:view(at, { B, Tl, w }), dout, q,
        ka:view(at, { B, Tl, w }), va:view(at, { B, Tl, w }), out, lse, B, Tl, nh, nkv, hd)
    end
  end
  autograd.consume(dqs)
  local dk, dv = tensor.new({ B, Tl, w }, dka.dtype, dev), tensor.new({ B, Tl, w }, dva.dtype, dev)
  M.sent.reduce_scatter = M.sent.reduce_scatter + 2 * (P - 1) / P * dka:numel() * dka.esize
  if not counting() then
    tpm.start(g, dev)
    g.comm:reduce_scatter(dk, dka, "sum")
    g.comm:reduce_scatter(dv, dva, "sum")
    tpm.done(g, dev)
  end
  autograd.consume(dka)
  autograd.consume(dva)
  return dq, dk, dv
end

return M
