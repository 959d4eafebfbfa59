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
-- a table row's cells in order, whatever the columns' widths
local function has_cells(out, needle, what)
  check(out:gsub(" +", " "):find(needle:gsub(" +", " "), 1, true) ~= nil, what .. ": no '" .. needle .. "' in:\n" .. out)
end

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

-- tensor parallelism, offline: `fsdp repl recipes/tiny.lua --world 10 --mesh
-- dp_shard=5,tp=2`: layout() shows each tp rank's slice of the whole weight
-- and the shard group's pieces in whole-weight coordinates; owner() takes
-- an element of the whole weight; rank() names the tp rank. The expected
-- text is worked out here from the planner's layout (offsets, shard size)
-- and the slices' arithmetic: column-parallel q_proj (rows), row-parallel
-- down_proj (cols; a shard boundary in the middle of one of its rows)
local ptp = planner.plan(dofile(root .. "/recipes/tiny.lua"), { world = 10, mesh = "dp_shard=5,tp=2", where = "recipes/tiny.lua" })
local u2 = ptp.units[2]
local Sz = u2.shard_numel
local function param_of(u, name) for _, q in ipairs(u.params) do if q.name == name then return q end end end
local down = param_of(u2, "model.layers.0.mlp.down_proj.weight") -- 128 x 176 of 128 x 352 at each tp rank
local k = math.ceil(down.offset / Sz) -- the shard whose boundary falls inside down_proj
local cut = k * Sz - down.offset
check(cut > 0 and cut < down.numel and cut % 176 ~= 0, string.format("the plan cuts down_proj inside a row (at %d)", cut))
out, code = sh(fsdp_bin .. " repl recipes/tiny.lua --world 10 --mesh dp_shard=5,tp=2", table.concat({
  "layout('model.layers.0')", "layout('embed', 1)",
  "owner('model.layers.0.mlp.down_proj.weight', 300)", "owner('model.layers.0.self_attn.q_proj.weight', 8200)",
  "owner('model.layers.0.input_layernorm.weight', 5)", "owner('model.layers.0.self_attn.q_proj.weight', 16384)",
  "rank(7)", "layout(2, 2)", "" }, "\n"))
check(code == 0, "fsdp repl at tp 2 exits 0")
has(out, string.format("= 5 shards of %d on each of 2 tp ranks (world rank = shard rank x 2 + tp rank)", Sz), "layout() at tp")
has_cells(out, "0  rows [0,64) of 128x128     0:[0,8192)", "layout(): q_proj's slice at tp rank 0")
has_cells(out, "1  rows [64,128) of 128x128   0:[8192,16384)", "layout(): q_proj's slice at tp rank 1, in whole-weight elements")
has_cells(out, "all  whole                      0:[0,128)", "layout(): a norm every tp rank holds whole")
for t = 0, 1 do
  local c0 = 176 * t
  has_cells(out, string.format("%d  cols [%d,%d) of 128x352  %d:(0,%d)..(%d,%d) %d:(%d,%d)..(127,%d)", t, c0, c0 + 176, k - 1, c0,
    math.floor((cut - 1) / 176), c0 + (cut - 1) % 176, k, math.floor(cut / 176), c0 + cut % 176, c0 + 175),
    "layout(): down_proj's slice at tp rank " .. t .. ", its pieces as (row, col) of the whole weight")
end
has_cells(out, "model.embed_tokens.weight  128x128  16384       0   1  rows [128,256) of 256x128  0:[16384,", "layout(u, 1): tp rank 1's only")
check(not out:find("0  rows [0,128) of 256x128", 1, true), "layout(u, 1) leaves tp rank 0 out")
-- element 300 of the whole down_proj: row 0, col 300, tp rank 1's slice element 124, in shard k - 1
local flat = down.offset + 124
has(out, string.format("model.layers.0.mlp.down_proj.weight[300] (row 0, col 300 of 128x352) is in tp rank 1's slice " ..
  "(cols [176,352) of 128x352) as its element 124: element %d of shard rank %d's shard", flat % Sz, math.floor(flat / Sz)),
  "owner() of an element of the whole row-parallel weight")
has(out, string.format("world rank %d", math.floor(flat / Sz) * 2 + 1), "owner(): the world rank")
has(out, "q_proj.weight[8200] (row 64, col 8 of 128x128) is in tp rank 1's slice (rows [64,128) of 128x128) as its element 8",
  "owner() of a column-parallel weight")
has(out, "input_layernorm.weight[5] is held whole by each of the 2 tp ranks: element 5 of shard rank 0's shard", "owner(): a norm")
has(out, "world ranks 0, 1 (one per tp rank)", "owner(): a norm's world ranks")
has(out, "owner: index 16384 outside 'model.layers.0.self_attn.q_proj.weight' (0 to 16383, the whole weight's elements)",
  "owner() past the whole weight")
