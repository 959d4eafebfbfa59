-- fsdp.checkpoint: sharded checkpoints of a fully_shard model (docs/CHECKPOINTS.md).
--   ckpt.save(s, dir, {step = 10, optimizer = "adamw", meta = {...}, async = true, keep_last = 3})
--   ckpt.poll(s) / ckpt.wait(s)   -- commit a finished async save (collective)
--   local meta = ckpt.load(s, path, {optimizer = "adamw"})
--   local path = ckpt.latest(dir)  -- the newest checkpoint that opens, or nil
-- Each rank writes only the state it owns; rank 0 writes the index last and
-- renames the directory into place, so a save that does not finish leaves
-- the previous checkpoint as it was. Loading reads, on each rank, only the
-- element ranges it now holds: any world size, ZeRO level, mesh or unit
-- grouping. Every call here is collective over the model's ranks.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local json = require "fsdp.json"
local shard = require "fsdp.shard"
local collective = require "fsdp.collective"
local ckpt_dir = require "fsdp.ckpt_dir"
local ffi, C, check = base.ffi, base.C, base.check

local M = {}

-- the states each optimizer keeps, in the unit's state-kind order
M.states = { adamw = { "param", "exp_avg", "exp_avg_sq" }, sgd = { "param", "momentum" } }

local function last_error() return ffi.string(C.fsdp_last_error()) end

-- the sharded model's ranks as one group (fsdp.collective)
local world, all_reduce, share_ints, agree = collective.world, collective.all_reduce, collective.share_ints, collective.agree

-- ---- non-finite values in loaded weights ----
-- A NaN or infinity in the weights a run starts from would skip every step
-- and end "successfully". Each rank scans what it reads (one vectorised
-- pass, fsdp_find_nonfinite) and keeps its first bad element in model
-- order; verdict() (collective) finds the first over all ranks, so every
-- rank gives the same message whatever the world size.

-- a before b: (tensor id, state, element) in that order
local function before(a, b)
  return a[1] < b[1] or (a[1] == b[1] and (a[2] < b[2] or (a[2] == b[2] and a[3] < b[3])))
end

local function finite_guard()
  local g = {}
  -- n floats at ptr hold elements [begin, begin + n) of state k of tensor e
  function g.scan(e, k, begin, ptr, n)
    local i = tonumber(C.fsdp_find_nonfinite(ptr, n))
    if i < 0 then return end
    local key = { e.id, k, begin + i, tonumber(ffi.cast("const uint32_t *", ptr)[i]) }
    if not g.first or before(key, g.first) then g.first = key end
  end
  -- nil, or "tensor 'NAME' (STATE) holds VALUE at element I ([i, j])"
  function g.verdict(s, list, states)
    local r, n = world(s)
    local mine = {}
    if g.first then for j = 1, 4 do mine[5 * r + j - 1] = g.first[j] end; mine[5 * r + 4] = 1 end
    local all = share_ints(s, 5 * n, mine)
    local best
    for q = 0, n - 1 do
      if all(5 * q + 4) == 1 then
        local key = { all(5 * q), all(5 * q + 1), all(5 * q + 2), all(5 * q + 3) }
        if not best or before(key, best) then best = key end
      end
    end
    if not best then return nil end
    local e, at, coords = list[best[1] + 1], best[3], {}
    for d = #e.shape, 1, -1 do coords[d] = at % e.shape[d]; at = math.floor(at / e.shape[d]) end
    local bits = ffi.new("uint32_t[1]", best[4])
    return string.format("tensor '%s' (%s) holds %s at element %d ([%s] of %s): a run cannot start from non-finite " ..
      "weights", e.name, states[best[2] + 1], tostring(base.f32(ffi.cast("float *", bits))), best[3],
      table.concat(coords, ", "), table.concat(e.shape, "x"))
  end
  return g
end
M.finite_guard = finite_guard

