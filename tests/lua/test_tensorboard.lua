-- test_tensorboard.lua: train.tensorboard (lua/fsdp/tensorboard.lua, issue
-- 48) read back by the real `tensorboard` package (test_tensorboard.py):
--   fsdp tests/lua/test_tensorboard.lua FSDPRUN ROOT
--   * the bytes: CRC-32C's check value; events with multi-byte varints
--     written by us equal TensorBoard's protobuf classes and RecordWriter
--     byte for byte; nan, inf, -inf read back as such; our reader of
--     records stops at a cut or corrupted one;
--   * refusals and failures: a directory that cannot be made (fresh run:
--     refused naming the field; resumed: goes on), a full disk (warned once
--     by the caller), a train.tensorboard that is not a string;
--   * a 6-step run on 2 ranks (evaluations at 3 and 6): one event file
--     (rank 0's; an earlier run's file removed), every scalar of the JSONL
--     metrics under its tag at its step, equal to float32 rounding;
--   * a run killed after step 5 (checkpoint at 4, its file's tail then cut
--     mid-record) resumed to step 8: each step once, equal to the JSONL.
-- Skipped (77) without a Python that has tensorboard: FSDP_TEST_PYTHON,
-- else the project's environment (scripts/python_env.sh).
local fsdp = require "fsdp"
local tb = require "fsdp.tensorboard"
local recipe = require "fsdp.recipe"
local C = fsdp.C

local fsdprun, root = arg[1], arg[2] or "."
local here = arg[0]:match("^(.*/)") or "./"
local T = dofile(here .. "testkit.lua")("test_tensorboard")
local check, fails = T.check, T.fails

local function sh(cmd) return os.execute(cmd) == 0 end
local function has_tensorboard(py) return py and py ~= "" and sh(string.format("'%s' -c 'import tensorboard' 2>/dev/null", py)) end
local py = os.getenv("FSDP_TEST_PYTHON")
if not has_tensorboard(py) then
  local p = io.popen(string.format("bash '%s/scripts/python_env.sh' 2>/dev/null", root))
  py = p:read("*l")
  p:close()
end
if not has_tensorboard(py) then
  print("skipped: no Python with tensorboard (FSDP_TEST_PYTHON, scripts/python_env.sh)")
  os.exit(77)
end
local function python(...)
  local p = io.popen(string.format("'%s' '%stest_tensorboard.py' '%s' 2>&1; echo \"EXIT=$?\"", py, here,
    table.concat({ ... }, "' '")))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("EXIT=(%d+)%s*$")) == 0, out
end

