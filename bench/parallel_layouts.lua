-- parallel_layouts.lua [layouts=a;b;c] [steps=N] [seq=N] [layers=N] [device=cpu|cuda]: one
-- Llama trained through the trainer (fsdp.train) at several meshes of the
-- ranks fsdprun starts, one after another in one job, and for each its
-- tokens/s and the bytes this rank sent per step in each group, measured
-- (the comms' own counts, fsdp_comm_bytes_sent) against the plan
-- (fsdp.planner: p.comm for FSDP's group, p.comm_cp, p.comm_tp).
--
-- The model: 56.0M parameters (hidden 512, 8 layers, 8 heads, 4 kv heads,
-- SwiGLU 1376 = 8/3 x 512 rounded up to 32, vocab 32000, embeddings not
-- tied), fp32, ZeRO 3, seq 4096, micro_batch 1, one micro-batch per step
-- (so a step is dp x 4096 tokens), the project's own docs and sources as
-- bytes. A layout is a mesh, with +ring or +all_gather after it to set
-- train.cp_attention (else its default, an all-gather), +serial to set
-- train.tp_overlap = false. Default layouts, for 4
-- ranks: dp_shard=4; dp_shard=1,cp=4+all_gather; dp_shard=1,cp=4+ring;
-- dp_shard=2,tp=2. Each runs 1 warm-up step and then `steps` (default 2)
-- timed ones.
--
-- Groups: dp = FSDP's (dp_shard, times cp when there is one, both
-- channels: gathers on 0, reductions on 1) with dp_outer's; cp; tp. The
-- plan counts every collective of a step, the small all-reduce of its
-- scalars too (each unit's grad norm and non-finite count, the loss, the
-- stop flag); a difference is printed. Every rank's counts are compared
-- (they must agree); rank 0 prints.
--
-- Time: tokens/s from the slowest rank's train_step wall time; beside it
-- tokens per CPU second, the ranks' CPU seconds in the step summed (every
-- thread of each rank; waiting in a collective sleeps), which holds still
-- where other work on a shared machine makes the wall time swing 2-3x
-- between runs (bench/RESULTS.md), and the load average around each.
--   FSDPRUN_OVERSUBSCRIBE=1 build/fsdprun -n 4 bench/parallel_layouts.lua
--   (bench/parallel_layouts.sh BUILD [RANKS] [args...] runs it)
-- device=cuda: GPU ranks (train.device), as scripts/gpu_check.sh's stage
-- cp_attention runs it (2 ranks sharing one GPU); there the wall time is
-- the measure.
local fsdp = require "fsdp"
local train = require "fsdp.train"
local planner = require "fsdp.planner"
local pretty = require "fsdp.pretty"
local C = fsdp.C

local o = { layouts = "dp_shard=4;dp_shard=1,cp=4+all_gather;dp_shard=1,cp=4+ring;dp_shard=2,tp=2", steps = 2, seq = 4096,
  layers = 8, device = "cpu" }
for i = 1, #(arg or {}) do
  local k, v = arg[i]:match("^([%w_]+)=(.+)$")
  if not k or o[k] == nil then
    error("parallel_layouts.lua [layouts=a;b;c] [steps=N] [seq=N] [layers=N] [device=cpu|cuda]: argument '" .. arg[i] .. "'", 0)
  end
  o[k] = type(o[k]) == "number" and assert(tonumber(v), k .. " must be a number") or v
end
local root = debug.getinfo(1, "S").source:match("^@(.*)/bench/[^/]*$") or "."

-- a layout's mesh and its options after it: +ring or +all_gather
-- (train.cp_attention; nil: the default), +serial (train.tp_overlap =
-- false: the tp reduce-scatters not overlapped with the weight gradients)
local function layout_of(layout)
  local mesh = layout:match("^([^+]*)")
  local way, overlap
  for opt in layout:gmatch("%+([^+]*)") do
    if opt == "ring" or opt == "all_gather" then
      way = opt
    elseif opt == "serial" then
      overlap = false
    else
      error("parallel_layouts.lua: layout '" .. layout .. "'; expected a mesh, with +ring, +all_gather or +serial " ..
        "after it or not", 0)
    end
  end
  return mesh, way, overlap
end

