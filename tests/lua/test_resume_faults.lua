-- test_resume_faults.lua: checkpoints that a resume or a save cannot use
-- end the run promptly, naming the file, or are skipped for an older good
-- one (issue 18).
--   fsdp tests/lua/test_resume_faults.lua FSDPRUN ROOT
--   * a full disk when rank 0 re-points `latest` (latest.tmp is a link to
--     /dev/full): every rank's save fails at once naming the file, not
--     after FSDP_COMM_TIMEOUT; the previous checkpoint stays whole
--   * `latest` naming a checkpoint that no longer exists, and no other one:
--     resume=auto refuses, naming the directory, the checkpoint, the ways out
--   * the newest checkpoint's data fails its CRC: resume=auto says where and
--     goes on from the one before, with the losses of an uninterrupted run
--     bit for bit; an explicit resume of it is still refused
-- With "job DIR" instead, this file is the ranks' job of the first case.
local fsdp = require "fsdp"
local ckpt = require "fsdp.checkpoint"
local C = fsdp.C

if arg[1] == "job" then -- one save, then a second onto the full disk, on every rank
  local dir = arg[2]
  local F = dofile((arg[0]:match("^(.*/)") or "./") .. "mlp_fixture.lua")(fsdp)
  local R = fsdp.init().rank
  local mesh = fsdp.mesh("dp_shard=-1")
  local s = fsdp.fully_shard(F.mlp(), { shard = mesh:group("dp_shard"), units = { "Linear" }, zero = 3, seed = 7 })
  ckpt.save(s, dir, { step = 1, optimizer = "adamw" })
  if R == 0 then os.execute("ln -s /dev/full '" .. dir .. "/latest.tmp'") end
  local t0 = C.fsdp_time_now()
  local ok, err = pcall(ckpt.save, s, dir, { step = 2, optimizer = "adamw" })
  print(string.format("RESULT rank %d ok %s after %.1f s: %s", R, tostring(ok), C.fsdp_time_now() - t0, tostring(err)))
  io.stdout:flush()
  mesh:group("world"):barrier()
  s:free()
  mesh:free()
  return
end

local fsdprun, root = arg[1], arg[2] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_resume_faults")
local check = T.check
local work = T.workdir("resume-faults")

-- 1. ENOSPC on `latest`: both ranks fail within seconds (the comm timeout is 20 s)
do
  local ok, out = T.launch(fsdprun, 2, { arg[0], "job", work .. "/full" }, "FSDP_COMM_TIMEOUT=20")
  check(ok, "the job goes on after the failed save:\n" .. out)
  for r = 0, 1 do
    local secs, msg = out:match("RESULT rank " .. r .. " ok false after ([%d.]+) s: ([^\n]*)")
    local says = r == 0 and { work .. "/full/latest", "No space left on device" } or { "rank 0 failed", "whole" }
    check(secs and tonumber(secs) < 5 and msg:find(says[1], 1, true) and msg:find(says[2], 1, true),
      "rank " .. r .. " fails at once, saying " .. table.concat(says, " / ") .. ":\n" .. out)
  end
  check(ckpt.read_text(work .. "/full/latest") == "step-00000001\n", "latest still names the previous checkpoint")
  local okm = pcall(ckpt.meta, work .. "/full/step-00000001")
  check(okm, "the previous checkpoint still opens")
end

-- the tiny recipe on 2 ranks, small and fast
local common = { root .. "/recipes/tiny.lua", "data.seq=32", "data.micro_batch=2", "train.eval_every=0", "train.log_every=1" }
local function train(extra) return T.launch(fsdprun, 2, T.joined(common, extra)) end
local losses = T.losses

-- 2. `latest` names a checkpoint that is gone, and there is no other
do
  local dir = work .. "/gone"
  local ok, out = train({ "train.steps=2", "checkpoint.dir=" .. dir, "train.metrics=" .. work .. "/gone.jsonl" })
  check(ok, "the first run:\n" .. out)
  os.execute("rm -rf '" .. dir .. "/step-00000002'")
  ok, out = train({ "train.steps=4", "train.resume=auto", "checkpoint.dir=" .. dir, "train.metrics=" .. work .. "/gone.jsonl" })
  local want = { "train.resume=auto: " .. dir .. "/latest names step-00000002, which does not exist",
    "restore " .. dir .. "/step-00000002", "train.resume=PATH", "another checkpoint.dir" }
  local missing = {}
  for _, s in ipairs(want) do if not out:find(s, 1, true) then missing[#missing + 1] = s end end
  check(not ok and #missing == 0 and not out:find("step 1/", 1, true),
    "resume=auto refuses, saying " .. table.concat(missing, " / ") .. ":\n" .. out)
end

-- 3. the newest checkpoint's data is damaged: back to the one before
do
  local ok, out = train({ "train.steps=6", "train.metrics=" .. work .. "/ref.jsonl" })
  check(ok, "the uninterrupted run:\n" .. out)
  local dir = work .. "/crc"
  ok, out = train({ "train.steps=6", "train.stop_after=4", "checkpoint.every=2", "checkpoint.dir=" .. dir,
    "train.metrics=" .. work .. "/crc.jsonl" })
  check(ok, "the run that saves steps 2 and 4:\n" .. out)
  local f = assert(io.open(dir .. "/step-00000004/rank-00001.bin", "r+b"))
  f:seek("set", 1000)
  local b = f:read(1)
  f:seek("set", 1000)
  f:write(string.char((b:byte() + 1) % 256))
  f:close()
  ok, out = train({ "train.steps=6", "train.resume=" .. dir .. "/step-00000004", "checkpoint.dir=" .. dir })
  check(not ok and out:find("checksum mismatch in 'rank-00001.bin' bytes", 1, true), "an explicit resume is refused:\n" .. out)
  ok, out = train({ "train.steps=6", "train.resume=auto", "checkpoint.every=2", "checkpoint.dir=" .. dir,
    "train.metrics=" .. work .. "/crc.jsonl" })
  check(ok and out:find("checksum mismatch in 'rank-00001.bin' bytes", 1, true) and
    out:find("resume: skipped " .. dir .. "/step-00000004", 1, true) and
    out:find("resumed from " .. dir .. "/step-00000002", 1, true), "resume=auto falls back to step 2:\n" .. out)
  local ref, got = losses(work .. "/ref.jsonl"), losses(work .. "/crc.jsonl")
  for step = 1, 6 do
    check(ref[step] and got[step] == ref[step], string.format("step %d: loss %s, uninterrupted %s", step, tostring(got[step]),
      tostring(ref[step])))
  end
  check(ckpt.latest_name(dir) == "step-00000006", "the run went on saving: latest is step 6")
end

T.finish()
