-- test_run_records.lua (fsdprun -n W): the run's own records and the values
-- that would make a run meaningless (issue 18): the metrics file kept as one
-- history across a resume, a full disk, non-finite numbers in JSON a strict
-- reader accepts, a diverged run stopped, absurd sizes refused by
-- arithmetic before the planner runs, nested recipe tables checked.
--   fsdprun -n 2 tests/lua/test_run_records.lua ROOT
local fsdp = require "fsdp"
local recipe = require "fsdp.recipe"
local metrics = require "fsdp.metrics"
local train = require "fsdp.train"

local info = fsdp.init()
local W, R = info.size, info.rank
local root = arg[1] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_run_records rank %d/%d", R, W))
local check, fails = T.check, T.fails

local function tiny() return dofile(root .. "/recipes/tiny.lua") end
local quick = { "train.eval_every=0", "data.seq=32", "data.micro_batch=2", "model.num_hidden_layers=1", "train.log_every=100" }
local function args(extra) return T.joined(quick, extra) end
local function lines(path)
  local out = {}
  local f = io.open(path, "rb")
  if not f then return out end
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end
-- python3's json (strict: no bare inf/nan) accepts every line; nil without python3
local function python_accepts(path)
  if os.execute("command -v python3 >/dev/null 2>&1") ~= 0 then return nil end
  return os.execute(string.format("python3 -c \"import json,sys\n" ..
    "for l in open(sys.argv[1]): json.loads(l, parse_constant=lambda c: sys.exit('bare ' + c))\" '%s'", path)) == 0
end

-- one scratch directory for the job: the PMIx namespace is the same on every rank
local world_mesh = fsdp.mesh("dp_shard=-1")
local world = world_mesh:group("world")
local dir = string.format("%s/fsdp-run-records-%s", os.getenv("TMPDIR") or "/tmp",
  (os.getenv("PMIX_NAMESPACE") or "single"):gsub("[^%w%-_.]", "_"))
