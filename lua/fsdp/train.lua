-- fsdp.train: the trainer behind `fsdprun -n N RECIPE.lua [section.field=value ...]`.
-- Builds the mesh, the data, the Llama model sharded by the recipe's FSDP
-- policy, checks the memory it will need before allocating, then trains:
-- micro-batches with gradient accumulation, the LR schedule, clipping,
-- periodic evaluation, one line per step (and a progress bar on rank 0 when
-- fsdprun's output is a terminal), and a JSONL metrics file.
local fsdp = require "fsdp"
local recipe = require "fsdp.recipe"
local schedule = require "fsdp.schedule"
local planner = require "fsdp.planner"
local llama = require "fsdp.models.llama"
local data = require "fsdp.data"
local checkpoint = require "fsdp.checkpoint"
local hf = require "fsdp.hf"
local ops = require "fsdp.ops"
local hf_config = require "fsdp.hf_config"
local hf_files = require "fsdp.hf_files"
local peak = require "fsdp.peak"
local metrics_file = require "fsdp.metrics"
local autograd = require "fsdp.autograd"
local restarts = require "fsdp.restarts"
local dir_lock = require "fsdp.dir_lock"
local checkpoint_manager = require "fsdp.checkpoint_manager"
local preflight = require "fsdp.preflight"
local profile = require "fsdp.profile"
local nn = require "fsdp.nn"
local ffi, C, check = fsdp.ffi, fsdp.C, fsdp.check

local M = {}

-- (the pre-flight checks live in fsdp.preflight; tests reach them here too)
for _, k in ipairs({ "ranks_per_gpu", "gpu_sharing_refusal", "warmup_warning" }) do M[k] = preflight[k] end

pcall(ffi.cdef, "int mkdir(const char *path, unsigned int mode); int isatty(int fd);")
pcall(ffi.cdef, "int kill(int pid, int sig); int getpid(void); int usleep(unsigned int us);")

-- FSDP_TEST_STALL = "RANK:STEP:stop|spin" (tests only): at the start of
-- step STEP, rank RANK stops itself (SIGSTOP) or spins in Lua for ever:
-- alive but stuck, outside any collective (fsdprun --heartbeat-timeout).
-- It first works 1 s longer than its peers, beating: by its last beat they
-- have waited for it in a collective for 1 s, and only their own beats
-- while waiting keep them from being taken for the stuck ones.
local function stall_hook(rank, step)
  local r, st, how = (os.getenv("FSDP_TEST_STALL") or ""):match("^(%d+):(%d+):(%a+)$")
  if tonumber(r) ~= rank or tonumber(st) ~= step then return end
  for _ = 1, 100 do
    ffi.C.usleep(10000)
    C.fsdp_heartbeat(step)
  end
  if how == "stop" then ffi.C.kill(ffi.C.getpid(), 19) end -- SIGSTOP
  local x = 0
  while how == "spin" do x = x + 1 end
end

local function mkdir_p(dir)
  local path = ""
  for part in dir:gmatch("[^/]+") do
    path = (path == "" and dir:sub(1, 1) == "/") and ("/" .. part) or (path == "" and part or path .. "/" .. part)
    ffi.C.mkdir(path, tonumber("755", 8))
  end
end

local human = require("fsdp.pretty").count

local function duration(s)
  if s >= 3600 then return string.format("%dh%02dm", s / 3600, (s % 3600) / 60) end
  if s >= 60 then return string.format("%dm%02ds", s / 60, s % 60) end
  return string.format("%ds", s)
end

-- int32 {B, T} tensors from whatever the loader returns
local function as_ids(v, B, T)
  if type(v) == "table" and v.dtype == "int32" then return v end
  local t = fsdp.tensor({ B, T }, "int32")
  ffi.copy(t:ptr(), v, B * T * 4)
  return t
end

-- An error of fsdp.mesh or fsdp.data (messages that start so) is the
-- recipe's doing: raised again naming the recipe, without fsdp's source
-- position or status. Anything else (a program error) goes on as it was.
local function recipe_error(where, err)
  local msg = tostring(err):gsub("^[^:\n]+:%d+: ", "")
  if not (msg:find("^fsdp%.mesh: ") or msg:find("^data[.:]")) then error(err, 0) end
  error(string.format("%s: %s", where, (msg:gsub("^fsdp%.mesh: ", ""):gsub(" %(FSDP_%u+%)$", ""))), 0)
end

local function dataset_of(r, vocab_size)
  local d = r.data
  if d.corpus then
    local c = {}
    for k, v in pairs(d.corpus) do c[k] = v end
    c.root = c.root or (debug.getinfo(1, "S").source:match("^@(.*)/lua/fsdp/[^/]*$") or ".")
    c.val_fraction = c.val_fraction or d.val_fraction
    return data.corpus(c)
  end
  require("fsdp.token_manifest").check(r, vocab_size) -- `fsdp prepare`'s manifest against the model
  return data.token_file({ path = d.token_file, format = d.format, val_path = d.val_token_file, val_fraction = d.val_fraction,
    vocab_size = vocab_size })
end

local function run(r, where, args, break_at, owned)
  local info = fsdp.init()
  local my_rank = info.rank
  local appended, original_resume = restarts.original_resume(r, args)
  r = recipe.check(recipe.apply_overrides(r, args, where), where)
  -- bar_open: the progress line is drawn on the terminal without its
  -- newline (a step between log lines); a line said now replaces it
  local bar_open = false
  local say = function(...)
    if my_rank ~= 0 then return end
    if bar_open then io.stdout:write("\r\27[K") bar_open = false end
    print(string.format(...))
    io.stdout:flush()
  end

  local device = r.train.device
  local cfg = hf_config.model(r.model, where)

  -- pre-flight: the planned need per rank against what the device has,
  -- before anything is allocated
  local B, T = r.data.micro_batch, r.data.seq
  local ranks_per_device = info.local_size
  local the_plan -- fsdp.planner, as `fsdp plan` prints it
  local function planned() -- (on a GPU: once it is selected, which cuDNN's plans need)
    the_plan = the_plan or planner.plan(r, { world = info.size, where = where, strict = true,
      attention_workspace = device == "cuda" and ops.attention_workspace(r.fsdp.param_dtype, B, T, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.head_dim) or nil })
    return the_plan.need
  end
  if device == "cuda" then ranks_per_device = preflight.select_gpu(r, where, info) end

  -- a mesh the world cannot hold is the recipe's mistake: named by its file, no trace
  local made, mesh = pcall(fsdp.mesh, r.mesh, { device = device })
  if not made then recipe_error(where, mesh) end
  owned.mesh = mesh
  local names = {}
  for _, d in ipairs(mesh:dims()) do names[d.name or d[1]] = true end
  local shard = mesh:group("dp_shard") -- (recipe.check: the mesh has it)
  local outer = names.dp_outer and mesh:group("dp_outer") or nil
  local dp = shard:size() * (outer and outer:size() or 1)
  local dp_rank = (outer and outer:rank() * shard:size() or 0) + shard:rank()
  -- fsdprun --max-restarts: which attempt this is; restarting without
  -- checkpoints starts again at step 1 (allowed: a short run may want it)
  local restart = restarts.current()
  if restart and restart.attempt > 0 then
    say("fsdp: restart %d of %d (fsdprun --max-restarts)", restart.attempt, restart.max)
  end
  if restart and restart.max > 0 and not r.checkpoint.dir and my_rank == 0 then
    io.stderr:write(string.format("fsdp: warning: fsdprun --max-restarts %d without checkpoint.dir: a restarted run " ..
      "starts again at step 1\n", restart.max))
  end

  -- resume (train.resume), else initial weights from Hugging Face files
  -- (checkpoint.init_hf, by default model.from_hf's folder), else the meta
  -- init's: fsdp.checkpoint_manager finds the checkpoints a resume may load
  -- before the plan (the global batch a run keeps comes from the one it
  -- loads, and with it the micro-batches the plan and the units are made for)
  local ck, o = r.checkpoint, r.optimizer
  local cm = checkpoint_manager.open(r, { where = where, rank = my_rank, shard = shard, outer = outer, appended = appended,
    original_resume = original_resume, say = say, owned = owned })
  local K = cm:grad_accum(args, dp)
  -- the run's own from here on: the plan and the REPL's recipe (with
  -- train.global_batch_tokens, K is that one's already, and the REPL's
  -- plans on other world sizes work it out again from it)
  if not r.train.global_batch_tokens then r.train.grad_accum = K end
  if T > cfg.max_position_embeddings then
    error(string.format("%s: data.seq = %d exceeds model.max_position_embeddings = %d", where, T, cfg.max_position_embeddings), 0)
  end

  preflight.floor(r, cfg, where, info)
  -- the planned need per rank against what this machine has
  local need = planned()
  preflight.memory(r, the_plan, where, info, ranks_per_device)

  local read, ds = pcall(dataset_of, r, cfg.vocab_size)
  if not read then recipe_error(where, ds) end
  if ds.vocab_size and ds.vocab_size > cfg.vocab_size then
    error(string.format("%s: the data has token ids up to %d but model.vocab_size = %d", where, ds.vocab_size - 1, cfg.vocab_size), 0)
  end
  -- a split shorter than one window fails here, not at the first
  -- evaluation after training steps (with a traceback naming train.lua)
  local function check_split(split, advice)
    if ds:windows(split, T) >= 1 then return end
    local range = ds.splits[split]
    error(string.format("%s: the %s split has %d tokens, fewer than one window of data.seq + 1 = %d; %s", where, split,
      range[3] - range[2], T + 1, advice), 0)
  end
  check_split("train", "lower data.seq or give more data")
  if r.train.eval_every > 0 then
    check_split("val", string.format("train.eval_every = %d evaluates on it: raise data.val_fraction (%g), give " ..
      "data.val_token_file, or set train.eval_every = 0", r.train.eval_every, r.data.val_fraction))
  end
  local seed = r.train.seed

  local model = llama.model(cfg, { checkpoint = r.fsdp.checkpoint, recompute = r.fsdp.recompute })
  local units = planner.policy(r.fsdp.units, where)
  local sharded = fsdp.fully_shard(model, { shard = shard, outer = outer, units = units, zero = r.fsdp.zero,
    prefetch = r.fsdp.prefetch, max_live_units = r.fsdp.max_live_units, seed = seed, hfsdp = r.fsdp.hfsdp,
    offload = r.fsdp.offload, comm_register = r.fsdp.comm_register, separate_reduce = r.fsdp.separate_reduce,
    micro_batches = K, mixed = { param_dtype = r.fsdp.param_dtype, reduce_dtype = r.fsdp.reduce_dtype } })
  owned.sharded = sharded

  -- stop signals are recorded from here on: one during a long checkpoint
  -- load ends it cleanly, one later stops the run after its first step
  C.fsdp_stop_signals_watch(1)
  local got = cm:resume(sharded, { seed = seed, windows = ds:windows("train", T), seq = T, micro_batch = B,
    world = mesh:group("world") })
  if got.stopped then -- stopped while loading: nothing trained, nothing to save; the checkpoint is as it was
    mesh:group("world"):barrier()
    C.fsdp_stop_signals_watch(0)
    cm:release()
    sharded:free()
    mesh:free()
    return { losses = {}, signalled = { signal = got.stopped, step = 0 } }
  end
  local start, consumed, resumed = got.start, got.consumed, got.resumed
  seed = got.seed
  local init_hf = ck.init_hf
  if init_hf == nil then init_hf = r.model.from_hf end
  if not resumed and init_hf then
    local field = ck.init_hf and "checkpoint.init_hf" or "model.from_hf"
    local ok, e = pcall(hf.import, sharded, cfg, init_hf, { seq = T })
    if not ok then
      sharded:free() -- now, while the mesh it uses is alive (the collector's order is any)
      error(where .. ": " .. field .. ": " .. tostring(e), 0)
    end
    say("initial weights from %s", init_hf)
  end
  -- beside the weights, every checkpoint (its hf/ folder) and the export
  -- carry the model's config.json and its tokenizer's files (fsdp.hf_files)
  local data_tok = require("fsdp.token_manifest").tokenizer_of(r)
  local carried, carried_from = hf_files.carried({ from_hf = init_hf or r.model.from_hf, resumed = resumed, vocab_size = cfg.vocab_size,
    max_len = cfg.max_position_embeddings, bytes = r.data.token_file == nil or data_tok == "bytes",
    tokenizer_dir = data_tok ~= "bytes" and data_tok or nil })
  local carry = { ["config.json"] = hf_config.encode(cfg, "fp32") }
  for k, v in pairs(carried or {}) do carry[k] = v end
  local train_loader = ds:loader({ split = "train", batch = B, seq = T, rank = dp_rank, world = dp, seed = seed,
    state = { consumed = consumed } })

  local n_params = llama.num_params(cfg)
  local flops_tok = llama.flops_per_token(cfg, T)
  -- MFU: model FLOPs over the hardware's peak (fsdp.peak, docs/TRAINING.md);
  -- gemm_frac: over a GEMM rate measured now
  local bound = ffi.new("int[1]")
  C.fsdp_rank_cores(bound)
  local the_peak = peak.for_rank({ device = device, dtype = r.fsdp.param_dtype, ranks = ranks_per_device, bound = bound[0] == 1,
    override = r.train.peak_tflops, gpu_name = device == "cuda" and fsdp.device_name(device) or nil,
    cpu = device ~= "cuda" and not r.train.peak_tflops and peak.this_cpu() or nil })
  local gemm_rate = peak.gemm_rate(fsdp, device, r.fsdp.param_dtype)
  local tokens_step = B * T * K * dp
  say("fsdp: %s parameters in %d units over %d ranks (mesh %s, %s, %s params); %d tokens per step (%d x %d x %d " ..
    "micro-batches x %d ranks); planned %.2f GiB per rank", human(n_params), #sharded.units, info.size,
    type(r.mesh) == "string" and r.mesh or "custom", planner.zero_text(the_plan), r.fsdp.param_dtype, tokens_step, B, T, K, dp,
    planner.gib(need.total))
  if device == "cuda" then
    -- cuDNN's deterministic backward holds partial sums growing with seq^2: say what it costs
    local ws = the_plan.attention_workspace.backward
    say("attention: %s%s", ops.attention_choice(r.fsdp.param_dtype, B, T, cfg.num_attention_heads,
      cfg.num_key_value_heads, cfg.head_dim), ws >= 2 ^ 20 and string.format("; its backward's workspace %.2f GiB (in the plan%s)",
      ws / 2 ^ 30, os.getenv("FSDP_CUDNN_DETERMINISTIC") ~= "0" and "; deterministic: FSDP_CUDNN_DETERMINISTIC=0 takes less" or "")
      or "")
  end
  say("fsdp: MFU peak: %s; GEMM rate measured now: %sFLOP/s per rank (gemm_frac in the metrics)%s", the_peak.what,
    human(gemm_rate), device == "cpu" and "; " .. ffi.string(C.fsdp_blas_core_note()) or "")

  local metrics
  if my_rank == 0 and r.train.metrics then
    local dir = r.train.metrics:match("^(.*)/[^/]*$")
    if dir then mkdir_p(dir) end
    metrics = metrics_file.open(r.train.metrics, { resumed_at = resumed and start - 1 or nil, where = where })
    if metrics.failed then -- (a resumed run: it goes on without them, as after a failed write mid-run)
      metrics.warned = true
      io.stderr:write(string.format("fsdp: warning: train.metrics: %s; this resumed run goes on without metrics\n",
        metrics.failed))
    elseif metrics.dropped > 0 then
      say("metrics: %s continues after step %d (%d records of steps after the checkpoint dropped)", r.train.metrics,
        start - 1, metrics.dropped)
    end
  end
  local function record(t)
    if metrics and not metrics:record(t) and not metrics.warned then
      metrics.warned = true
      io.stderr:write(string.format("fsdp: warning: train.metrics: writing %s failed (%s); no more metrics are written " ..
        "in this run\n", r.train.metrics, metrics.failed))
    end
  end
  local function loss_fn(logits, b, scale) return llama.loss(logits, b.y, scale, nil, b.y_dev) end
  -- train.loss_chunk_mb > 0: the head and the loss fused over chunks of rows (no full logits)
  local chunk = r.train.loss_chunk_mb
  local forward_loss = llama.step_loss(chunk * 2 ^ 20).forward_loss -- (as the planner's dry run)
  local V = cfg.vocab_size
  local function next_batch(loader)
    local x, y = loader:next()
    local b = { x = as_ids(x, B, T), y = as_ids(y, B, T) }
    if device == "cuda" then -- ids are checked here: the GPU's embedding cannot report one
      local p = b.x:ptr()
      for i = 0, B * T - 1 do
        if p[i] < 0 or p[i] >= V then
          error(string.format("%s: token id %d in the data is outside model.vocab_size = %d", where, p[i], V), 0)
        end
      end
      b.x = fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(b.x)
      b.y_dev = fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(b.y)
    end
    return b
  end

  local function evaluate()
    local vl = ds:loader({ split = "val", batch = B, seq = T, rank = dp_rank, world = dp, seed = seed })
    return autograd.scope(function() -- the batches' tensors go with it
      local batches = {}
      for i = 1, r.train.eval_batches do batches[i] = next_batch(vl) end
      return sharded:evaluate(batches, function(logits, b) return (llama.loss(logits, b.y, 0, nil, b.y_dev)) end,
        { forward_loss = forward_loss, stop_every = 4 })
    end)
  end

  -- train.sample_tokens: text from the model at each evaluation, on every
  -- rank (its forward gathers units: collective), printed by rank 0; the
  -- same prompt and seed each time, so the samples show what was learned
  local sampler, sample_prompt
  if r.train.sample_tokens > 0 and r.train.eval_every > 0 then -- the prompt checked now, not at the first evaluation
    sampler = require("fsdp.generate").wrap(sharded, cfg, { files = carried or {}, dir = carried_from, source = where })
    local text = r.train.sample_prompt or "The "
    local ok, ids = pcall(sampler.encode, sampler, text)
    if not ok then error(where .. ": train.sample_prompt: " .. tostring(ids), 0) end
    if #ids == 0 then error(where .. ": train.sample_prompt is empty (at least one token is needed)", 0) end
    if #ids >= cfg.max_position_embeddings then
      error(string.format("%s: train.sample_prompt is %d tokens; the model's max_position_embeddings is %d: no room " ..
        "for a sample. Shorten it", where, #ids, cfg.max_position_embeddings), 0)
    end
    sample_prompt = ids
  end
  local function sample_text()
    local n = math.min(r.train.sample_tokens, cfg.max_position_embeddings - #sample_prompt)
    local ids = sampler:generate(sample_prompt, { max_new_tokens = math.max(n, 1), temperature = r.train.sample_temperature,
      top_k = 40, seed = seed })
    local all = {}
    for _, v in ipairs(sample_prompt) do all[#all + 1] = v end
    for _, v in ipairs(ids) do all[#all + 1] = v end
    return (sampler:decode(all):gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub("\r", "\\r"))
  end

  local tty = my_rank == 0 and fsdp.on_terminal(info)
  local steps = r.train.steps
  local warmup_note = M.warmup_warning(r)
  if warmup_note then say("fsdp: warning: %s", warmup_note) end
  local function save(step, lr, async)
    return cm:save(sharded, step, { step = step, optimizer_step = sharded.step_count, consumed = train_loader.consumed,
      seed = seed, lr = lr, world = info.size, zero = r.fsdp.zero, optimizer = o.name, param_dtype = r.fsdp.param_dtype,
      skipped = sharded.skipped or 0, model = where, seq = T, micro_batch = B, windows = train_loader.nwin, dp = dp,
      grad_accum = K, global_batch_tokens = tokens_step }, carry, async)
  end
  local function committed(path) cm:committed(path) end
  local t_start, tokens_done, first_loss, last_loss = C.fsdp_time_now(), 0, nil, nil
  local run_peak, sharing_test = 0, os.getenv("FSDPRUN_RANKS_PER_GPU") ~= nil
  local t_steady, steady_tokens, losses, bad_in_row = nil, 0, {}, 0
  local steady_from = start + 1
  if start > steps then say("nothing to train: %s holds step %d and train.steps = %d", resumed, start - 1, steps) end
  local last = math.min(steps, r.train.stop_after or steps)
  -- fsdprun --repl [--break-at STEP]: a prompt on rank 0 at that step
  local next_break = os.getenv("FSDP_REPL") == "1" and (break_at or tonumber(os.getenv("FSDP_BREAK_AT") or "") or 0) or nil
  local live
  local function prompt(step)
    live = live or { sharded = sharded, recipe = r, where = where, rank = my_rank, size = info.size, world = mesh:group("world") }
    live.step = step
    local t0 = C.fsdp_time_now()
    local k = require("fsdp.repl").live(live)
    local paused = C.fsdp_time_now() - t0 -- time at the prompt is not training time
    t_start = t_start + paused
    if t_steady then t_steady = t_steady + paused end
    next_break = k and step + k or nil
    return k ~= nil
  end
  local stopped = next_break and next_break < start and not prompt(start - 1)
  local signalled -- {signal, step, saved}: stopped by a signal after that step
  -- train.profile: one step's timeline (fsdp.profile), rank 0's; by
  -- default the second step of this run (the first runs the one-time set-up)
  local profile_step = my_rank == 0 and r.train.profile and (r.train.profile_step or math.min(start + 1, last)) or nil
  if profile_step and (profile_step < start or profile_step > last) then
    io.stderr:write(string.format("fsdp: warning: train.profile_step = %d is outside this run's steps %d-%d: no " ..
      "profile is written\n", profile_step, start, last))
  end
  local function profile_begin(step)
    if step ~= profile_step then return nil end
    local settle = function() sharded:synchronize() end
    return profile.start({ device = device, stream = device == "cuda" and ops.compute_stream() or nil,
      names = nn.paths(model), settle = settle }), settle
  end
  local function profile_end(prof, settle, step)
    prof:finish(settle)
    say("%s", prof:report(15))
    local path = r.train.profile
    local dir = path:match("^(.*)/[^/]*$")
    if dir then mkdir_p(dir) end
    local f, err = io.open(path .. ".tmp", "w")
    local ok = f and f:write(prof:trace({ step = step, recipe = where, device = device })) and f:close()
    if ok and os.rename(path .. ".tmp", path) then
      say("profile: step %d's timeline written to %s (open it in ui.perfetto.dev or chrome://tracing)", step, path)
    else
      if f then os.remove(path .. ".tmp") end
      io.stderr:write(string.format("fsdp: warning: train.profile: writing %s failed (%s); training goes on\n", path,
        tostring(err or "write error")))
    end
  end
  C.fsdp_stop_signals_watch(1)
  owned.training = true -- from here a failure is a fault, not the job's configuration
  for step = start, stopped and -1 or last do
    C.fsdp_heartbeat(step) -- fsdprun --heartbeat-timeout: alive, at this step
    stall_hook(my_rank, step)
    restarts.test_kill(restart, my_rank, step)
    fsdp.memory_reset_peak(device)
    local prof, settle = profile_begin(step)
    local t0 = C.fsdp_time_now()
    local lr = schedule.lr(step, steps, { lr = o.lr, warmup = r.schedule.warmup, decay = r.schedule.decay,
      min_lr_ratio = r.schedule.min_lr_ratio })
    -- one scope per step: the batches' tensors (host and device) are freed
    -- when it ends, not whenever the collector runs
    local loss, norm, warn = autograd.scope(function()
      local batches = {}
      for k = 1, K do batches[k] = next_batch(train_loader) end
      return sharded:train_step(batches, { optimizer = o.name, lr = lr, beta1 = o.beta1, beta2 = o.beta2,
        eps = o.eps, weight_decay = o.weight_decay, clip = o.clip > 0 and o.clip or nil, momentum = o.momentum, loss = loss_fn,
        forward_loss = forward_loss })
    end)
    if prof then profile_end(prof, settle, step) end
    local dt = C.fsdp_time_now() - t0
    tokens_done = tokens_done + tokens_step
    if step == steady_from then t_steady = t0 end
    if step >= steady_from then steady_tokens = steady_tokens + tokens_step end
    first_loss = first_loss or loss
    last_loss = loss
    losses[step] = loss
    local tps = tokens_step / dt
    local rank_flops = flops_tok * tps / dp -- model FLOP/s of one rank
    local mfu = the_peak.flops and rank_flops / the_peak.flops or nil
    local mstats = fsdp.memory_stats(device)
    local mem = mstats.peak
    run_peak = math.max(run_peak, mem)
    if warn then say("step %d: %s", step, warn) end
    local logged = step % r.train.log_every == 0 or step == last
    -- on a terminal the progress line moves every step (redrawn in place),
    -- and stays as a line of the log every log_every steps
    if logged or tty then
      local elapsed = C.fsdp_time_now() - t_start
      local eta = elapsed / (step - start + 1) * (last - step)
      local bar = ""
      if tty then
        local w = 20
        local f = math.floor(w * step / steps)
        bar = "[" .. string.rep("#", f) .. string.rep(".", w - f) .. "] "
      end
      local line = string.format("%sstep %d/%d | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | %.3f s | mfu %s | mem %.0f MiB%s | " ..
        "eta %s%s%s", bar, step, steps, loss, lr, norm, human(tps), dt, mfu and string.format("%.1f%%", 100 * mfu) or "n/a",
        mem / 2 ^ 20, sharded.host_step_s and string.format(" | host step %.3f s", sharded.host_step_s) or "", duration(eta),
        restarts.suffix(restart), metrics and metrics.failed and " | metrics NOT written" or "")
      if logged then
        say("%s", line)
      else -- (tty: rank 0)
        io.stdout:write("\r\27[K", line)
        io.stdout:flush()
        bar_open = true
      end
    end
    record({ step = step, loss = loss, lr = lr, grad_norm = norm, tokens_per_s = tps, step_time_s = dt, mfu = mfu,
      gemm_frac = rank_flops / gemm_rate, mem_bytes = mem, mem_reserved_bytes = mstats.peak_reserved, tokens = tokens_done,
      host_step_s = sharded.host_step_s,
      skipped = warn and true or nil, attempt = restart and restart.attempt })
    -- a step skipped for non-finite values changes nothing; several in a
    -- row mean the run has diverged (or its weights are gone): stop
    bad_in_row = warn and bad_in_row + 1 or 0
    if bad_in_row >= r.train.max_bad_steps then
      error(string.format("%s: steps %d to %d were all skipped (step %d: %s): the run has diverged. Lower optimizer.lr, " ..
        "raise schedule.warmup, or resume from an earlier checkpoint (train.max_bad_steps = %d)", where,
        step - bad_in_row + 1, step, step, warn, r.train.max_bad_steps), 0)
    end
    if r.train.eval_every > 0 and (step % r.train.eval_every == 0 or step == last) then
      local vloss, evaluated = evaluate()
      if sharded.stop_signal then -- a stop during the evaluation: it ends here, and the step is saved below
        say("eval step %d | stopped by a signal after %d of %d batches: no val_loss recorded; %s", step, evaluated,
          r.train.eval_batches, ck.dir and string.format("saving step %d now (if the grace period runs out first, " ..
          "nothing is saved and train.resume=auto goes on from %s)", step, checkpoint.latest_name(ck.dir) or "no checkpoint yet")
          or "nothing to save (no checkpoint.dir)")
      else
        say("eval step %d | val_loss %.4f", step, vloss)
        record({ step = step, val_loss = vloss })
        if sampler then say("sample step %d | %s", step, sample_text()) end
      end
    end
    committed(checkpoint.poll(sharded))
    -- a stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1) on any rank: every
    -- rank has finished this step; save it, synchronously, and stop
    local sig, saved = sharded.stop_signal, nil
    if ck.dir and ((ck.every > 0 and step % ck.every == 0) or step == last or sig) then
      saved = save(step, lr, not sig and nil or false)
      committed(saved)
    end
    if sig then
      signalled = { signal = sig, step = step, saved = saved }
      break
    end
    if next_break == step and not prompt(step) then stopped = true; break end
  end
  if next_break and not stopped then -- the run is over: one last look
    say("fsdp: training finished (train.steps = %d); continue(k) cannot train further", steps)
    prompt(math.min(last, steps))
  end
  committed(checkpoint.wait(sharded))
  -- stopped by a signal and saved: the launcher's SIGTERM to the ranks
  -- still ending (srun -K after the first exited 138) is ignored, so the
  -- job's status stays the first signal's
  -- (still watched during an export: a stop there ends it cleanly)
  C.fsdp_stop_signals_watch(signalled and 2 or 1)
  if ck.export_hf and not signalled then
    local ok, e = pcall(hf.export, sharded, cfg, ck.export_hf, { dtype = ck.export_dtype, shard_bytes = ck.export_shard_mb * 1e6,
      files = carry })
    local sig = not ok and sharded:stop_agreed() -- (the export failed on every rank: a stop signal, or not)
    if sig then -- stopped during the export: nothing half-written is left, the run is in its checkpoint
      signalled = { signal = sig, step = last, saved = cm.last_saved, note = string.format("during the export to %s: " ..
        "nothing exported (%s.tmp removed)", ck.export_hf, ck.export_hf:gsub("/+$", "")) }
    elseif not ok then
      error(where .. ": checkpoint.export_hf: " .. tostring(e), 0)
    else
      say("exported %s (%d files, %s bytes, %s) for Hugging Face", ck.export_hf, e.files, human(e.bytes), ck.export_dtype)
    end
  end
  C.fsdp_stop_signals_watch(signalled and 2 or 0)
  local wall = C.fsdp_time_now() - t_start
  local steady = t_steady and steady_tokens / (C.fsdp_time_now() - t_steady) or tokens_done / wall
  if first_loss then
    say("done: %d steps in %s; loss %.4f -> %.4f; %s tok/s after the first step (%s over %d ranks)", tokens_done / tokens_step,
      duration(wall), first_loss, last_loss, human(steady), human(tokens_done) .. " tokens", info.size)
  end
  if metrics then metrics:close() end
  if sharing_test and first_loss then -- every rank: fsdprun --ranks-per-gpu checks each one's bytes against its plan
    local plan = device == "cuda" and need.device or need.total
    print(string.format("fsdp: rank %d memory: peak %d bytes, planned %d bytes per rank on the %s (%+.2f%%)", my_rank, run_peak,
      plan, device, 100 * (run_peak - plan) / plan))
    io.stdout:flush()
  end
  if signalled then -- rank 0 says so before any rank exits (fsdprun would stop the others at the first exit)
    if my_rank == 0 then
      local s = signalled
      io.stderr:write(string.format("fsdp: stopped by %s after step %d%s; %s\n", s.signal > 0 and
        ffi.string(C.fsdp_signal_name(s.signal)) or "a signal to another rank", s.step, s.note and " " .. s.note or "",
        s.saved and "checkpoint saved at " .. s.saved .. " (train.resume=auto continues from it)" or
        "nothing saved (no checkpoint.dir)"))
      io.stderr:flush()
    end
    mesh:group("world"):barrier()
  end
  cm:release()
  sharded:free()
  mesh:free()
  return { first_loss = first_loss, last_loss = last_loss, losses = losses, tokens_per_s = steady, peak = the_peak,
    flops_per_token = flops_tok, metrics_failed = metrics and metrics.failed, signalled = signalled }
end

-- Trains recipe r (from file `where`, with command-line overrides args).
-- On one rank, whatever way it ends, the model and the mesh it made are
-- freed before it returns or raises, not left to the collector. On several
-- ranks a failed run leaves them: freeing drains the comm streams, which
-- could wait out FSDP_COMM_TIMEOUT for a peer that is not coming, and the
-- job ends anyway.
function M.run(r, where, args, break_at, owned)
  owned = owned or {}
  local ok, out = pcall(run, r, where, args, break_at, owned)
  if not ok then
    C.fsdp_stop_signals_watch(0)
    profile.abandon()
    dir_lock.release(owned.lock)
    -- (fsdp.init itself may be what failed: asked again, it would raise
    -- again, from here, with a traceback hiding the message)
    local booted, info = pcall(fsdp.init)
    if booted and info.size == 1 then
      if owned.sharded and not owned.sharded.freed then pcall(owned.sharded.free, owned.sharded) end
      if owned.mesh then pcall(owned.mesh.free, owned.mesh) end
    end
    error(out, 0)
  end
  return out
end

-- A job refused for its own configuration (the recipe, its arguments, its
-- checkpoint.dir) ends with this status, sysexits' EX_CONFIG: fsdprun
-- --max-restarts never restarts it (a restart would add train.resume=auto
-- and could continue another run's history), and a scheduler can tell it
-- from a fault.
M.REFUSED = 78

-- Whether an error before the first step is the job's configuration: the
-- trainer's own refusals name the recipe file first; a peer, a collective
-- or a device that failed (a fault a restart may get past) is not one.
function M.is_refusal(msg, where)
  msg = tostring(msg)
  if msg:sub(1, #where + 2) ~= where .. ": " then return false end
  for _, fault in ipairs({ "left the job", "collective", "comm '", "timed out", "did not finish within", "FSDP_ECOMM",
    "FSDP_ETIMEOUT", "FSDP_EDEVICE", "out of memory", "FSDP_ENOMEM" }) do
    if msg:find(fault, 1, true) then return false end
  end
  return true
end

local function refuse(msg)
  local booted, info = pcall(fsdp.init)
  io.stdout:flush()
  if booted and info.size > 1 then
    fsdp.abort(M.REFUSED, msg) -- (returns: the launcher ends the job)
    os.exit(M.REFUSED)
  end
  io.stderr:write("fsdp: ", msg, "\n")
  io.stderr:flush()
  os.exit(M.REFUSED)
end

-- `fsdp RECIPE.lua args...`: the rank host calls this when a file returns a table
-- (`--break-at STEP` may follow the recipe: fsdprun -n 2 --repl r.lua --break-at 10)
function M.main(r, path, ...)
  local args, break_at = {}, nil
  local a = { ... }
  local i = 1
  while i <= #a do
    local v = a[i]:match("^%-%-break%-at=(.*)$")
    if a[i] == "--break-at" then i = i + 1; v = a[i] or "" end
    if v then
      break_at = tonumber(v)
      if not break_at or break_at < 0 or break_at % 1 ~= 0 then error(path .. ": --break-at expects a step number >= 0", 0) end
      if os.getenv("FSDP_REPL") ~= "1" then error(path .. ": --break-at needs fsdprun --repl", 0) end
    else
      args[#args + 1] = a[i]
    end
    i = i + 1
  end
  local owned = {}
  local ok, out = pcall(M.run, r, path, args, break_at, owned)
  if not ok then
    if not owned.training and M.is_refusal(out, path) then refuse(tostring(out)) end
    error(out, 0)
  end
  local s = out.signalled
  if s then -- the status a process ended by that signal would have (rank 0 has said what was kept)
    io.stdout:flush()
    os.exit(128 + (s.signal > 0 and s.signal or 15))
  end
  return out
end

return M
