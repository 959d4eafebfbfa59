-- fsdp.collective: a sharded model's ranks as one group, for the phases
-- each rank runs on its own share and all must agree on (checkpoint save
-- and load, the Hugging Face export and import): this rank's place and the
-- count (the shard group, times the outer group under HSDP), sums over all
-- of them, exact integers and rank 0's text shared, one verdict when any
-- rank failed, and a stop signal noticed inside such a phase.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local shard = require "fsdp.shard"
local ffi, C = base.ffi, base.C

local M = {}

-- (tensor parallelism: the tp ranks of each data-parallel rank too, innermost)
local function world(s)
  local S, O, P = s.shard:size(), s.outer and s.outer:size() or 1, s.tp and s.tp:size() or 1
  return ((s.outer and s.outer:rank() or 0) * S + s.shard:rank()) * P + (s.tp and s.tp:rank() or 0), S * O * P
end

local function all_reduce(s, t, op)
  shard.all_reduce_host(s.shard, t, op)
  if s.outer then shard.all_reduce_host(s.outer, t, op) end
  if s.tp then shard.all_reduce_host(s.tp, t, op) end
end

-- Integers in [0, 2^48) that each rank fills at its own indices (zeros
-- elsewhere), summed over the ranks exactly (fsdp.shard's sum_ints).
-- vals: {[i] = v} for this rank's indices (0-based); returns a function i -> v.
local function share_ints(s, n, vals)
  for _, v in pairs(vals) do
    if v < 0 or v >= 2 ^ 48 or v % 1 ~= 0 then error("collective: integer " .. tostring(v) .. " out of range", 2) end
  end
  local sums = shard.sum_ints(s, n, vals, true)
  return function(i) return sums[i] end
end

-- Every rank learns whether any failed: err (a message or nil) on this
-- rank; raises on all ranks when one failed, naming the first such rank
-- and what became of the files (tail; default: nothing was changed).
local function agree(s, err, what, tail)
  local r, n = world(s)
  local t = tensor.new(n):fill(0)
  if err then
    t:set(r, 1)
    err = base.prefixed(what, err)
  end
  if err and n > 1 then -- said now: another rank's error may end the job before this rank's is shown
    io.stderr:write(string.format("fsdp: rank %d: %s\n", r, err))
    io.stderr:flush()
  end
  all_reduce(s, t, "sum")
  for q = 0, n - 1 do
    if t:get(q) > 0 then
      if err then error(err, 0) end
      error(string.format("%s: rank %d failed (its message says why); %s", what, q, tail or "nothing was changed"), 0)
    end
  end
end

-- Rank 0's text (up to 2047 bytes), on every rank: the others pass nil.
-- Collective: one all-reduce.
local function share_text(s, text)
  local cap = 2048
  local mine = {}
  if text then
    text = text:sub(1, cap - 1)
    mine[0] = #text
    for i = 1, #text do mine[i] = text:byte(i) end
  end
  local got = share_ints(s, cap, mine)
  local out = {}
  for i = 1, got(0) do out[i] = string.char(got(i)) end
  return table.concat(out)
end


-- In a long phase that each rank runs alone (reading or writing its pieces):
-- raises when a stop signal came to this rank. The phase's agreement then
-- fails on every rank, and the caller asks the ranks (Sharded:stop_agreed)
-- whether a stop was the cause.
local test_stop = os.getenv("FSDP_TEST_STOP_IN") -- the tests: "load" or "export": each rank signals itself there, once
pcall(ffi.cdef, "int raise(int sig);")
local function stop_check(phase, key)
  if test_stop and test_stop == key then
    test_stop = nil
    ffi.C.raise(15) -- SIGTERM, recorded by the stop-signal watch
  end
  local sig = C.fsdp_stop_signal()
  if sig > 0 then error(string.format("%s stopped by %s", phase, ffi.string(C.fsdp_signal_name(sig))), 0) end
end

M.world, M.all_reduce, M.share_ints, M.agree, M.share_text, M.stop_check = world, all_reduce, share_ints, agree,
  share_text, stop_check

return M