-- the model's parameters in model order: name, shape, numel, unit, index
-- (a tensor-parallel slice's: the whole weight's shape and size)
local function catalogue(s)
  local list, by_name = {}, {}
  for _, u in ipairs(s.units) do
    for _, p in ipairs(u.params) do
      local sl = p.spec.slice
      local shape = sl and sl.full or p.spec.shape or { p.spec.numel }
      local e = { id = #list, name = p.name, shape = shape, numel = sl and shape[1] * shape[2] or p.spec.numel, unit = u,
        index = p.index }
      list[#list + 1] = e
      by_name[p.name] = e
    end
  end
  return list, by_name
end

-- the element ranges a unit's state holds on this rank (to_save = 0) or
-- this rank saves (1): {param (0-based), name, begin, end, off (in the state arrays)},
-- begin and end in the whole tensor's elements: a tensor-parallel slice's
-- piece goes as runs within the full weight's rows; what every tp rank
-- holds whole is saved by tp rank 0
local function pieces(u, to_save)
  local n = check(C.fsdp_unit_state_pieces(u.handle, to_save, nil, 0), "checkpoint: unit '" .. u.name .. "'")
  local ps = ffi.new("fsdp_layout_piece[?]", math.max(n, 1))
  C.fsdp_unit_state_pieces(u.handle, to_save, ps, n)
  local out = {}
  for i = 0, n - 1 do
    local p = u.params[ps[i].param + 1]
    local b, e, off = tonumber(ps[i].begin), tonumber(ps[i]["end"]), tonumber(ps[i].shard_offset)
    local sl = p.spec.slice
    if sl then
      while b < e do -- a run: the rest of a slice's row, or of the piece
        local row, col = math.floor(b / sl.cols), b % sl.cols
        local len = math.min(sl.cols - col, e - b)
        local g = (row + sl.row0) * sl.full[2] + col + sl.col0
        out[#out + 1] = { param = ps[i].param, name = p.name, begin = g, ["end"] = g + len, off = off }
        b, off = b + len, off + len
      end
    elseif not (to_save == 1 and p.spec.replicated and (u.tp_rank or 0) ~= 0) then
      out[#out + 1] = { param = ps[i].param, name = p.name, begin = b, ["end"] = e, off = off }
    end
  end
  return out
end
M.catalogue, M.pieces = catalogue, pieces

-- ---- the directory: its checkpoints, `latest`, its history (fsdp.ckpt_dir) ----
local step_dirs, exists = ckpt_dir.step_dirs, ckpt_dir.exists
local open, meta_of = ckpt_dir.open, ckpt_dir.meta_of
for _, k in ipairs({ "list", "exists", "read_text", "latest", "candidates", "latest_name", "meta", "new_run_id",
  "checkpoint_of", "history", "clear", "another_run", "check_history" }) do
  M[k] = ckpt_dir[k]
end

local function write_text(path, text)
  if C.fsdp_fs_write_atomic(path, text, #text) < 0 then error(path .. ": " .. last_error(), 0) end
end

-- ---- save ----

-- n floats of host memory for a save's staging copy: pinned when the model
-- is on a GPU (the device-to-host copies then run at full speed), else a
-- plain engine tensor; :ptr() and :free() either way
local function staging_buffer(s, n)
  if s.device ~= "cuda" then return tensor.new(math.max(n, 1)) end
  local p = ffi.new("void *[1]")
  check(C.fsdp_alloc_host_pinned(math.max(n, 1) * 4, p), "checkpoint: pinned staging")
  local b = { raw = ffi.gc(p[0], C.fsdp_free_host_pinned) }
  function b:ptr() return ffi.cast("float *", self.raw) end
  function b:free()
    if self.raw ~= nil then C.fsdp_free_host_pinned(ffi.gc(self.raw, nil)) end
    self.raw = nil
  end
  return b
end

-- FSDP_TEST_CKPT_KILL = "RANK:STEP:BYTES": the tests' way to kill a rank
-- part-way through writing the checkpoint of STEP
local function fault_hook(rank, step)
  local spec = os.getenv("FSDP_TEST_CKPT_KILL")
  if not spec then return end
  local r, st, b = spec:match("^(%d+):(%d+):(%d+)$")
  if tonumber(r) == rank and tonumber(st) == step then C.fsdp_ckpt_writer_fault(tonumber(b)) end
end

local function commit(s)
  local p = s.ckpt_pending
  s.ckpt_pending = nil
  local r, n = world(s)
  local nseg = #p.segs
  local offsets, crcs, fbytes = ffi.new("int64_t[?]", math.max(nseg, 1)), ffi.new("uint32_t[?]", math.max(nseg, 1)),
    ffi.new("int64_t[1]")
  local rc = C.fsdp_ckpt_writer_finish(p.writer, offsets, crcs, fbytes)
  p.staging:free()
  local what = "checkpoint: saving " .. p.final
  local ok, err = pcall(agree, s, rc < 0 and last_error() or nil, what)
  if not ok then
    if r == 0 then C.fsdp_fs_remove_tree(p.tmp) end
    error(err, 0)
  end
  -- every rank's segment table to rank 0: counts, then the tables, by sums
  local counts = share_ints(s, 2 * n, { [r] = nseg, [n + r] = tonumber(fbytes[0]) })
  local first, total = 0, 0
  for q = 0, n - 1 do
    if q < r then first = first + counts(q) end
    total = total + counts(q)
  end
  local mine = {}
  for i, g in ipairs(p.segs) do
    local k = (first + i - 1) * 6
    mine[k], mine[k + 1], mine[k + 2], mine[k + 3] = g.tensor, g.state, g.begin, g["end"]
    mine[k + 4], mine[k + 5] = tonumber(offsets[i - 1]), tonumber(crcs[i - 1])
  end
  local tab = share_ints(s, total * 6, mine)
  -- rank 0 writes the index, renames and re-points `latest`; the others
  -- learn how that went from the agreement (not from a collective that
  -- would wait for a rank 0 that has stopped: a full disk here fails the
  -- save on every rank at once)
  local ok2, err2 = true, nil
  if r == 0 then ok2, err2 = pcall(function()
    local files, segments, tensors = {}, {}, {}
    for _, e in ipairs(p.catalogue) do
      tensors[#tensors + 1] = { name = e.name, dtype = "F32", shape = json.array(e.shape) }
    end
    local at = 0
    for q = 0, n - 1 do
      files[q + 1] = { name = string.format("rank-%05d.bin", q), bytes = counts(n + q) }
      for _ = 1, counts(q) do
        local k = at * 6
        segments[#segments + 1] = { tab(k), tab(k + 1), tab(k + 2), tab(k + 3), q, tab(k + 4), tab(k + 5) }
        at = at + 1
      end
    end
    local text = json.encode({ format = "fsdp-checkpoint", version = 1, meta = p.meta, states = p.states,
      tensors = json.array(tensors), files = files, segments = json.array(segments) })
    write_text(p.tmp .. "/index.json", text)
    write_text(p.tmp .. "/index.sum", string.format("crc32c %08x bytes %d\n", C.fsdp_crc32c(0, text, #text), #text))
    if exists(p.final) then check(C.fsdp_fs_remove_tree(p.final), what) end
    check(C.fsdp_fs_rename(p.tmp, p.final), what)
    write_text(p.dir .. "/latest", p.name .. "\n")
    -- retention: the newest keep_last step-* directories stay
    if p.keep_last and p.keep_last > 0 then
      local steps = step_dirs(p.dir)
      for i = 1, #steps - p.keep_last do
        if steps[i] ~= p.name then check(C.fsdp_fs_remove_tree(p.dir .. "/" .. steps[i]), "checkpoint: retention") end
      end
    end
  end) end
  agree(s, not ok2 and err2 or nil, what, "the checkpoints already there are whole")
  return p.final
end

-- Commits a pending async save once every rank's writer has finished
-- (collective: call it on every rank, e.g. once per step). Returns the
-- committed path, or nil.
function M.poll(s)
  if not s.ckpt_pending then return nil end
  local t = tensor.new(1):fill(C.fsdp_ckpt_writer_done(s.ckpt_pending.writer))
  all_reduce(s, t, "sum")
  if t:get(0) == select(2, world(s)) then return commit(s) end
  return nil
end

-- Waits for a pending save and commits it (collective). Returns its path or nil.
function M.wait(s)
  if not s.ckpt_pending then return nil end
  return commit(s)
end

-- o: step (integer, names the directory), optimizer ("adamw" | "sgd"),
-- meta (a table of numbers and strings saved in the index: the trainer's
-- step, data position, seed...), async (default false), keep_last (0: all),
-- files ({name = bytes}: written into the checkpoint's hf/ folder, the
-- model's config.json and tokenizer files, for fsdp generate and exports).
-- With meta.run_id, a checkpoint of another run is never replaced (nor
-- `latest` moved away from one): the save fails, changing nothing.
-- Before training: dir can be made and written by this rank (a file made
-- and removed), so that a wrong checkpoint.dir stops the run at its start,
-- not at its first save. Errors name the directory and the reason.
function M.check_writable(dir, rank)
  if C.fsdp_fs_mkdirs(dir) < 0 then
    error(string.format("cannot create '%s' (%s)", dir, ffi.string(C.fsdp_last_error())), 0)
  end
  local probe = string.format("%s/.write-test-rank-%d", dir, rank or 0)
  local f, e = io.open(probe, "w")
  local ok = f and f:write("fsdp\n") and f:close()
  os.remove(probe)
  if not ok then error(string.format("cannot write in '%s' (%s)", dir, tostring(e or "write error")), 0) end
end

function M.save(s, dir, o)
  o = o or {}
  M.wait(s)
  local states = M.states[o.optimizer or "adamw"]
  if not states then error("checkpoint.save: optimizer '" .. tostring(o.optimizer) .. "' (expected adamw or sgd)", 2) end
  if type(o.step) ~= "number" or o.step < 0 or o.step % 1 ~= 0 then error("checkpoint.save: step must be an integer >= 0", 2) end
  local r = world(s)
  local name = string.format("step-%08d", o.step)
  local tmp, final = dir .. "/.tmp-" .. name, dir .. "/" .. name
  local err
  if r == 0 then
    local ok, e = pcall(function()
      check(C.fsdp_fs_mkdirs(dir), "checkpoint: directory")
      local run_id = o.meta and o.meta.run_id
      if run_id then -- never replace, nor re-point `latest` away from, another run's checkpoint
        local steps = step_dirs(dir)
        for _, other in ipairs({ name, steps[#steps] }) do
          local c = M.checkpoint_of(dir, other)
          if c and c.run_id and c.run_id ~= run_id then error(M.another_run(dir, c, run_id), 0) end
        end
      end
      for _, e in ipairs(M.list(dir)) do -- leftovers of saves that did not finish
        if e:match("^%.tmp%-") then check(C.fsdp_fs_remove_tree(dir .. "/" .. e), "checkpoint: clean up") end
      end
      check(C.fsdp_fs_mkdirs(tmp), "checkpoint: directory")
      if o.files then -- the model's config.json and tokenizer, committed with the weights
        check(C.fsdp_fs_mkdirs(tmp .. "/hf"), "checkpoint: directory")
        for name, bytes in pairs(o.files) do write_text(tmp .. "/hf/" .. name, bytes) end
      end
    end)
    err = not ok and e or nil
  end
  agree(s, err, "checkpoint: saving " .. final)
  -- every rank settles every unit first, in order: a unit whose offloaded
  -- step is pending gathers its new params as it settles (ZeRO 1 and 2), a
  -- collective; reading only its own pieces, a rank that holds none of a
  -- small unit (padding alone) would issue that gather later, against
  -- another collective (a hang on NCCL)
  s:synchronize()
  -- this rank's segments, staged in host memory (training may go on)
  local list, by_name = catalogue(s)
  local segs, total = {}, 0
  for _, u in ipairs(s.units) do
    for _, pc in ipairs(pieces(u, 1)) do
      local e = by_name[pc.name]
      for k = 1, #states do
        segs[#segs + 1] = { unit = u, kind = k - 1, off = pc.off, tensor = e.id, state = k - 1, begin = pc.begin,
          ["end"] = pc["end"], at = total }
        total = total + (pc["end"] - pc.begin)
      end
    end
  end
  local staging = staging_buffer(s, total)
  local base_ptr = staging:ptr()
  local bufs, bytes = ffi.new("const void *[?]", math.max(#segs, 1)), ffi.new("int64_t[?]", math.max(#segs, 1))
  for i, g in ipairs(segs) do
    local len = g["end"] - g.begin
    check(C.fsdp_unit_state_get(g.unit.handle, g.kind, g.off, len, base_ptr + g.at), "checkpoint: unit '" .. g.unit.name .. "'")
    bufs[i - 1], bytes[i - 1] = base_ptr + g.at, len * 4
  end
  fault_hook(r, o.step)
  local w = ffi.new("fsdp_ckpt_writer *[1]")
  check(C.fsdp_ckpt_writer_start(string.format("%s/rank-%05d.bin", tmp, r), #segs, bufs, bytes, w), "checkpoint: write")
  s.ckpt_pending = { writer = w[0], segs = segs, staging = staging, bufs = bufs, bytes = bytes, tmp = tmp, final = final,
    dir = dir, name = name, meta = o.meta or {}, states = states, catalogue = list, keep_last = o.keep_last }
  if not o.async then return M.wait(s) end
  return nil
end

-- ---- load ----

local function shape_str(shape) return table.concat(shape, "x") end

-- Checks that the checkpoint holds exactly this model's tensors with these
-- shapes; returns nil or the first difference, named.
local function compare_tensors(h, list, by_name, path)
  local n = C.fsdp_ckpt_tensor_count(h)
  local name, nd, shape = ffi.new("const char *[1]"), ffi.new("int[1]"), ffi.new("int64_t[8]")
  local seen = {}
  for i = 0, n - 1 do
    C.fsdp_ckpt_tensor_info(h, i, name, nd, shape)
    local nm = ffi.string(name[0])
    local e = by_name[nm]
    if not e then return string.format("%s holds tensor '%s', which this model does not have (another model?)", path, nm) end
    local got = {}
    for k = 0, nd[0] - 1 do got[#got + 1] = tonumber(shape[k]) end
    if shape_str(got) ~= shape_str(e.shape) then
      return string.format("%s: tensor '%s' has shape %s in the checkpoint, the model expects %s", path, nm,
        shape_str(got), shape_str(e.shape))
    end
    seen[nm] = true
  end
  for _, e in ipairs(list) do
    if not seen[e.name] then return string.format("%s has no tensor '%s' (shape %s), which the model needs", path, e.name, shape_str(e.shape)) end
  end
end

-- Loads path into s: every rank reads the ranges it holds, all verified
-- before any is applied; on any rank's failure no rank changes anything.
-- o.optimizer: the states to load. Returns the saved meta table.
-- o.skip_damaged: when data fails its CRC on some rank (and nothing else
-- failed), return nil, why, and whether this rank found it, on every rank,
-- instead of raising (resume=auto then tries the previous checkpoint).
function M.load(s, path, o)
  o = o or {}
  local what = "checkpoint: loading " .. path
  local optimizer = o.optimizer or "adamw"
  local states = M.states[optimizer]
  if not states then error("checkpoint.load: optimizer '" .. tostring(optimizer) .. "' (expected adamw or sgd)", 2) end
  local list, by_name = catalogue(s)
  local staged, meta, guard, damaged = {}, nil, finite_guard(), false
  -- everything into host memory first (h is closed on every path)
  local function read_all(h)
    meta = meta_of(h)
    if meta.optimizer and meta.optimizer ~= optimizer then
      error(string.format("%s was saved with optimizer '%s'; this run uses '%s'", path, meta.optimizer, optimizer), 0)
    end
    local diff = compare_tensors(h, list, by_name, path)
    if diff then error(diff, 0) end
    for _, st in ipairs(states) do
      if C.fsdp_ckpt_has_state(h, st) ~= 1 then error(string.format("%s has no '%s' state", path, st), 0) end
    end
    for _, u in ipairs(s.units) do
      local n = tonumber(C.fsdp_unit_state_numel(u.handle))
      local bufs = {}
      for k = 1, #states do bufs[k] = tensor.new(math.max(n, 1)):fill(0) end -- padding stays zero
      staged[#staged + 1] = { unit = u, bufs = bufs, n = n }
      for _, pc in ipairs(pieces(u, 0)) do
        collective.stop_check("the checkpoint's load", "load")
        for k, st in ipairs(states) do
          local at = bufs[k]:ptr() + pc.off
          local rc = C.fsdp_ckpt_read(h, pc.name, st, pc.begin, pc["end"], at)
          if rc < 0 then
            damaged = rc == C.FSDP_ECORRUPT
            error(last_error(), 0)
          end
          guard.scan(by_name[pc.name], k - 1, pc.begin, at, pc["end"] - pc.begin)
        end
      end
    end
  end
  local ok, err = pcall(function()
    local h, e = open(path)
    if not h then error(e, 0) end
    local ok2, e2 = pcall(read_all, h)
    C.fsdp_ckpt_close(ffi.gc(h, nil))
    if not ok2 then error(e2, 0) end
  end)
  local function drop() for _, g in ipairs(staged) do for _, b in ipairs(g.bufs) do b:free() end end end
  if not ok then drop() end -- nothing is applied: free the staging now
  if o.skip_damaged then -- data that fails its CRC on some rank, and nothing else wrong: nil and why, on every rank
    local t = tensor.new(2):fill(0)
    t:set(damaged and 0 or 1, not ok and 1 or 0)
    all_reduce(s, t, "sum")
    if t:get(0) > 0 and t:get(1) == 0 then
      return nil, damaged and err or "another rank found damaged data (its message says where)", damaged
    end
  end
  agree(s, not ok and err or nil, what)
  local bad = guard.verdict(s, list, states)
  if bad then
    drop()
    error(string.format("%s: %s", what, bad), 0)
  end
  for _, g in ipairs(staged) do
    for k, b in ipairs(g.bufs) do
      check(C.fsdp_unit_state_set(g.unit.handle, k - 1, 0, g.n, b:ptr()), what)
      b:free()
    end
    check(C.fsdp_unit_state_publish(g.unit.handle), what)
  end
  s.step_count = meta.optimizer_step or 0
  return meta
end

return M