local work = T.workdir("tensorboard")
local read, write = T.read, T.write
local function event_files(dir)
  local p = io.popen(string.format("ls '%s' | grep tfevents", dir))
  local names = {}
  for l in p:lines() do names[#names + 1] = dir .. "/" .. l end
  p:close()
  return names
end

-- ---- the bytes
do
  check(C.fsdp_crc32c(0, "123456789", 9) == 0xE3069283, "CRC-32C check value")
  -- {wall_time, step, file_version or "-", tag, value, ...}: varints of 1 to 6 bytes (a step of 2^40, a
  -- 200-byte tag), negative, tiny and huge floats (both sides round the doubles to float32)
  local cases = {
    { 1700000000.25, 0, "brain.Event:2" },
    { 1700000001.5, 1, "-", "train/loss", 2.5, "train/lr", 0.0003 },
    { 1700000002.125, 300, "-", string.rep("t", 200), -1.25, "val/loss", 1e-30 },
    { 1700000003, 2 ^ 40, "-", "memory/peak_bytes", 3.4e38 },
  }
  local bin, lines = {}, {}
  for i, c in ipairs(cases) do
    local values = {}
    for k = 4, #c, 2 do values[#values + 1] = { c[k], c[k + 1] } end
    bin[i] = tb.frame(tb.event(c[1], c[2], values, c[3] ~= "-" and c[3] or nil))
    local parts = { string.format("%.17g %.0f %s", c[1], c[2], c[3]) }
    for _, v in ipairs(values) do parts[#parts + 1] = string.format("%s %.17g", v[1], v[2]) end
    lines[i] = table.concat(parts, " ")
  end
  write(work .. "/unit.cases", table.concat(lines, "\n") .. "\n")
  write(work .. "/unit.bin", table.concat(bin))

  -- a writer's record with nan, inf, -inf (and a field that is no scalar)
  local w = tb.open(work .. "/nonfinite", { where = "nf.lua" })
  check(w:record({ step = 7, loss = 0 / 0, grad_norm = math.huge, lr = -math.huge, val_loss = 1.5, skipped = true }),
    "a record with non-finite numbers is written")
  w:close()
  local ok, out = python("unit", work .. "/unit.cases", work .. "/unit.bin", work .. "/nonfinite")
  check(ok, "TensorBoard's own bytes, and non-finite values read back:\n" .. out)

  -- our reader: every record, then nothing past a cut or a flipped byte
  local text = table.concat(bin)
  local recs, tail = tb.records(text)
  check(#recs == 4 and not tail and recs[4].step == 2 ^ 40 and recs[3].step == 300, "records read back with their steps")
  recs, tail = tb.records(text:sub(1, -2))
  check(#recs == 3 and tail, "a record cut by one byte is not read")
  local at = #bin[1] + 20 -- inside the second record's data
  recs, tail = tb.records(text:sub(1, at - 1) .. string.char((text:byte(at) + 1) % 256) .. text:sub(at + 1))
  check(#recs == 1 and tail, "a record failing its CRC ends the file")
end

-- ---- refusals and failures
do
  write(work .. "/plain", "a file, not a directory\n")
  fails(function() tb.open(work .. "/plain/tb", { where = "r.lua" }) end, "r.lua: train.tensorboard: cannot create the directory",
    "a fresh run whose directory cannot be made")
  local w = tb.open(work .. "/plain/tb", { where = "r.lua", resumed_at = 4 })
  check(w.failed and w.failed:find(work .. "/plain", 1, true) and not w:record({ step = 5, loss = 1 }),
    "a resumed run goes on without events: " .. tostring(w.failed))
  w = tb.open(work .. "/full", {})
  w.f:close()
  w.f = assert(io.open("/dev/full", "wb"))
  check(not w:record({ step = 1, loss = 1 }) and w.failed == "No space left on device", "a full disk: " .. tostring(w.failed))
  check(not w:record({ step = 2, loss = 1 }), "nothing written after a failure")
  w:close()
  fails(function() recipe.check(recipe.apply_overrides(dofile(root .. "/recipes/tiny.lua"), { "train.tensorboard=5" }, "r.lua"),
    "r.lua") end, "r.lua: train.tensorboard = 5", "train.tensorboard that is not a string")
end

local quick = { "--oversubscribe", root .. "/recipes/tiny.lua", "data.seq=32", "data.micro_batch=2",
  "model.num_hidden_layers=1", "train.sample_tokens=0", "train.log_every=100", "train.eval_every=3",
  "train.eval_batches=1", "train.peak_tflops=1" } -- (a peak: every step has an MFU)

-- ---- a run on 2 ranks, read back
do
  local dir, m = work .. "/run/a/tb", work .. "/run/m.jsonl"
  os.execute(string.format("mkdir -p '%s'", dir))
  write(dir .. "/events.out.tfevents.1.earlier", "an earlier run's events")
  local ok, out = T.launch(fsdprun, 2, T.joined(quick, { "train.steps=6", "train.metrics=" .. m, "train.tensorboard=" .. dir }))
  check(ok, "the run: " .. out)
  check(#event_files(dir) == 1, "one event file, the earlier run's removed")
  local same
  same, out = python("compare", dir, m)
  check(same and out:find("compare .*: 11 tags, 62 scalars"), "every scalar of the metrics, read by TensorBoard:\n" .. out)
end

-- ---- a killed run resumed: each step once
do
  local dir, m, ck = work .. "/res/tb", work .. "/res/m.jsonl", work .. "/res/ck"
  local a = T.joined(quick, { "train.steps=8", "checkpoint.dir=" .. ck, "checkpoint.every=4", "checkpoint.async=false",
    "train.metrics=" .. m, "train.tensorboard=" .. dir })
  local ok, out = T.launch(fsdprun, 2, a, "FSDP_TEST_KILL_AT=0:0:6")
  check(not ok, "rank 0 killed at step 6")
  local same
  same, out = python("compare", dir, m)
  check(same and out:find("11 tags, 51 scalars", 1, true), "the killed run's steps 1-5, read back:\n" .. out)
  local files = event_files(dir)
  if files[1] then -- killed mid-write: half of a record after the last
    local last = tb.records(read(files[1]))
    write(files[1], last[#last].bytes:sub(1, 20), "ab")
  end
  ok, out = T.launch(fsdprun, 2, T.joined(a, { "train.resume=auto" }))
  check(ok, "the resumed run: " .. out)
  check(out:find("tensorboard: " .. dir:gsub("%p", "%%%0") .. "/events.out.tfevents.%d+.[^ ]* continues after step 4 %(2 events of steps " ..
    "after the checkpoint dropped%)"), "the resume says what it dropped: " .. out)
  same, out = python("compare", dir, m)
  check(same and out:find("11 tags, 83 scalars", 1, true), "steps 1-8 once each, the metrics' values:\n" .. out)
end

os.execute(string.format("rm -rf '%s'", work))
T.finish()
