-- test_repl.lua: the prompt and `fsdp plan`, driven through their real
-- command lines with commands on standard input.
--   fsdp tests/lua/test_repl.lua FSDP FSDPRUN ROOT
--   * `fsdp repl recipes/tiny.lua --world 4`: units(), layout(), owner(),
--     rank(), mem(), plan{} and diff() print the tables the planner computes
--     (the values are checked against the planner called here);
--   * `fsdp plan` prints the same plan as text and JSON, for tiny and
--     llama70b, and refuses bad options by name;
--   * `fsdprun -n 2 --repl recipes/tiny.lua --break-at 2`: the run stops at
--     step 2, gather()/shard()/stats() answer (the gathered values agree
--     with the shards), an error leaves the prompt open, continue(2) trains
--     steps 3-4, and leaving the prompt ends the run with status 0.
local fsdp = require "fsdp"
local planner = require "fsdp.planner"
local pretty = require "fsdp.pretty"

local fsdp_bin, fsdprun, root = arg[1], arg[2], arg[3] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_repl")
local check = T.check

local function sh(cmd, input)
  local path = os.tmpname()
  local f = io.open(path, "w")
  f:write(input or "")
  f:close()
  local p = io.popen(string.format("cd '%s' && %s < '%s' 2>&1; echo \"EXIT=$?\"", root, cmd, path))
  local out = p:read("*a")
  p:close()
  os.remove(path)
  return out, tonumber(out:match("EXIT=(%d+)%s*$"))
end

local function has(out, needle, what) check(out:find(needle, 1, true) ~= nil, what .. ": no '" .. needle .. "' in:\n" .. out) end

-- offline
fsdp.init()
local r = dofile(root .. "/recipes/tiny.lua")
local p = planner.plan(r, { world = 4, where = "recipes/tiny.lua" })
local out, code = sh(fsdp_bin .. " repl recipes/tiny.lua --world 4", table.concat({
  "units()", "layout('model.layers.0')", "owner('model.layers.0.mlp.up_proj.weight', 1000)", "rank(3)", "mem(1)",
  "A = plan{world = 8}", "B = plan{world = 8, zero = 2}", "diff(A, B)", "diff(1, A)", "nope()", "1 + 1", "" }, "\n"))
check(code == 0, "fsdp repl exits 0 at the end of its input")
has(out, "#    unit                 zero  params  shard", "units()")
-- the four identical layers are one row
has(out, string.format("2-5  model.layers.0-3 x4     3  184.6k  %s", pretty.count(p.units[5].shard_numel)),
  "units(): the layers' run, its shard")
has(out, "unit 2 'model.layers.0': zero 3, 184576 elements + 0 padding = 4 shards of 46144", "layout()")
has(out, "2:[0,43968) 3:[43968,45056)", "layout(): up_proj's owners")
-- element 1000 of up_proj: flat 94464 + 1000 in a unit of 4 shards of 46144
local flat = p.units[2].params[8].offset + 1000
has(out, string.format("is element %d of shard rank %d's shard", flat % 46144, math.floor(flat / 46144)), "owner()")
has(out, "rank 3: shard rank 3, replica 0 of 1", "rank()")
has(out, "model.layers.0  model.layers.0.mlp.down_proj.weight  [0, 45056)", "rank(): what rank 3 holds")
check(out:match("\n%s*optimizer state%s+([%d.]+ %a+)") == pretty.bytes(p.resident.optimizer), "mem(): the optimizer bytes")
has(out, "A: 8 ranks, zero 3, 6 units; B: 8 ranks, zero 2, 6 units", "diff()")
has(out, "params_full", "diff(): zero 2 keeps full params")
has(out, "attempt to call global 'nope'", "an error is shown")
has(out, "diff(a, b): two plans, e.g. diff(plan{world = 64}, plan{world = 128}); got number and table", "diff() of a non-plan says so")
has(out, "\n2\n", "and the prompt goes on")

-- a user's own model, no recipe: plan{model = ...}, use(), and the helpers
-- on it, against fsdp.plan_model called here on the same model
local model_src = "nn = fsdp.nn; m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)); " ..
  "bf = function() return { x = fsdp.tensor({ 8, 16 }), y = fsdp.tensor({ 8, 4 }) } end"
local mine = assert(loadstring("fsdp = ...; " .. model_src .. "; return m, bf"))
local um, ub = mine(fsdp)
local up = fsdp.plan_model(um, { world = 4, zero = 3, units = { "Linear" }, batch = ub })
out, code = sh(fsdp_bin .. " repl --world 4", table.concat({ "fsdp = require 'fsdp'", model_src,
  "use(plan{model = m, batch = bf, zero = 3, units = { 'Linear' }})", "units()", "mem(1)",
  "plan{model = m, batch = bf, zeros = 2}", "use(3)", "" }, "\n"))
check(code == 0, "fsdp repl without a recipe exits 0")
has(out, string.format("the helpers read this plan now: model on 4 ranks, 2 units, %s per rank at peak",
  pretty.bytes(up.peak)), "use(plan{model = ...})")
