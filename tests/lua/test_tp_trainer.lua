-- test_tp_trainer.lua: the trainer with a tp mesh, end to end.
--   fsdp-host tests/lua/test_tp_trainer.lua FSDPRUN ROOT
-- * recipes/tiny.lua (on a text made here: the recipe's corpus is this
--   repository's sources, which every change moves) for 30 steps at mesh dp_shard=1,tp=2, dp_shard=1,cp=2
--   (2 ranks) and cp=2,tp=2 (4 ranks) gives the losses and grad norms of
--   the same recipe on 1 rank, and at dp_shard=2,tp=2 (4 ranks) those of
--   dp_shard=2 (2 ranks): within 1e-5 relative each step (AdamW eps 1e-6:
--   see test_tp.lua; lr 5e-4: at the recipe's 3e-3 this training
--   amplifies fp32 noise: one rank with 1 micro-batch of 4 rows against 2
--   micro-batches of 2 rows, the same math summed in another order,
--   already differs by 1.4e-4 in grad norm, and tp or cp by up to 4.8e-4);
-- * refused before anything is allocated, naming the field and what would
--   work: a tp that does not split the heads, the mesh in another order, a
--   data.seq that does not split into 2 x cp chunks;
-- * `fsdp plan --mesh dp_shard=2,tp=2` prints the tp group's communication.
local fsdprun, root = arg[1], arg[2] or "."
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_tp_trainer")
local check = T.check

local work = T.workdir("tp-trainer")
-- the data: tokens made here, the same every time (the recipe's corpus
-- is this repository's sources, which every change to them moves): ids
-- below 64 as raw uint16, each chosen from the 4 that follow the last
local rnd, bytes, w = T.lcg(11), {}, 0
for i = 1, 40000 do
  w = (w * 7 + math.floor(rnd(2147483648) / 65536) % 4) % 64
  bytes[i] = string.char(w, 0)
end
T.write(work .. "/tokens.bin", table.concat(bytes))
local common = { root .. "/recipes/tiny.lua", "data.token_file=" .. work .. "/tokens.bin", "data.format=raw_u16",
  "train.steps=30", "data.seq=64", "data.micro_batch=4", "train.eval_every=0",
  "train.log_every=10", "optimizer.eps=1e-6", "optimizer.lr=5e-4", "train.sample_tokens=0" }

-- (more ranks than this machine's cores: --oversubscribe, before the recipe)
local function pre(n) return n > 2 and { "--oversubscribe" } or {} end

local function run(n, name, extra)
  local metrics = work .. "/" .. name .. ".jsonl"
  local ok, out = T.launch(fsdprun, n, T.joined(pre(n), common, { "train.metrics=" .. metrics }, extra or {}))
  if not ok then io.stderr:write(out) end
  check(ok, name .. ": the run finishes")
  local got = {} -- step -> {loss, grad norm}
  for line in T.read(metrics):gmatch("[^\n]+") do
    local step = tonumber(line:match('"step":(%d+)'))
    if step then got[step] = { tonumber(line:match('"loss":([^,}]+)')), tonumber(line:match('"grad_norm":([^,}]+)')) } end
  end
  return got, out
end

local function compare(what, a, b)
  local worst, n = { 0, 0 }, 0
  for step, v in pairs(a) do
    if b[step] then
      n = n + 1
      for i = 1, 2 do worst[i] = math.max(worst[i], math.abs(v[i] - b[step][i]) / math.abs(b[step][i])) end
    end
  end
  check(n == 30 and worst[1] <= 1e-5 and worst[2] <= 1e-5, string.format("%s: %d steps' losses and grad norms within " ..
    "1e-5 relative (worst %.2g, %.2g)", what, n, worst[1], worst[2]))
  print(string.format("test_tp_trainer: %s: worst loss difference %.2g, grad norm %.2g relative over %d steps", what,
    worst[1], worst[2], n))
end

local one = run(1, "one")
local tp2 = run(2, "tp2", { "mesh=dp_shard=1,tp=2" })
compare("tp 2 against 1 rank", tp2, one)
compare("cp 2 against 1 rank", run(2, "cp2", { "mesh=dp_shard=1,cp=2" }), one)
local dp2 = run(2, "dp2", { "mesh=dp_shard=2" })
local dp2tp2 = run(4, "dp2tp2", { "mesh=dp_shard=2,tp=2" })
compare("dp_shard 2 x tp 2 against dp_shard 2", dp2tp2, dp2)
compare("cp 2 x tp 2 against 1 rank", run(4, "cp2tp2", { "mesh=dp_shard=1,cp=2,tp=2" }), one)

-- refusals
local function refused(n, args, needle, what)
  local ok, out = T.launch(fsdprun, n, T.joined(pre(n), common, args))
  check(not ok and out:find(needle, 1, true) ~= nil, what .. (ok and " (the run went on)" or ": " .. out:sub(1, 300)))
end
refused(3, { "mesh=dp_shard=1,tp=3" }, "tp = 3 does not split num_attention_heads = 4 with " ..
  "num_key_value_heads = 2", "a tp that does not split the heads")
refused(2, { "mesh=tp=2,dp_shard=1" }, "mesh: 'dp_shard' comes after tp; the order is dp_outer, dp_shard, cp, tp",
  "the mesh in another order")
refused(3, { "mesh=dp_shard=1,cp=3" }, "mesh: cp = 3: data.seq = 64 does not split into 2 x cp = 6 equal chunks",
  "a sequence that does not split into 2 x cp chunks")

-- the plan says what the tp group sends
local p = io.popen(string.format("%s/fsdp plan %s/recipes/tiny.lua --world 4 --mesh dp_shard=2,tp=2 2>&1",
  fsdprun:match("^(.*)/[^/]*$") or ".", root))
local text = p:read("*a")
p:close()
check(text:find("dp_shard 2 x dp_outer 1 x tp 2", 1, true) and text:find("tp group (2 ranks): all-gather", 1, true),
  "fsdp plan prints the tp mesh and the tp group's communication: " .. text:sub(1, 200))

if not os.getenv("FSDP_TEST_KEEP") then os.execute("rm -rf '" .. work .. "'") end
T.finish()