local function recipe(layout)
  local mesh, way, overlap = layout_of(layout)
  return {
    model = { hidden_size = 512, intermediate_size = 1376, num_attention_heads = 8, num_key_value_heads = 4,
      num_hidden_layers = o.layers, vocab_size = 32000, max_position_embeddings = math.max(4096, o.seq),
      rope_theta = 10000, rms_norm_eps = 1e-5, tie_word_embeddings = false },
    mesh = mesh,
    fsdp = { zero = 3, units = "default", meta_init = true, prefetch = 1, max_live_units = 2, checkpoint = "none" },
    optimizer = { name = "adamw", lr = 3e-4, beta1 = 0.9, beta2 = 0.95, weight_decay = 0.1, clip = 1.0 },
    schedule = { warmup = 1, decay = "cosine", min_lr_ratio = 0.1 },
    data = { corpus = { root = root, include = { "README.md", "docs/*.md", "src/*.h", "src/*/*.c", "lua/fsdp/*.lua" } },
      seq = o.seq, micro_batch = 1 },
    train = { steps = 1 + o.steps, grad_accum = 1, seed = 1234, eval_every = 0, log_every = 1, sample_tokens = 0,
      cp_attention = way, tp_overlap = overlap, device = o.device },
  }
end

-- this process's CPU seconds, every thread (its ops, OpenBLAS, the comm
-- workers): on a shared machine whose load comes and goes, tokens per CPU
-- second of the job's ranks compares the layouts where wall time cannot
local ffi = require "ffi"
pcall(ffi.cdef, "struct fsdp_bench_ts { long tv_sec; long tv_nsec; }; int clock_gettime(int, struct fsdp_bench_ts *);")
local ts = ffi.new("struct fsdp_bench_ts")
local function cpu_s()
  ffi.C.clock_gettime(2, ts) -- CLOCK_PROCESS_CPUTIME_ID
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
-- the machine's load average over the last minute (other users' work shows here)
local function load1()
  local f = io.open("/proc/loadavg")
  local v = f and tonumber(f:read("*l"):match("^(%S+)"))
  if f then f:close() end
  return v or 0
end

local info = fsdp.init()
-- a mesh of our own, to compare every rank's counts (the trainer frees its own)
local all = fsdp.mesh("all=-1"):group("all")
local kinds = { "all_gather", "reduce_scatter", "all_reduce", "shift" }
local groups = { "dp", "cp", "tp" }

