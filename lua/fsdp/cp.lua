-- fsdp.cp: context parallelism over a cp group of the mesh (docs/SHARDING.md,
-- "Parallelism"). A sequence of T tokens is cut into 2 x cp chunks of
-- c = T / (2 cp); rank r holds chunks r and 2cp-1-r (the causal load
-- balance: every rank then has as much attention work), runs every
-- per-token layer on them, and for attention all-gathers the keys and
-- values of the whole sequence (in global order) and attends from its
-- queries at their true positions; the backward's key and value gradients
-- go back to the chunks' owners as a reduce-scatter. The model is whole on
-- every cp rank (FSDP shards it over dp_shard x cp), so the loss of the
-- sequence is the mean over all cp ranks' tokens.
--
-- The group: fsdp.tp.group(comm) for the mesh's "cp" communicator, or
-- fsdp.tp.group(nil, size, rank) for a dry run (the collectives then only
-- allocate what they would).
--
-- Devices: the reorders are copies of chunks (ops.copy: on a GPU on the
-- compute stream) and the collectives are ordered as fsdp.tp's (tp.start,
-- tp.done: on a GPU by events, no host wait).
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
-- (train.cp_attention): "ring" (fsdp.cp_ring, the trainer's default) or
-- "all_gather" (this file)
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

-- The layout of rows of T the model keeps: {g, T, q_pos = positions}, and
-- on a GPU (device "cuda") q_pos_dev, their device copy (the attention
-- kernels read it), copied on the compute stream: its memory may come from
-- a block the stream still uses. way: M.attention_ways' ("all_gather" if
-- nil); a ring's layout also holds its steps' positions (l.ring).
function M.layout(g, T, device, way)
  way = way or "all_gather"
  if not M.attention_ways[way] then
    error(string.format("fsdp.cp.layout: attention way %s; expected 'all_gather' or 'ring'", tostring(way)), 2)
  end
  local l = { g = g, T = T, way = way, q_pos = M.positions(g, T) }
  if device == "cuda" then
    l.q_pos_dev = tensor.new(l.q_pos.shape, "int32", "cuda")
    if not counting() then l.q_pos_dev:copy_from(l.q_pos, ops.compute_stream()) end
  end
  if way == "ring" then l.ring = require("fsdp.cp_ring").positions(T, g.size, device) end
  return l
end
function M.layout_free(l)
  l.q_pos:free()
  if l.q_pos_dev then l.q_pos_dev:free() end
  if l.ring then require("fsdp.cp_ring").positions_free(l.ring) end
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

-- The whole sequence's rows {B, T = P Tl, w} in order (seq) and by rank
-- ({P, B, Tl, w}: each rank's two chunks of each row, ranked): to_seq
-- copies ranked into seq, else seq into ranked
local function reorder(seq, ranked, P, B, Tl, w, to_seq)
  local c, T = Tl / 2, Tl * P
  for r = 0, P - 1 do
    for b = 0, B - 1 do
      for h = 0, 1 do
        local at_seq, at_rank = (b * T + chunk(P, r, h) * c) * w, ((r * B + b) * Tl + h * c) * w
        if to_seq then ops.copy(seq, at_seq, ranked, at_rank, c * w) else ops.copy(ranked, at_rank, seq, at_seq, c * w) end
      end
    end
  end
end

-- {B, Tl, w} of every rank, all-gathered, in global order: {B, T, w}
function M.gather(g, x)
  local B, Tl, w = x.shape[1], x.shape[2], x.shape[3]
  local P = g.size
  local y, all = tensor.new({ B, Tl * P, w }, x.dtype, x.device), tensor.new({ P, B, Tl, w }, x.dtype, x.device)
  M.sent.all_gather = M.sent.all_gather + (P - 1) / P * all:numel() * all.esize
  if not counting() then
    tpm.start(g, x.device)
    g.comm:all_gather(all, x)
    tpm.done(g, x.device)
    reorder(y, all, P, B, Tl, w, true)
  end
  autograd.consume(all)
  return y
end

-- The gradient of the whole {B, T, w} (each rank's part of it) summed
-- over the group and given back to the chunks' owners: {B, Tl, w}
function M.scatter(g, dx)
  local B, T, w = dx.shape[1], dx.shape[2], dx.shape[3]
  local P = g.size
  local Tl = T / P
  local y, all = tensor.new({ B, Tl, w }, dx.dtype, dx.device), tensor.new({ P, B, Tl, w }, dx.dtype, dx.device)
  M.sent.reduce_scatter = M.sent.reduce_scatter + (P - 1) / P * all:numel() * all.esize
  if not counting() then
    reorder(dx, all, P, B, Tl, w, false)
    tpm.start(g, dx.device)
    g.comm:reduce_scatter(y, all, "sum")
    tpm.done(g, dx.device)
  end
  autograd.consume(all)
  return y
end

return M
