-- fsdp.checkpoint_manager: the trainer's checkpoints as one policy. Which
-- checkpoint a run resumes from (train.resume: a path, or auto: the newest
-- whose data checks out, a damaged one skipped; an fsdprun restart: its own
-- run's newest, never another run's), the history a run continues
-- (checkpoint.dir's lock and the run id it records, checked against the
-- directory's), the micro-batches that keep a resumed run's global batch,
-- and saving with retention (checkpoint.keep_last). The save/load protocol
-- is fsdp.checkpoint's; a directory's contents, fsdp.ckpt_dir's.
--   local cm = checkpoint_manager.open(r, {where, rank, shard, outer, appended, original_resume, say, owned})
--   local K = cm:grad_accum(args, dp)            -- before the plan and the units
--   local got = cm:resume(sharded, {...})        -- after the units: {start, consumed, seed} or {stopped = sig}
--   cm:save(sharded, step, meta, async); cm:committed(path)
local fsdp = require "fsdp"
local recipe = require "fsdp.recipe"
local checkpoint = require "fsdp.checkpoint"
local data = require "fsdp.data"
local dir_lock = require "fsdp.dir_lock"
local restarts = require "fsdp.restarts"

local M = {}
local Manager = {}
Manager.__index = Manager

-- The checkpoints this run may resume from, found before the plan: the
-- global batch a run keeps comes from the one it loads, and with it the
-- micro-batches per step that the plan and the units are made for. Takes
-- checkpoint.dir's lock (one job per directory: a second is refused,
-- naming the first; collective over the mesh's groups); a restart
-- continues the run its previous attempt recorded there, and only that run.
function M.open(r, o)
  local where, say, ck = o.where, o.say, r.checkpoint
  local cm = setmetatable({ r = r, where = where, say = say, rank = o.rank, ck = ck }, Manager)
  local lock, mine = nil, nil
  if ck.dir then
    local okw, ew = pcall(checkpoint.check_writable, ck.dir, o.rank)
    if not okw then error(string.format("%s: checkpoint.dir: %s; nothing was trained", where, tostring(ew)), 0) end
    lock = dir_lock.take({ shard = o.shard, outer = o.outer }, ck.dir, where)
    o.owned.lock = lock
    local prev, job = lock.previous, os.getenv("FSDPRUN_JOB_ID")
    if o.appended and prev and job and prev.job == job and prev.run then mine = prev.run end
  end
  local appended, original_resume = o.appended, o.original_resume
  local auto, cands = r.train.resume == "auto", { r.train.resume }
  if appended and mine then -- fsdprun's train.resume=auto: this run's newest checkpoint, never another run's
    local own = {}
    for _, path in ipairs((checkpoint.candidates(ck.dir))) do
      local ok, m = pcall(checkpoint.meta, path)
      if ok and m.run_id == mine then own[#own + 1] = path end
    end
    if #own > 0 then
      cands = own
    elseif original_resume and original_resume ~= "auto" then
      say("resume: run %s saved nothing in %s yet: this restart begins from %s, as the first attempt did", mine, ck.dir,
        original_resume)
      auto, cands = false, { original_resume }
    else
      say("resume: run %s saved nothing in %s yet: this restart begins at step 1, as the first attempt did", mine, ck.dir)
      auto, cands = false, {}
    end
  elseif appended then -- the first attempt recorded no run: begin as it did
    say("resume: the first attempt recorded no run%s: this restart begins as it did", ck.dir and " in " .. ck.dir or "")
    auto, cands = original_resume == "auto", { original_resume }
  end
  if auto and not (appended and mine) then
    local why
    cands, why = checkpoint.candidates(ck.dir)
    if why then say("resume: skipped %s", why) end
    local named = #cands == 0 and checkpoint.latest_name(ck.dir)
    if named then -- `latest` proves a run saved here: starting at step 1 would begin its history anew
      error(string.format("%s: train.resume=auto: %s/latest names %s, which %s, and no other checkpoint in %s opens. A run " ..
        "saved there: restore %s/%s, continue from a checkpoint of your own with train.resume=PATH, or start over in " ..
        "another checkpoint.dir (or remove %s/latest)", where, ck.dir, named, checkpoint.exists(ck.dir .. "/" .. named) and
        "does not open" or "does not exist", ck.dir, ck.dir, named, ck.dir), 0)
    end
    if #cands == 0 then
      say("resume: no checkpoint in %s yet: starting at step 1", ck.dir)
    end
  end
  cm.lock, cm.mine, cm.auto, cm.cands = lock, mine, auto, cands
  return cm
end

-- Micro-batches per step: the recipe's, or on a resume what keeps its
-- checkpoint's global batch (recipe.resume_grad_accum: refused where it
-- cannot). Worked out from the newest candidate; should its data be
-- damaged, the one loaded instead is held to the same K (resume).
function Manager:grad_accum(args, dp)
  local r, where = self.r, self.where
  local explicit, as_given = recipe.batch_override(r, args), recipe.copy(r)
  self.grad_accum_for = function(path, m)
    return recipe.resume_grad_accum(as_given, dp, m, { where = where, what = path, explicit = explicit })
  end
  local K = recipe.grad_accum(r, dp, where)
  if self.cands[1] then
    local ok, m = pcall(checkpoint.meta, self.cands[1]) -- (one that does not open is refused by the loads below)
    if ok then K = self.grad_accum_for(self.cands[1], m) end
  end
  self.K = K
  return K
end

-- Loads the checkpoint this run resumes from into sharded (the newest
-- whose data checks out; one whose data fails its CRC is skipped, its
-- saves replacing it, the next older tried), and records the run this job
-- now writes before any checkpoint is removed. o: seed (the recipe's),
-- windows (the train split's for data.resume_position), seq, micro_batch,
-- world (the world group, for checkpoint.overwrite's barrier).
-- Returns {start, consumed, seed, resumed} or {stopped = signal} (a stop
-- signal during the load: nothing trained, the checkpoint as it was).
function Manager:resume(sharded, o)
  local where, say, ck, cands, auto = self.where, self.say, self.ck, self.cands, self.auto
  local start, consumed, seed, resumed, saved = 1, 0, o.seed, nil, nil
  local damaged, run_id = {}, nil
  for _, path in ipairs(cands) do
    local ok, m = pcall(checkpoint.meta, path) -- its index first: what is refused below is refused before any weight is read
    if not ok then error(where .. ": train.resume: " .. tostring(m), 0) end
    saved, resumed = m, path
    -- the history this run continues (its checkpoint's); checkpoint.dir holds one
    run_id = saved.run_id or checkpoint.new_run_id(sharded)
    if not saved.run_id then
      say("resume: %s records no run id (saved before fsdp recorded them); this run's checkpoints carry %s", resumed, run_id)
    end
    if ck.dir then
      local ok2, e = pcall(checkpoint.check_history, ck.dir, run_id, saved.step or 0, damaged)
      if not ok2 then error(where .. ": checkpoint.dir: " .. tostring(e), 0) end
    end
    local ok3, at, note = pcall(data.resume_position, saved, { seq = o.seq, micro_batch = o.micro_batch, windows = o.windows },
      resumed)
    if not ok3 then error(where .. ": train.resume: " .. tostring(at), 0) end
    local k, batch_note = self.grad_accum_for(resumed, saved) -- (raises where its global batch cannot be kept)
    if k ~= self.K then -- the newest was damaged, and this older one keeps its batch with another K than the run was made for
      error(string.format("%s: train.resume: %s needs train.grad_accum = %d to keep its global batch, and this run was set up " ..
        "for %d (from %s, whose data is damaged): resume it on its own with train.resume=%s", where, resumed, k, self.K, cands[1],
        resumed), 0)
    end
    local meta, why, mine
    ok, meta, why, mine = pcall(checkpoint.load, sharded, resumed, { optimizer = self.r.optimizer.name, skip_damaged = auto })
    local sig = not ok and sharded:stop_agreed() -- (the load failed on every rank: a stop signal, or not)
    if sig then
      if self.rank == 0 then
        io.stderr:write(string.format("fsdp: stopped by %s during the load of %s: nothing trained or saved; a resume " ..
          "loads it again\n", sig > 0 and fsdp.ffi.string(fsdp.C.fsdp_signal_name(sig)) or "a signal to another rank", resumed))
        io.stderr:flush()
      end
      return { stopped = sig }
    end
    if not ok then error(where .. ": train.resume: " .. tostring(meta), 0) end
    if meta then
      start, consumed = (meta.step or 0) + 1, at
      sharded.skipped = meta.skipped
      if meta.seed and meta.seed ~= seed then
        say("resume: %s was trained with train.seed = %d; keeping it for the data order (the recipe says %d)", resumed,
          meta.seed, seed)
        seed = meta.seed
      end
      say("resumed from %s: step %d done, %d windows of data consumed", resumed, start - 1, saved.consumed or 0)
      if note then say("resume: %s", note) end
      if batch_note then say(batch_note:find("^warning: ") and "fsdp: %s" or "resume: %s", batch_note) end
      break
    end
    if mine then io.stderr:write(string.format("fsdp: rank %d: resume: %s\n", self.rank, why)) end
    say("resume: skipped %s: its data is damaged (a rank's message above says where); trying the one before", resumed)
    damaged[resumed:match("[^/]+$")] = true
    saved, resumed, run_id = nil, nil, nil
  end
  if auto and next(damaged) and not resumed then
    error(string.format("%s: train.resume=auto: every checkpoint in %s is damaged (see above). Restore one, or start over " ..
      "in another checkpoint.dir", where, ck.dir), 0)
  end
  if not saved then -- a new history (a restart's whose run saved nothing yet: that run's id again)
    run_id = self.mine or checkpoint.new_run_id(sharded)
  end
  self.run_id = run_id
  -- the run this job now writes, before any checkpoint is removed: a restart
  -- after a failure from here on continues this run and no other
  local restart = restarts.current()
  dir_lock.record(self.lock, { run = run_id, attempt = restart and restart.attempt or 0 })
  restarts.test_kill(restart, self.rank, 0) -- (FSDP_TEST_KILL_AT step 0: a rank dies here, before the old checkpoints go)
  if not saved then
    if ck.dir and ck.overwrite then -- starting over: rank 0 removes the directory's checkpoints, the others wait
      if self.rank == 0 then
        local ok, gone = pcall(checkpoint.clear, ck.dir)
        if not ok then error(where .. ": checkpoint.overwrite: " .. tostring(gone), 0) end
        if #gone > 0 then say("checkpoint.overwrite=true: removed %d checkpoint(s) from %s (%s to %s)", #gone, ck.dir, gone[1], gone[#gone]) end
      end
      o.world:barrier()
    elseif ck.dir then
      local ok, e = pcall(checkpoint.check_history, ck.dir, run_id, 0)
      if not ok then error(where .. ": checkpoint.dir: " .. tostring(e), 0) end
    end
  end
  self.resumed = resumed
  return { start = start, consumed = consumed, seed = seed, resumed = resumed }
end

-- Saves step's checkpoint of sharded in checkpoint.dir (async by
-- checkpoint.async unless given), the run id added to meta; the oldest
-- beyond checkpoint.keep_last go. files: carried beside the weights (hf/).
function Manager:save(sharded, step, meta, files, async)
  local ck = self.ck
  if async == nil then async = ck.async end
  meta.run_id = self.run_id
  local ok, e = pcall(checkpoint.save, sharded, ck.dir, { step = step, optimizer = self.r.optimizer.name, async = async,
    keep_last = ck.keep_last, files = files, meta = meta })
  if not ok then error(self.where .. ": " .. fsdp.prefixed("checkpoint", e), 0) end
  return e
end

-- A save that has committed (checkpoint.poll / wait / a synchronous
-- save's path): said, and remembered as the newest (self.last_saved)
function Manager:committed(path)
  if path then
    self.last_saved = path
    self.say("checkpoint: %s", path)
  end
end

function Manager:release() dir_lock.release(self.lock) end

return M