check(out:match("\n%s*peak%s+([%d.]+ %a+)") == pretty.bytes(up.peak), "mem() of the user's model: the peak is plan_model's")
check(out:match("\n%s*activations%s+([%d.]+ %a+)") == pretty.bytes(up.activations),
  "mem() of the user's model: the activations from its dry run")
has(out, "unknown option 'zeros'", "plan{model = ...} names a wrong option")
has(out, "use(p): a plan", "use() of a non-plan says so")

-- fsdp plan
out, code = sh(fsdp_bin .. " plan recipes/tiny.lua --world 4")
check(code == 0, "fsdp plan exits 0")
has(out, "plan: recipes/tiny.lua on 4 ranks", "plan header")
check(out:match("\n%s*peak%s+([%d.]+ %a+)") == pretty.bytes(p.peak), "plan: the peak is the planner's: " .. pretty.bytes(p.peak))
out = sh(fsdp_bin .. " plan recipes/tiny.lua --world=4 --json")
has(out, string.format('"peak":%d', p.peak), "plan --json: the peak")
-- a GPU recipe planned without a GPU: cuDNN's workspace estimated, and said so
out = sh(fsdp_bin .. " plan bench/llama1b.lua --json")
has(out, '"backward":1107820800', "plan --json: cuDNN's attention workspace (estimated as measured on an H200)")
has(out, '"attention_workspace_from":"estimated: no GPU asked"', "plan --json: where the workspace comes from")
out, code = sh(fsdp_bin .. " plan recipes/llama70b.lua --world 64")
check(code == 0, "fsdp plan llama70b")
has(out, "70.55G parameters in 82 units", "plan llama70b")
out, code = sh(fsdp_bin .. " plan recipes/tiny.lua --wrld 4")
check(code ~= 0, "a bad option fails")
has(out, "unknown option '--wrld'", "and is named")
out, code = sh(fsdp_bin .. " plan recipes/tiny.lua --world 4 fsdp.zero=7")
has(out, "fsdp.zero = 7; expected 0, 1, 2 or 3", "a bad override is named")

-- live, 2 ranks
out, code = sh(fsdprun .. " -n 2 --repl recipes/tiny.lua --break-at 2 train.steps=6 train.log_every=1 train.eval_every=0 " ..
  "data.seq=64 data.micro_batch=4 train.metrics=" .. os.tmpname(), table.concat({
    "step()", "units()", "g = gather('model.norm.weight')", "g:numel()", "gather('lm_head.weight')",
    "a = shard(0, 'lm_head.weight'); b = shard(1, 'lm_head.weight')",
    "full = gather('lm_head.weight')",
    "ok = a.data.begin == 0 and b.data['end'] == full:numel() and a.data['end'] == b.data.begin",
    "for i = 1, #a.data.values do ok = ok and a.data.values[i] == full:get(i - 1) end",
    "for i = 1, #b.data.values do ok = ok and b.data.values[i] == full:get(b.data.begin + i - 1) end",
    "ok", "stats('model.norm.weight')", "mem(0)", "error('boom')",
    "F = require('fsdp'); x = F.tensor({1, 4}, 'int32'); y = F.tensor({1, 4}, 'int32')",
    "for i = 0, 3 do x:set(i, 65 + i); y:set(i, 66 + i) end",
    "lp = engine():logprobs({x = x, y = y}); lp_ok = lp:numel() == 4 and lp:get(0) < 0 and lp:get(3) < 0",
    "'logprobs ok: ' .. tostring(lp_ok)",
    "continue(2)", "step()", "" }, "\n"))
check(code == 0, "the live run ends with status 0 when the prompt is left (" .. tostring(code) .. ")")
has(out, "step 2/6", "trained to step 2")
has(out, "fsdp: stopped after step 2", "then prompted")
has(out, "#    unit", "units() live")
has(out, "\n128\n", "gather(): 128 values")
has(out, "tensor(256x128, fp32, cpu) [", "gather() returns the parameter's shape")
has(out, "\ntrue\n", "the shards of rank 0 and 1 tile the gathered parameter")
has(out, "model.norm.weight: min", "stats()")
-- mem(): the live run's own bytes beside the plan's, equal for what is resident
for _, row in ipairs({ "main params %(fp32%)", "optimizer state", "grads", "comm scratch" }) do
  local planned, got = out:match("\n%s*" .. row .. "%s+([%d.]+ %a+)[^\n]-%s([%d.]+ %a+)\n")
  check(planned and planned == got, string.format("mem() live: %s measured as planned (%s, %s)", row, tostring(planned), tostring(got)))
end
has(out, "boom", "an error is shown")
has(out, "logprobs ok: true", "engine() in the live prompt: per-token log-probs on every rank")
has(out, "training 2 more steps", "continue(2)")
has(out, "step 4/6", "trains step 4")
check(not out:find("step 5/6", 1, true), "and stops there")
has(out, "fsdp: stopped after step 4", "prompts again")
has(out, "ending the run after step 4", "leaving ends the run")

T.finish()