-- the trainer's fully_shard, wrapped: each train_step timed, every comm's
-- counts reset before it and read after it, by group
local steps
local real_fully_shard = fsdp.fully_shard
fsdp.fully_shard = function(model, opts)
  local s = real_fully_shard(model, opts)
  local mesh = s.shard.mesh
  local of = {} -- tostring(comm handle) -> {c = comm, g = group} (s.reduce is s.shard without separate_reduce)
  local function add(c, g) if c then of[tostring(c.handle)] = { c = c, g = g } end end
  add(s.shard, "dp"); add(s.reduce, "dp"); add(s.outer, "dp"); add(s.tp, "tp")
  for _, d in ipairs(mesh:dims()) do if d.name == "cp" and d.size > 1 then add(mesh:group("cp"), "cp") end end
  local step = s.train_step
  s.train_step = function(self, batches, opt)
    for _, c in pairs(mesh.comms) do c:bytes_reset() end
    local t0, c0 = C.fsdp_time_now(), cpu_s()
    local a, b, c = step(self, batches, opt)
    local rec = { time = C.fsdp_time_now() - t0, cpu = cpu_s() - c0, units = #self.units, bytes = {}, other = 0 }
    for _, g in ipairs(groups) do rec.bytes[g] = {} end
    for _, e in pairs(of) do
      for _, k in ipairs(kinds) do rec.bytes[e.g][k] = (rec.bytes[e.g][k] or 0) + e.c:bytes_sent(k) end
    end
    for _, c in pairs(mesh.comms) do -- anything else (the world group, where it is not one of them)
      if not of[tostring(c.handle)] then rec.other = rec.other + c:bytes_sent("total") end
    end
    steps[#steps + 1] = rec
    return a, b, c
  end
  return s
end

local function fmt(n) return n == 0 and "0" or pretty.bytes(n) end
local results = {}
local t_all = C.fsdp_time_now()
for layout in o.layouts:gmatch("[^;]+") do
  local mesh = layout_of(layout)
  steps = {}
  if info.rank == 0 then print(string.format("== %s: %d ranks, seq %d", layout, info.size, o.seq)) end
  io.stdout:flush()
  local l0 = load1()
  local out = train.run(recipe(layout), "parallel_layouts[" .. layout .. "]", {})
  local l1 = load1()
  local S0, R, P, Cp = planner.mesh_sizes(mesh, info.size, "parallel_layouts")
  local p = planner.plan(recipe(layout), { world = info.size, mesh = mesh, where = "parallel_layouts" })
  local planned = { dp = p.comm, cp = p.comm_cp or {}, tp = p.comm_tp or {} }
  -- the timed steps (after the warm-up) must each send the same; every rank's figures compared
  local timed, time, cpu = {}, 0, 0
  for i = 2, #steps do timed[#timed + 1] = steps[i]; time = time + steps[i].time; cpu = cpu + steps[i].cpu end
  local first, same_steps = timed[1], true
  for _, st in ipairs(timed) do
    for _, g in ipairs(groups) do
      for _, k in ipairs(kinds) do same_steps = same_steps and (st.bytes[g][k] or 0) == (first.bytes[g][k] or 0) end
    end
  end
  -- every rank's figures against rank 0's: exact in fp32 as two parts, the
  -- bytes' multiples of 2^20 and the rest (the slowest rank's time and
  -- the ranks' CPU seconds with them)
  local mine = {}
  for _, g in ipairs(groups) do for _, k in ipairs(kinds) do mine[#mine + 1] = first.bytes[g][k] or 0 end end
  local n = 2 * #mine + 2
  local part, gathered = fsdp.tensor(n), fsdp.tensor(n * info.size)
  for i, v in ipairs(mine) do
    local hi = math.floor(v / 2 ^ 20)
    part:set(2 * i - 2, hi); part:set(2 * i - 1, v - hi * 2 ^ 20)
  end
  part:set(n - 2, time)
  part:set(n - 1, cpu)
  all:all_gather(gathered, part)
  all:synchronize()
  local agree, slowest, cpu_all = true, 0, 0
  for r = 0, info.size - 1 do
    for i = 0, n - 3 do agree = agree and gathered:get(r * n + i) == part:get(i) end
    slowest = math.max(slowest, gathered:get(r * n + n - 2))
    cpu_all = cpu_all + gathered:get(r * n + n - 1)
  end
  part:free(); gathered:free()
  local dp = S0 * R
  local tokens_step = 1 * o.seq * 1 * dp
  results[#results + 1] = { mesh = layout, tps = tokens_step * #timed / slowest, step_s = slowest / #timed,
    tpc = tokens_step * #timed / cpu_all, cpu_step = cpu_all / #timed, load = { l0, l1 },
    tokens_step = tokens_step, first = first, planned = planned, agree = agree, same_steps = same_steps,
    loss = out.losses, sizes = { dp = S0 * Cp * R, cp = Cp, tp = P }, n_params = p.n_params }
end

if info.rank == 0 then
  print(string.format("\nparallel_layouts: %.2fM parameters (hidden 512, %d layers, 8 heads / 4 kv, SwiGLU 1376, vocab " ..
    "32000, untied), fp32, ZeRO 3, seq %d, micro_batch 1, %d ranks; %d timed steps after 1 warm-up; %.0f s in all",
    results[1].n_params / 1e6, o.layers, o.seq, info.size, o.steps, C.fsdp_time_now() - t_all))
  local base, base_c = results[1].tps, results[1].tpc
  print("\n| mesh | tokens/step | s/step | tokens/s | vs first | CPU s/step (all ranks) | tokens/CPU s | vs first | " ..
    "load avg (start, end) | loss (warm-up -> last) |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for _, r in ipairs(results) do
    print(string.format("| %s | %d | %.2f | %.0f | %.2f | %.1f | %.1f | %.2f | %.1f, %.1f | %.3f -> %.3f |", r.mesh,
      r.tokens_step, r.step_s, r.tps, r.tps / base, r.cpu_step, r.tpc, r.tpc / base_c, r.load[1], r.load[2],
      r.loss[1] or 0, r.loss[#r.loss] or 0))
  end
  print("\n| mesh | group (ranks) | kind | measured B/step | planned B/step | measured/planned | note |")
  print("|---|---|---|---|---|---|---|")
  for _, r in ipairs(results) do
    for _, g in ipairs(groups) do
      if r.sizes[g] > 1 then
        for _, k in ipairs(kinds) do
          local m, pl = r.first.bytes[g][k] or 0, r.planned[g][k] or 0
          local note = m ~= pl and string.format("differs by %.0f B", m - pl) or ""
          if m > 0 or pl > 0 then
            print(string.format("| %s | %s (%d) | %s | %.0f (%s) | %.0f (%s) | %s | %s |", r.mesh, g, r.sizes[g], k, m, fmt(m),
              pl, fmt(pl), pl > 0 and string.format("%.6f", m / pl) or "-", note))
          end
        end
      end
    end
  end
  local agree, same = true, true
  for _, r in ipairs(results) do
    if not r.agree then print(r.mesh .. ": the ranks' counts DIFFER") end
    if not r.same_steps then print(r.mesh .. ": the timed steps' counts DIFFER") end
    if r.first.other > 0 then print(string.format("%s: %s on other comms", r.mesh, fmt(r.first.other))) end
    agree, same = agree and r.agree, same and r.same_steps
  end
  print(string.format("every rank's counts the same: %s; every timed step's the same: %s", tostring(agree), tostring(same)))
end
all.mesh:free()