if R == 0 then os.execute("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "'") end
world:barrier()

-- the encoding: non-finite numbers are null plus a "nonfinite" note; "step" first
do
  local line = metrics.encode({ loss = 0 / 0, step = 3, grad_norm = math.huge, lr = -math.huge, tokens = 4096, name = 'a"b' })
  check(line == '{"step":3,"grad_norm":null,"loss":null,"lr":null,"name":"a\\u0022b","tokens":4096,' ..
    '"nonfinite":{"grad_norm":"inf","loss":"nan","lr":"-inf"}}', "metrics.encode: " .. line)
  check(metrics.encode({ step = 1, loss = 2.5 }) == '{"step":1,"loss":2.5}', "metrics.encode of finite numbers")
end

-- nested recipe tables and ranges, refused before anything is allocated
do
  local function bad(over, needle)
    fails(function() recipe.check(recipe.apply_overrides(tiny(), over, "r.lua"), "r.lua") end, needle, table.concat(over, " "))
  end
  bad({ "data.corpus.inclde=x" }, "r.lua: data.corpus.inclde: unknown field (did you mean 'include'?) (data.corpus has: include, root, val_fraction)")
  bad({ "optimizer.lr=inf" }, "optimizer.lr = inf; expected a finite number")
  bad({ "optimizer.lr=nan" }, "optimizer.lr = nan; expected a finite number")
  bad({ "schedule.min_lr_ratio=-5" }, "schedule.min_lr_ratio = -5; expected [0, 1]")
  bad({ "train.eval_batches=0" }, "train.eval_batches = 0; expected >= 1")
  bad({ "train.min_free_fraction=1.5" }, "train.min_free_fraction = 1.5; expected (0, 1]")
  bad({ "train.min_free_fraction=0" }, "train.min_free_fraction = 0; expected (0, 1]")
  bad({ "optimizer.beta2=1" }, "optimizer.beta2 = 1; expected [0, 1)")
  bad({ "optimizer.eps=0" }, "optimizer.eps = 0; expected (0, inf]")
  bad({ "train.max_bad_steps=0" }, "train.max_bad_steps = 0; expected >= 1")
  local r = tiny()
  r.data.corpus.include = { "docs/*.md", 3 }
  fails(function() recipe.check(r, "r.lua") end, "data.corpus.include[2] = 3; expected a file pattern", "corpus include entry")
  r = tiny()
  r.data.corpus.include = {}
  fails(function() recipe.check(r, "r.lua") end, "data.corpus.include: expected a non-empty list", "empty include")
end

-- absurd sizes: refused from arithmetic, at once (the planner would run
-- every layer first: about 65 KB and 0.65 ms each)
do
  local t0 = fsdp.C.fsdp_time_now()
  fails(function() train.run(tiny(), "deep.lua", args({ "model.num_hidden_layers=1000000" })) end,
    "deep.lua: the model has 184.58G parameters: its fp32 weights and adamw state alone need", "a million layers")
  check(fsdp.C.fsdp_time_now() - t0 < 5, "refused in under 5 s")
  local planner = require "fsdp.planner"
  fails(function() planner.plan(recipe.apply_overrides(tiny(), { "model.num_hidden_layers=1000000" }, "deep.lua"),
    { world = 512, where = "deep.lua" }) end, "deep.lua: model.num_hidden_layers = 1000000; at most 4096 are planned",
    "fsdp plan of a million layers")
end

-- a diverged run stops: every step after the first is skipped (lr 1e30
-- makes the weights non-finite), and train.max_bad_steps in a row end it,
-- naming the steps and what went non-finite
do
  local m = dir .. "/diverged.jsonl"
  fails(function()
    train.run(tiny(), "lr.lua", args({ "optimizer.lr=1e30", "schedule.warmup=0", "train.steps=20", "train.max_bad_steps=3",
      "train.metrics=" .. m }))
  end, "lr.lua: steps 2 to 4 were all skipped (step 4: non-finite gradients in units", "diverged run stopped")
  if R == 0 then
    local l = lines(m)
    check(#l == 4, "4 records before the stop, got " .. #l)
    check(l[2] and l[2]:find('"skipped":true', 1, true) and l[2]:find('"nonfinite":{"grad_norm":"inf","loss":"nan"}', 1, true),
      "a skipped step's record: " .. tostring(l[2]))
    local ok = python_accepts(m)
    if ok ~= nil then check(ok, "python's json reads every line of " .. m) end
  end
end

-- a non-finite loss with finite gradients skips the step on every rank
-- (the loss is summed over ranks: rank 0's NaN reaches all): the weights
-- stay as they were, so the next step's loss equals a fresh model's first
do
  local F = dofile((arg[0]:match("^(.*/)") or "./") .. "mlp_fixture.lua")(fsdp)
  local shard = world
  local function model() return fsdp.fully_shard(F.mlp(), { shard = shard, units = { "Linear" }, zero = 3, seed = 7 }) end
  local opt = { lr = 1e-2 }
  local nan_loss = { lr = 1e-2, loss = function(y, b, scale)
    local loss, dy = fsdp.nn.mse(y, b.y, scale)
    return R == 0 and 0 / 0 or loss, dy
  end }
  local a, b = model(), model()
  local l0, n0, warn = a:train_step({ F.batch(R, 1, 1) }, nan_loss)
  check(l0 ~= l0 and warn and warn:find("the loss is nan; step skipped", 1, true), "NaN loss skipped: " .. tostring(warn))
  check(a.skipped == 1 and a.step_count == 0, "counted as skipped, no optimizer step")
  local la = a:train_step({ F.batch(R, 1, 2) }, opt)
  local lb = b:train_step({ F.batch(R, 1, 2) }, opt)
  check(la == lb, string.format("weights untouched by the skipped step: loss %.17g == %.17g", la, lb))
  a:free(); b:free()
end

-- a resume continues the metrics file: the records up to the checkpoint's
-- step stay byte for byte, those after it (the killed run's, and a record
-- cut in the middle) go, and the resumed steps follow
do
  local ck, m = dir .. "/ck", dir .. "/resume.jsonl"
  local common = { "checkpoint.dir=" .. ck, "checkpoint.async=false", "train.metrics=" .. m, "train.steps=6" }
  local a = args(common)
  a[#a + 1] = "train.stop_after=3"
  train.run(tiny(), "res.lua", a)
  local before = lines(m)
  if R == 0 then -- the killed run got further than its checkpoint, and was cut mid-record
    local f = io.open(m, "ab")
    f:write('{"step":4,"loss":1.5}\n{"step":5,"lo')
    f:close()
  end
  world:barrier()
  a = args(common)
  a[#a + 1] = "train.resume=auto"
  local out = train.run(tiny(), "res.lua", a)
  if R == 0 then
    local after = lines(m)
    check(#before == 3 and #after == 6, string.format("3 records, then 6 after the resume (got %d, %d)", #before, #after))
    for i = 1, 3 do check(after[i] == before[i], "record " .. i .. " kept byte for byte") end
    for i = 4, 6 do
      local s = after[i] and tonumber(after[i]:match('^{"step":(%d+),'))
      check(s == i, "record " .. i .. " is step " .. i .. ": " .. tostring(after[i]))
    end
    check(after[4] and not after[4]:find('"loss":1.5,', 1, true), "the killed run's step 4 was dropped")
    check(out.losses[6] ~= nil, "the resumed run trained step 6")
  end
end

-- a full disk: the run goes on, says once that metrics are not written
-- (and on the step lines), returns normally
do
  local said, warned = {}, {}
  local print0, stderr0 = print, io.stderr
  print = function(...) said[#said + 1] = table.concat({ ... }, " ") end
  io.stderr = { write = function(_, ...) warned[#warned + 1] = table.concat({ ... }) end }
  local ok, out = pcall(train.run, tiny(), "full.lua", args({ "train.steps=3", "train.log_every=1", "train.metrics=/dev/full" }))
  print, io.stderr = print0, stderr0
  check(ok, "a full metrics disk is not fatal: " .. tostring(not ok and out))
  if R == 0 then
    check(ok and out.metrics_failed == "No space left on device", "the reason: " .. tostring(ok and out.metrics_failed))
    local text = table.concat(warned, "")
    local _, n = text:gsub("writing /dev/full failed %(No space left on device%)", "")
    check(n == 1, "warned once: " .. text)
    text = table.concat(said, "\n")
    check(text:find("step 3/3 |", 1, true) and text:find("| metrics NOT written", 1, true), "the step lines say so: " .. text)
  end
end

-- a full disk under the checkpoints (rank 0's `latest` is re-pointed
-- through latest.tmp, here a link to /dev/full): the run stops, naming the
-- recipe, the checkpoint and the cause once ("checkpoint: " not doubled)
do
  local ck = dir .. "/full-ck"
  if R == 0 then os.execute(string.format("mkdir -p '%s' && ln -s /dev/full '%s/latest.tmp'", ck, ck)) end
  world:barrier()
  local ok, e = pcall(train.run, tiny(), "fullck.lua", args({ "train.steps=2", "checkpoint.every=1", "checkpoint.dir=" .. ck }))
  e = tostring(e)
  check(not ok and e:find("fullck.lua: checkpoint: saving " .. ck .. "/step-00000001", 1, true), "a full disk stops the run: " .. e)
  check(not e:find("checkpoint: checkpoint:", 1, true), "the field is named once: " .. e)
  if R == 0 then check(e:find("No space left on device", 1, true), "rank 0 says why: " .. e) end
end

if R == 0 then os.execute("rm -rf '" .. dir .. "'") end
world_mesh:free()
jit.flush() -- compiled traces hold constants (the last plans) alive
collectgarbage(); collectgarbage() -- their finalizers, before os.exit (the sanitizer build counts leaks)
T.finish()
