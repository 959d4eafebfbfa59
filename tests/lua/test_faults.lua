-- test_faults.lua: injected faults that once made a run crash or train on
-- silently wrong input are refused up front, naming what is wrong (issue 19).
--   fsdp tests/lua/test_faults.lua FSDPRUN ROOT
-- Builds the faulty inputs in this process (one rank), runs the tiny
-- recipe on them through fsdprun (2 ranks) and checks each run's exit and
-- message against the fault it was given:
--   * non-finite weights (payload NaNs, an infinity) in checkpoint.init_hf
--     files and in a checkpoint to resume: refused at load, naming the first
--     bad tensor and element in model order, the same on every rank
--   * a token id >= model.vocab_size in a token file: refused at open,
--     naming the file and the id's offset
--   * a resume in another data geometry (data.seq, micro-batch): mapped
--     exactly (whole epochs, or the same windows) or refused naming both
--   * a branch from an older checkpoint, or a new run, saving among another
--     history's checkpoints: refused naming checkpoint.dir
--   * ranks that never reach fsdp.init: the fence that times out names them
local fsdp = require "fsdp"
local ckpt = require "fsdp.checkpoint"
local hf = require "fsdp.hf"
local llama = require "fsdp.models.llama"
local ffi, C = fsdp.ffi, fsdp.C

local fsdprun, root = arg[1], arg[2] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_faults")
local check, fails = T.check, T.fails

local work = T.workdir("faults")

-- raw uint16 tokens: a fixed byte pattern (vocabulary 256), bad ids put in by the caller
local function token_file(path, n, bad)
  local t = ffi.new("uint16_t[?]", n)
  for i = 0, n - 1 do t[i] = (i * 7 + math.floor(i / 13)) % 251 end
  for at, id in pairs(bad or {}) do t[at] = id end
  local f = assert(io.open(path, "wb"))
  f:write(ffi.string(t, 2 * n))
  f:close()
end
local tokens = work .. "/tokens.u16"
token_file(tokens, 65536)

-- fsdprun -n N tiny.lua on the fixed tokens; returns ok, output
local common = { "data.token_file=" .. tokens, "data.format=raw_u16", "train.eval_every=0", "train.log_every=1",
  "data.seq=32", "data.micro_batch=2", "train.steps=3", "train.metrics=" .. work .. "/m.jsonl" }