has(out, "rank 7: tp rank 1 of 2, shard rank 3, replica 0 of 1", "rank() at tp")
has(out, "layout(u, t): tp rank 2; this plan's are 0 to 1", "layout() of a tp rank the plan lacks")

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

-- live at tp 2: layout() and owner() against what the ranks hold. Every
-- rank prints its own slices as its model's specs say (rank 1's lines come
-- prefixed "[1] "); gather() puts the slices together into the whole weight;
-- for elements of the whole weights, owner()'s tp rank and slice element
-- index that rank's own piece (shard()) to the same value
local names = { "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.q_proj.weight",
  "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight" }
out, code = sh(fsdprun .. " -n 2 --repl recipes/tiny.lua mesh=dp_shard=1,tp=2 --break-at 1 train.steps=2 train.eval_every=0 " ..
  "data.seq=64 data.micro_batch=4 train.metrics=" .. os.tmpname(), table.concat({
    "layout('model.layers.0')", "layout('embed')",
    "for _, u in ipairs(engine().s.units) do for _, q in ipairs(u.params) do local sl = q.spec.slice; if sl then " ..
      "print(string.format('real %s %d %d %d %d', q.name, sl.row0, sl.rows, sl.col0, sl.cols)) end end end",
    "names = { '" .. table.concat(names, "', '") .. "' }",
    "ok, n = true, 0",
    "for _, name in ipairs(names) do local g = gather(name); for i = 0, g:numel() - 1, 997 do " ..
      "local d = owner(name, i).data; local b = shard(d.world[1], name); " ..
      "ok = ok and b.data.values[(d.slice_index or i) - b.data.begin + 1] == g:get(i); n = n + 1 end end",
    "'owner checked ' .. n .. ': ' .. tostring(ok)",
    "owner('model.layers.0.self_attn.o_proj.weight', 8000)", "rank(1)", "" }, "\n"))
check(code == 0, "the live run at tp 2 ends with status 0 (" .. tostring(code) .. ")")
local real = 0
for who, name, row0, rows, col0, cols in out:gmatch("\n(%[?1?%]? ?)real (%S+) (%d+) (%d+) (%d+) (%d+)") do
  local t = who == "[1] " and 1 or 0
  local sh = name == "model.embed_tokens.weight" and { 256, 128 } or name == "lm_head.weight" and { 256, 128 } or nil
  row0, rows, col0, cols = tonumber(row0), tonumber(rows), tonumber(col0), tonumber(cols)
  -- what layout() must say for this rank's slice of a layers.0 weight or the embedding
  if name:find("layers.0.", 1, true) or name == "model.embed_tokens.weight" then
    local full_r, full_c
    if sh then full_r, full_c = sh[1], sh[2]
    elseif cols < 128 and rows == 128 and name:find("o_proj", 1, true) then full_r, full_c = 128, 128
    elseif name:find("down_proj", 1, true) then full_r, full_c = 128, 352
    elseif name:find("gate_proj", 1, true) or name:find("up_proj", 1, true) then full_r, full_c = 352, 128
    elseif name:find("q_proj", 1, true) then full_r, full_c = 128, 128
    else full_r, full_c = 64, 128 end -- k_proj, v_proj (2 kv heads of 32)
    local what = cols == full_c and string.format("rows [%d,%d)", row0, row0 + rows) or
      string.format("cols [%d,%d)", col0, col0 + cols)
    local line = string.format("%d  %s of %dx%d", t, what, full_r, full_c)
    has_cells(out, line, "layout() live: tp rank " .. t .. "'s slice of " .. name .. " is the model's")
    real = real + 1
  end
end
check(real == 2 * 8, string.format("every tp rank's slices of layers.0 and the embedding checked (%d)", real))
local want = 0 -- (every 997th element of each: o_proj, q_proj 128x128, down_proj 128x352, embedding and head 256x128, a norm)
for _, numel in ipairs({ 16384, 16384, 45056, 32768, 32768, 128 }) do want = want + math.ceil(numel / 997) end
has(out, string.format('"owner checked %d: true"', want),
  "owner() live: the tp rank and slice element it names hold gather()'s whole-weight value there")
has(out, "model.layers.0.self_attn.o_proj.weight[8000] (row 62, col 64 of 128x128) is in tp rank 1's slice " ..
  "(cols [64,128) of 128x128) as its element 3968", "owner() live")
has(out, "rank 1: tp rank 1 of 2, shard rank 0, replica 0 of 1", "rank() live at tp")

T.finish()
