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
local fsdp = require "fsdp"
local ckpt = require "fsdp.checkpoint"
local hf = require "fsdp.hf"
local llama = require "fsdp.models.llama"
local ffi, C = fsdp.ffi, fsdp.C

local fsdprun, root = arg[1], arg[2] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_faults")
local check, fails = T.check, T.fails

pcall(ffi.cdef, "int getpid(void);")
local work = string.format("/tmp/fsdp-test-faults-%d", ffi.C.getpid())
C.fsdp_fs_remove_tree(work)
C.fsdp_fs_mkdirs(work)

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
local function run(n, extra)
  local args = {}
  for _, a in ipairs(common) do args[#args + 1] = a end
  for _, a in ipairs(extra) do args[#args + 1] = a end
  local p = io.popen(string.format("%s -n %d --timeout 120 %s/recipes/tiny.lua %s 2>&1; echo \"EXIT=$?\"", fsdprun, n,
    root, table.concat(args, " ")))
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("EXIT=(%d+)%s*$")) == 0, out
end
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
local function params(s)
  local out = {}
  for _, u in ipairs(s.units) do for _, p in ipairs(u.params) do out[p.name] = s:gather(p.name) end end
  return out
end
local function same_params(a, b)
  for name, va in pairs(a) do
    for i = 1, #va do if va[i] ~= b[name][i] then return false end end
  end
  return true
end

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

C.fsdp_fs_remove_tree(work)
T.finish()
