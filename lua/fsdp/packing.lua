-- fsdp.packing: documents into rows of T tokens, best fit.
--
-- packing.pack{starts = S, lengths = L, n = docs, seq = T, seed = s, split_long = true, max_piece = P, what = "data"}
--   S, L: int64 / int32 arrays (0-based) of each document's first token and
--   length in its token source. Returns a packing: rows of at most T tokens,
--   each a list of pieces (a whole document, or a part of a long one).
--   The documents are taken in an order shuffled by seed (so that one
--   source's documents do not all share rows) and each goes to the open row
--   with the least room that still fits it (best fit: rows end up full;
--   the waste is in packing:stats()). A document longer than T is cut into
--   pieces of T tokens that overlap by one (piece k starts at k (T - 1)), so
--   that every next-token target of it is in exactly one piece; with
--   split_long = false it is refused instead, naming it. Documents of fewer
--   than 2 tokens have no target and are left out.
--   The packing is a pure function of (documents, T, seed): every rank
--   computes the same, and a resumed run finds the same rows.
--
-- p.rows: the number of rows; p.max_piece: the longest a piece may be;
-- p:row(r) -> first, last: the pieces of row r
-- (0-based) are first .. last - 1, piece i at p.start[i] (token offset in
-- the source), p.len[i] tokens.
local ffi = require "ffi"
local bit = require "bit"

local M = {}
local Packing = {}
Packing.__index = Packing

-- a deterministic permutation of 0..n-1 for (seed, salt): Fisher-Yates
-- driven by a 32-bit xorshift (fsdp.data's window order uses the same)
function M.permutation(n, seed, salt)
  local s = bit.bxor(seed * 2654435761 % 4294967296, (salt + 1) * 40503) % 4294967296
  if s == 0 then s = 1 end
  local function rnd()
    s = bit.bxor(s, bit.lshift(s, 13)); s = bit.bxor(s, bit.rshift(s, 17)); s = bit.bxor(s, bit.lshift(s, 5))
    return (s % 4294967296 + 4294967296) % 4294967296
  end
  local p = ffi.new("int32_t[?]", math.max(n, 1))
  for i = 0, n - 1 do p[i] = i end
  for i = n - 1, 1, -1 do
    local j = rnd() % (i + 1)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

-- Rows by free room: bucket[f] is a stack of the open rows with f tokens
-- free; a tree over the buckets answers "the smallest f >= need with a
-- row" in log T steps.
local function buckets(T)
  local size = 1
  while size < T + 1 do size = size * 2 end
  local tree = ffi.new("int32_t[?]", 2 * size) -- rows in the buckets under each node
  local heads = ffi.new("int32_t[?]", T + 1)   -- top row of each bucket's stack, -1: empty
  for i = 0, T do heads[i] = -1 end
  local b = { size = size, tree = tree, heads = heads }
  function b.add(f, delta)
    local i = size + f
    while i >= 1 do
      tree[i] = tree[i] + delta
      i = math.floor(i / 2)
    end
  end
  -- the smallest bucket >= need holding a row, or nil
  function b.find(need)
    if need > T then return nil end
    -- walk up from the leaf, then down the first subtree to the right with rows
    local i = size + need
    if tree[i] > 0 then return need end
    while i > 1 do
      if i % 2 == 0 and tree[i + 1] > 0 then
        i = i + 1
        while i < size do i = tree[2 * i] > 0 and 2 * i or 2 * i + 1 end
        return i - size
      end
      i = math.floor(i / 2)
    end
    return nil
  end
  return b
end

function M.pack(o)
  local T, n, what = o.seq, o.n, o.what or "data"
  if not (type(T) == "number" and T >= 2 and T % 1 == 0) then error(what .. ": seq = " .. tostring(T) .. "; expected an integer >= 2", 2) end
  -- the longest piece: a row's length, or less (a model's positions)
  local P = math.min(T, o.max_piece or T)
  if P < 2 then error(what .. ": max_piece = " .. tostring(o.max_piece) .. "; expected >= 2", 2) end
  local order = M.permutation(n, o.seed or 0, 0x9ac4)
  -- the pieces, in order; a piece's row is decided as it comes
  local cap = n + 16
  local pstart, plen, prow = ffi.new("int64_t[?]", cap), ffi.new("int32_t[?]", cap), ffi.new("int32_t[?]", cap)
  local np = 0
  local function push(start, len, row)
    if np == cap then
      local c2 = cap * 2
      local s2, l2, r2 = ffi.new("int64_t[?]", c2), ffi.new("int32_t[?]", c2), ffi.new("int32_t[?]", c2)
      ffi.copy(s2, pstart, cap * 8); ffi.copy(l2, plen, cap * 4); ffi.copy(r2, prow, cap * 4)
      pstart, plen, prow, cap = s2, l2, r2, c2
    end
    pstart[np], plen[np], prow[np] = start, len, row
    np = np + 1
  end
  local b = buckets(T)
  local nrows, rowcap = 0, 1024
  local free = ffi.new("int32_t[?]", rowcap) -- free room of each row
  local below = ffi.new("int32_t[?]", rowcap) -- the next row down in its bucket's stack
  local function place(start, len)
    local f = b.find(len)
    local r
    if f then
      r = b.heads[f]
      b.heads[f] = below[r]
      b.add(f, -1)
    else
      if nrows == rowcap then
        local f2, b2 = ffi.new("int32_t[?]", rowcap * 2), ffi.new("int32_t[?]", rowcap * 2)
        ffi.copy(f2, free, rowcap * 4); ffi.copy(b2, below, rowcap * 4)
        free, below, rowcap = f2, b2, rowcap * 2
      end
      r, nrows = nrows, nrows + 1
      free[r] = T
    end
    free[r] = free[r] - len
    push(start, len, r)
    if free[r] >= 2 then -- (a room of 0 or 1 takes no piece with a target)
      below[r] = b.heads[free[r]]
      b.heads[free[r]] = r
      b.add(free[r], 1)
    end
  end
  local dropped, split, tokens = 0, 0, 0
  for k = 0, n - 1 do
    local d = order[k]
    local start, len = tonumber(o.starts[d]), tonumber(o.lengths[d])
    if len < 2 then
      dropped = dropped + 1
    elseif len <= P then
      place(start, len)
      tokens = tokens + len
    else
      if o.split_long == false then
        error(string.format("%s: document %d has %d tokens, more than %s = %d (data.split_long = false refuses " ..
          "it; true cuts it into pieces of that many tokens)", what, d, len,
          P < T and "the model's max_position_embeddings" or "data.seq", P), 0)
      end
      split = split + 1
      local s = 0
      while true do -- pieces of P, overlapping by one token
        local l = math.min(P, len - s)
        place(start + s, l)
        tokens = tokens + l
        if s + l >= len then break end
        s = s + P - 1
      end
    end
  end
  -- pieces grouped by row (a counting sort: a row's pieces keep their order)
  local first = ffi.new("int32_t[?]", nrows + 1)
  for i = 0, np - 1 do first[prow[i] + 1] = first[prow[i] + 1] + 1 end
  for r = 1, nrows do first[r] = first[r] + first[r - 1] end
  local at = ffi.new("int32_t[?]", math.max(nrows, 1))
  for r = 0, nrows - 1 do at[r] = first[r] end
  local start, len = ffi.new("int64_t[?]", math.max(np, 1)), ffi.new("int32_t[?]", math.max(np, 1))
  for i = 0, np - 1 do
    local r = prow[i]
    start[at[r]], len[at[r]] = pstart[i], plen[i]
    at[r] = at[r] + 1
  end
  return setmetatable({ rows = nrows, pieces = np, first = first, start = start, len = len, seq = T, max_piece = P,
    tokens = tokens, dropped = dropped, split = split }, Packing)
end

function Packing:row(r) return self.first[r], self.first[r + 1] end

-- {rows, pieces, tokens, fill = tokens / (rows * T), dropped (documents
-- of < 2 tokens), split (documents cut into pieces)}
function Packing:stats()
  return { rows = self.rows, pieces = self.pieces, tokens = self.tokens,
    fill = self.rows > 0 and self.tokens / (self.rows * self.seq) or 0, dropped = self.dropped, split = self.split }
end

return M