local function run(n, extra) return T.launch(fsdprun, n, T.joined({ root .. "/recipes/tiny.lua" }, common, extra)) end
local function refused(what, ok, out, needles)
  local missing = {}
  for _, s in ipairs(needles) do if not out:find(s, 1, true) then missing[#missing + 1] = s end end
  check(not ok and #missing == 0 and not out:find("step 1/", 1, true),
    string.format("%s: refused before step 1, saying %s:\n%s", what, table.concat(missing, " / "), out))
end

-- the tiny recipe's model, here on one rank
fsdp.init()
local recipe = dofile(root .. "/recipes/tiny.lua")
local cfg = llama.config(recipe.model)
local function model()
  return fsdp.fully_shard(llama.model(cfg), { shard = fsdp.mesh("dp_shard=-1"):group("dp_shard"), units = llama.units,
    zero = 3, seed = 1234 })
end
-- element i of parameter name := the float with these bits (through the main params)
local function poke(s, name, i, bits)
  for _, u in ipairs(s.units) do
    for _, pc in ipairs(ckpt.pieces(u, 0)) do
      if pc.name == name and i >= pc.begin and i < pc["end"] then
        local v = ffi.new("uint32_t[1]", bits)
        fsdp.check(C.fsdp_unit_state_set(u.handle, C.FSDP_STATE_PARAM, pc.off + i - pc.begin, 1, ffi.cast("float *", v)), "poke")
        fsdp.check(C.fsdp_unit_state_publish(u.handle), "poke")
        return
      end
    end
  end
  error("poke: no element " .. i .. " of " .. name)
end
local params, same_params = T.params, T.same_params

-- 1. non-finite weights. Model order: q_proj of layer 0 comes before
-- up_proj of layer 2, so the infinity in the former is the first, whichever
-- rank holds it. The payload NaN is the issue's crash: widened to double
-- it is LuaJIT's table tag.
do
  local s = model()
  poke(s, "model.layers.2.mlp.up_proj.weight", 5, 0xffd00123)
  poke(s, "model.layers.0.self_attn.q_proj.weight", 1000, 0x7f800000)
  poke(s, "model.layers.0.self_attn.q_proj.weight", 4000, 0xffd00000)
  hf.export(s, cfg, work .. "/hf-bad", { dtype = "bf16" })
  ckpt.save(s, work .. "/ck-bad", { step = 2, optimizer = "adamw", meta = { step = 2, optimizer_step = 2, consumed = 8,
    seed = 1234 } })
  s:free()
  local want = { "tensor 'model.layers.0.self_attn.q_proj.weight' (param) holds inf at element 1000 ([7, 104] of 128x128)" }
  for _, n in ipairs({ 1, 2 }) do
    local ok, out = run(n, { "checkpoint.init_hf=" .. work .. "/hf-bad" })
    refused(n .. " ranks, init_hf from bf16 files with NaNs and an infinity", ok, out, { "checkpoint.init_hf", want[1] })
    ok, out = run(n, { "train.resume=" .. work .. "/ck-bad/step-00000002" })
    refused(n .. " ranks, resuming a checkpoint with NaNs and an infinity", ok, out, { "train.resume", want[1] })
  end
  -- in this process: refused, and the model left as it was
  local t = model()
  local before = params(t)
  fails(function() hf.import(t, cfg, work .. "/hf-bad") end, want[1], "hf.import refuses")
  fails(function() ckpt.load(t, work .. "/ck-bad/step-00000002", { optimizer = "adamw" }) end, want[1], "ckpt.load refuses")
  check(same_params(before, params(t)), "a refused load changes nothing")
  t:free()
end

-- 2. a token id >= vocab_size (256) near the end of the training split: found
-- when the file is opened, not when (or if) a batch reaches it
do
  local bad = work .. "/bad.u16"
  token_file(bad, 65536, { [60000] = 300, [61000] = 999 })
  local ok, out = run(2, { "data.token_file=" .. bad })
  refused("a token id above the vocabulary", ok, out,
    { "data.token_file", bad, "token 60000 (byte offset 120000) is id 300, outside the vocabulary of 256 ids" })
  local val = work .. "/badval.u16"
  token_file(val, 4096, { [17] = 256 })
  ok, out = run(1, { "data.val_token_file=" .. val })
  refused("a token id above the vocabulary in the validation file", ok, out,
    { "data.val_token_file", val, "token 17 (byte offset 34) is id 256" })
  ok, out = run(2, {})
  check(ok, "the good file trains:\n" .. out)
end

-- 3. the data geometry: recorded, and a resume in another one maps the
-- position exactly or is refused naming both values
local data = require "fsdp.data"
do -- the mapping itself, against positions worked out by hand
  local now = { seq = 64, micro_batch = 2, windows = 14 }
  local at, note = data.resume_position({ consumed = 56, seq = 32, micro_batch = 2, windows = 28 }, now, "ck/x")
  check(at == 28 and note:find("2 whole epochs", 1, true) and note:find("start of epoch 2", 1, true), "seq 32 -> 64 after 2 epochs: " .. tostring(note))
  fails(function() data.resume_position({ consumed = 57, seq = 32, micro_batch = 2, windows = 28 }, now, "ck/x") end,
    "ck/x was trained with data.seq = 32 and this run has data.seq = 64: its data position (57 windows of 32 tokens, 1 into epoch 2 of 28 windows)",
    "seq 32 -> 64 mid-epoch")
  at, note = data.resume_position({ consumed = 57, seq = 64, micro_batch = 4, windows = 14 }, now, "ck/x")
  check(at == 57 and note:find("data.micro_batch 4 -> 2", 1, true), "another micro-batch: the same windows: " .. tostring(note))
  at, note = data.resume_position({ consumed = 57, seq = 64, micro_batch = 2, windows = 14 }, now, "ck/x")
  check(at == 57 and note == nil, "the same geometry")
  at, note = data.resume_position({ consumed = 9 }, now, "ck/old")
  check(at == 9 and note:find("ck/old records no data geometry", 1, true), "a checkpoint without the record: " .. tostring(note))
end
local losses = T.losses
-- end to end on a file whose training split is 28 windows of 32 tokens (896
-- + 1 tokens; the tiny recipe validates on the last 5%: 944 in all), so that
-- step 7 (2 ranks x 2 windows a step) ends epoch 0
local small = work .. "/small.u16"
token_file(small, 944)
do
  local base = { "data.token_file=" .. small, "train.steps=10" }
  local function with(list, more)
    local out = {}
    for _, a in ipairs(list) do out[#out + 1] = a end
    for _, a in ipairs(more) do out[#out + 1] = a end
    return out
  end
  local ckG = work .. "/ckG"
  local ok, out = run(2, with(base, { "checkpoint.dir=" .. ckG, "train.stop_after=9", "checkpoint.every=3" }))
  check(ok, "a run saving at steps 3, 6, 9:\n" .. out)
  local idx = ckpt.read_text(ckG .. "/step-00000006/index.json") or ""
  check(idx:find('"seq":32', 1, true) and idx:find('"micro_batch":2', 1, true) and idx:find('"windows":28', 1, true)
    and idx:find('"consumed":24', 1, true), "the checkpoint records the data geometry: " .. idx:sub(1, 300))
  -- another seq at the same micro-batch would double the global batch
  -- (2 x 32 x 1 x 2 = 128 tokens a step): refused, naming the micro-batch
  -- that keeps it; the cases below halve it
  ok, out = run(2, with(base, { "train.resume=" .. ckG .. "/step-00000006", "data.seq=64" }))
  refused("resuming with another data.seq and the same micro-batch", ok, out,
    { "train.grad_accum: " .. ckG .. "/step-00000006 was trained with a global batch of 128 tokens per step",
      "2 x 64 x 2 = 256 tokens, which does not divide 128", "or on 2 with data.micro_batch = 1." })
  check(out:find("EXIT=78", 1, true), "... with status 78:\n" .. out)
  local half = "data.micro_batch=1"
  -- mid-epoch, another seq: refused before any weight is read
  ok, out = run(2, with(base, { "train.resume=" .. ckG .. "/step-00000006", "data.seq=64", half }))
  refused("resuming mid-epoch with another data.seq", ok, out,
    { "train.resume", "was trained with data.seq = 32 and this run has data.seq = 64", "24 windows of 32 tokens" })
  -- at the end of an epoch, another seq: goes on at the start of the next
  -- epoch, exactly as a checkpoint written in that geometry would
  local ckH = work .. "/ckH"
  ok, out = run(2, with(base, { "checkpoint.dir=" .. ckH, "train.stop_after=7", "checkpoint.every=7" }))
  check(ok, "a run ending epoch 0 at step 7:\n" .. out)
  local native = work .. "/native"
  os.execute(string.format("rm -rf '%s' && cp -r '%s/step-00000007' '%s'", native, ckH, native))
  local text = ckpt.read_text(native .. "/index.json")
  local n1, n2, n3
  text, n1 = text:gsub('"seq":32', '"seq":64')
  text, n2 = text:gsub('"windows":28', '"windows":14')
  text, n3 = text:gsub('"consumed":28', '"consumed":14')
  check(n1 == 1 and n2 == 1 and n3 == 1, "rewrote the geometry of a copy")
  C.fsdp_fs_write_atomic(native .. "/index.json", text, #text)
  local sum = string.format("crc32c %08x bytes %d\n", C.fsdp_crc32c(0, text, #text), #text)
  C.fsdp_fs_write_atomic(native .. "/index.sum", sum, #sum)
  ok, out = run(2, with(base, { "train.resume=" .. ckH .. "/step-00000007", "data.seq=64", half,
    "train.metrics=" .. work .. "/mapped.jsonl" }))
  check(ok and out:find("holds 1 whole epoch of the data (28 windows of 32 tokens); this run goes on at the start of epoch 1 " ..
    "(14 windows of 64 tokens each)", 1, true), "resuming at an epoch's end with another data.seq:\n" .. out)
  local ok2, out2 = run(2, with(base, { "train.resume=" .. native, "data.seq=64", half,
    "train.metrics=" .. work .. "/native.jsonl" }))
  check(ok2, "the same checkpoint saved in the new geometry:\n" .. out2)
  local a, b = losses(work .. "/mapped.jsonl"), losses(work .. "/native.jsonl")
  check(a[8] and a[8] == b[8] and a[9] == b[9] and a[10] == b[10], string.format("and trains the same steps 8-10 bit for bit: " ..
    "%s %s %s vs %s %s %s", tostring(a[8]), tostring(a[9]), tostring(a[10]), tostring(b[8]), tostring(b[9]), tostring(b[10])))
  -- another micro-batch (the same global batch: 2 micro-batches of 1):
  -- the same windows, the straight run's losses up to fp32 summation order
  local gb = { "train.global_batch_tokens=128" }
  ok, out = run(2, with(base, with(gb, { "train.metrics=" .. work .. "/straight.jsonl" })))
  check(ok, "the straight run:\n" .. out)
  ok, out = run(2, with(base, with(gb, { "train.resume=" .. ckG .. "/step-00000006", "data.micro_batch=1",
    "train.metrics=" .. work .. "/mb1.jsonl" })))
  check(ok and out:find("data.micro_batch 2 -> 1: the data goes on at window 24, as it would have", 1, true),
    "resuming with another micro-batch:\n" .. out)
  local x, y, worst = losses(work .. "/straight.jsonl"), losses(work .. "/mb1.jsonl"), 0
  for st = 7, 10 do worst = math.max(worst, (x[st] and y[st]) and math.abs(tonumber(x[st]) - tonumber(y[st])) or math.huge) end
  check(worst <= 1e-5, string.format("micro-batch 2 -> 1 follows the straight run: worst |loss diff| %.3g (tolerance 1e-5)", worst))
  print(string.format("test_faults: micro-batch 2 -> 1 on resume: worst |loss diff| %.3g (tolerance 1e-5)", worst))
  -- a checkpoint saved before fsdp recorded its global batch (a copy of
  -- step 6 without dp, grad_accum, global_batch_tokens): on 1 rank it
  -- takes the recipe's, 64 tokens a step, as a resume did then, and says so
  idx = ckpt.read_text(ckG .. "/step-00000006/index.json")
  check(idx:find('"dp":2,"global_batch_tokens":128,"grad_accum":1,', 1, true), "the checkpoint records its global batch")
  local old = work .. "/old-ck"
  os.execute(string.format("rm -rf '%s' && cp -r '%s/step-00000006' '%s'", old, ckG, old))
  local n
  text, n = idx:gsub('"dp":2,"global_batch_tokens":128,"grad_accum":1,', "")
  check(n == 1, "rewrote a copy without the record")
  C.fsdp_fs_write_atomic(old .. "/index.json", text, #text)
  local sum = string.format("crc32c %08x bytes %d\n", C.fsdp_crc32c(0, text, #text), #text)
  C.fsdp_fs_write_atomic(old .. "/index.sum", sum, #sum)
  ok, out = run(1, with(base, { "train.resume=" .. old }))
  check(ok and out:find("resume: " .. old .. " records no global batch (saved before fsdp recorded it): this run's is the " ..
    "recipe's, 64 tokens per step (micro_batch x seq x grad_accum x ranks = 2 x 32 x 1 x 1); it was saved on 2 " ..
    "data-parallel ranks and this run has 1", 1, true) and out:find("64 tokens per step (2 x 32 x 1 micro-batches x 1 ranks)",
    1, true), "an old checkpoint on 1 rank: the recipe's global batch, with a note:\n" .. out)
end

-- 4. histories: a branch from an older checkpoint, a new run, another run's
-- checkpoint: refused before anything is written, naming checkpoint.dir
do
  local ck = work .. "/ckB"
  local base = { "train.steps=10", "checkpoint.dir=" .. ck, "checkpoint.every=5" }
  local ok, out = run(2, base)
  check(ok, "the original run:\n" .. out)
  local run_id = ckpt.meta(ck .. "/step-00000010").run_id
  check(run_id and ckpt.meta(ck .. "/step-00000005").run_id == run_id, "its checkpoints record its run id: " .. tostring(run_id))
  local index10 = ckpt.read_text(ck .. "/step-00000010/index.json")
  -- the issue's case: resume step 5 with another learning rate, stop after 8
  ok, out = run(2, { "train.steps=10", "checkpoint.dir=" .. ck, "checkpoint.every=5", "train.resume=" .. ck .. "/step-00000005",
    "train.stop_after=8", "optimizer.lr=1e-3" })
  refused("a branch from step 5 saving into the original's directory", ok, out,
    { "checkpoint.dir: " .. ck .. "/step-00000010 (run " .. run_id .. ") is newer than step 5", "its own checkpoint.dir" })
  ok, out = run(2, base)
  refused("a new run saving into an old run's directory", ok, out, { "checkpoint.dir: " .. ck .. "/step-00000005", "is newer than step 0",
    "train.resume=auto", "checkpoint.overwrite=true" })
  check(ckpt.read_text(ck .. "/step-00000010/index.json") == index10 and ckpt.read_text(ck .. "/latest") == "step-00000010\n",
    "the original's checkpoints and latest are as they were")
  -- the branch in its own directory: it keeps the history's run id
  local br = work .. "/ckB-branch"
  ok, out = run(2, { "train.steps=10", "checkpoint.dir=" .. br, "train.resume=" .. ck .. "/step-00000005", "train.stop_after=8",
    "optimizer.lr=1e-3" })
  check(ok and ckpt.meta(br .. "/step-00000008").run_id == run_id, "a branch in its own checkpoint.dir:\n" .. out)
  -- the branch's step 8 into a directory of another run (older steps only)
  local other = work .. "/ckB-other"
  ok, out = run(2, { "train.steps=4", "checkpoint.dir=" .. other })
  check(ok, "another run:\n" .. out)
  ok, out = run(2, { "train.steps=10", "checkpoint.dir=" .. other, "train.resume=" .. br .. "/step-00000008" })
  refused("resuming into a directory holding another run's checkpoint", ok, out,
    { "checkpoint.dir: " .. other .. "/step-00000004 belongs to another run", "this run is " .. run_id })
  -- checkpoint.overwrite=true: a new run starts over in a directory that
  -- holds another run's checkpoints, removing them first
  local ow = work .. "/ckB-overwrite"
  ok, out = run(2, { "train.steps=4", "checkpoint.dir=" .. ow, "checkpoint.every=2" })
  check(ok, "a run to overwrite:\n" .. out)
  local old_id = ckpt.meta(ow .. "/step-00000004").run_id
  ok, out = run(2, { "train.steps=3", "checkpoint.dir=" .. ow, "checkpoint.every=1", "checkpoint.overwrite=true" })
  local names = ckpt.list(ow)
  local new_id = ok and ckpt.meta(ow .. "/step-00000003").run_id
  check(ok and out:find("removed 2 checkpoint(s) from " .. ow, 1, true) and new_id and new_id ~= old_id
    and table.concat(names, ",") == ".fsdp-lock,latest,step-00000001,step-00000002,step-00000003"
    and ckpt.read_text(ow .. "/latest") == "step-00000003\n",
    "checkpoint.overwrite=true removes the old run's checkpoints and starts over: " .. table.concat(names, ",") .. "\n" .. out)
  -- a save that stopped between its rename and latest: resume=auto takes
  -- the newest checkpoint, not the one latest names, and goes on
  C.fsdp_fs_write_atomic(ck .. "/latest", "step-00000005\n", 14)
  ok, out = run(2, { "train.steps=12", "checkpoint.dir=" .. ck, "checkpoint.every=5", "train.resume=auto" })
  check(ok and out:find("resumed from " .. ck .. "/step-00000010", 1, true) and ckpt.meta(ck .. "/step-00000012").run_id == run_id,
    "resume=auto after a stop between rename and latest:\n" .. out)
  -- in this process: checkpoint.save never replaces another run's checkpoint
  local s = model()
  fails(function() ckpt.save(s, ck, { step = 10, optimizer = "adamw", meta = { step = 10, run_id = "0123456789abcdef" } }) end,
    ck .. "/step-00000010 belongs to another run (run " .. run_id .. "; this run is 0123456789abcdef)", "save over another run's")
  check(ckpt.read_text(ck .. "/step-00000010/index.json") == index10, "and changes nothing")
  s:free()
end

-- 5. ranks that never reach fsdp.init: the others' first fence (creating a
-- comm) times out naming them
do
  local script = work .. "/late.lua"
  local f = assert(io.open(script, "w"))
  f:write([[
local r = tonumber(os.getenv("PMIX_RANK"))
if r == 1 or r == 3 then os.execute("sleep 30") os.exit(0) end -- stuck before fsdp.init
local fsdp = require "fsdp"
fsdp.init()
fsdp.mesh("dp=-1"):group("dp")
]])
  f:close()
  local ok, out = T.launch(fsdprun, 4, { script }, "FSDP_COMM_TIMEOUT=2")
  check(not ok and out:find("not every rank arrived within 2 s: ranks 1, 3 never reached fsdp_init", 1, true),
    "a fence names the ranks that never reached fsdp.init:\n" .. out)
  ok, out = T.launch(fsdprun, 3, { script }, "FSDP_COMM_TIMEOUT=2")
  check(not ok and out:find("rank 1 never reached fsdp_init", 1, true), "the one rank:\n" .. out)
end

C.fsdp_fs_remove_tree(work)
T.finish()
