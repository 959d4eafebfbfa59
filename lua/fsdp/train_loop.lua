-- fsdp.train_loop: the trainer's steps, from the first to the last or a
-- stop: per step the batches, sharded:train_step, the step line and the
-- metrics record (and TensorBoard event), an evaluation and a sample, a
-- checkpoint, the REPL's break, a step's profile. It works on the job that
-- fsdp.train built (J, whose fields fsdp.job declares: the recipe, the
-- mesh, the sharded model, the data, the checkpoint manager) and leaves in it how the loop ended (J.signalled,
-- J.stopped) and what it measured (J.stats) for fsdp.train's finish.
local fsdp = require "fsdp"
local schedule = require "fsdp.schedule"
local llama = require "fsdp.models.llama"
local checkpoint = require "fsdp.checkpoint"
local ops = require "fsdp.ops"
local peak = require "fsdp.peak"
local metrics_file = require "fsdp.metrics"
local tensorboard = require "fsdp.tensorboard"
local autograd = require "fsdp.autograd"
local restarts = require "fsdp.restarts"
local profile = require "fsdp.profile"
local plan_render = require "fsdp.plan_render"
local nn = require "fsdp.nn"
local ffi, C = fsdp.ffi, fsdp.C
local pretty = require "fsdp.pretty"
local human = pretty.count

local M = {}

pcall(ffi.cdef, "int kill(int pid, int sig); int getpid(void); int usleep(unsigned int us);")

-- the folder of a file the run writes (metrics, profile): a failure here
-- shows as the file's own, named, when it is opened
local function make_parent(path)
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then C.fsdp_fs_mkdirs(dir) end
end

function M.duration(s)
  if s >= 3600 then return string.format("%dh%02dm", s / 3600, (s % 3600) / 60) end
  if s >= 60 then return string.format("%dm%02ds", s / 60, s % 60) end
  return string.format("%ds", s)
end

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

-- int32 {B, T} tensors from whatever the loader returns
local function as_ids(v, B, T)
  if type(v) == "table" and v.dtype == "int32" then return v end
  local t = fsdp.tensor({ B, T }, "int32")
  ffi.copy(t:ptr(), v, B * T * 4)
  return t
end

-- a micro-batch from loader: ids checked on a GPU (its embedding cannot
-- report one); packed rows' layout and masked or packed targets' count
-- ride along (train_step weights micro-batches by their targets)
local function next_batch(J, loader)
  local B, T, V = J.B, J.T, J.cfg.vocab_size
  local x, y, extra = loader:next()
  local b = { x = as_ids(x, B, T), y = as_ids(y, B, T) }
  if extra then b.doc_start, b.count = extra.doc_start, extra.count end
  if J.device == "cuda" then
    local p = b.x:ptr()
    for i = 0, B * T - 1 do
      if p[i] < 0 or p[i] >= V then
        error(string.format("%s: token id %d in the data is outside model.vocab_size = %d", J.where, p[i], V), 0)
      end
    end
    b.x = fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(b.x)
    b.y_dev = fsdp.tensor({ B, T }, "int32", "cuda"):copy_from(b.y)
  end
  return b
end

local function evaluate(J)
  local r = J.r
  local vl = J.ds:loader({ split = "val", batch = J.B, seq = J.T, rank = J.dp_rank, world = J.dp, seed = J.seed })
  return autograd.scope(function() -- the batches' tensors go with it
    local batches = {}
    for i = 1, r.train.eval_batches do batches[i] = next_batch(J, vl) end
    return J.sharded:evaluate(batches, function(logits, b) return (llama.loss(logits, b.y, 0, nil, b.y_dev)) end,
      { forward_loss = J.forward_loss, stop_every = 4 })
  end)
end

-- train.sample_tokens: text from the model at each evaluation, on every
-- rank (its forward gathers units: collective), printed by rank 0; the
-- same prompt and seed each time, so the samples show what was learned.
-- The prompt is checked now, not at the first evaluation. At any mesh:
-- tp ranks generate with their heads, cp ranks the whole sequence
-- (llama's forward_last).
local function open_sampler(J)
  local r, cfg, where = J.r, J.cfg, J.where
  if not (r.train.sample_tokens > 0 and r.train.eval_every > 0) then return end
  J.sampler = require("fsdp.generate").wrap(J.sharded, cfg, { files = J.carried or {}, dir = J.carried_from, source = where })
  local ok, ids = pcall(J.sampler.encode, J.sampler, r.train.sample_prompt or "The ")
  if not ok then error(where .. ": train.sample_prompt: " .. tostring(ids), 0) end
  if #ids == 0 then error(where .. ": train.sample_prompt is empty (at least one token is needed)", 0) end
  if #ids >= cfg.max_position_embeddings then
    error(string.format("%s: train.sample_prompt is %d tokens; the model's max_position_embeddings is %d: no room " ..
      "for a sample. Shorten it", where, #ids, cfg.max_position_embeddings), 0)
  end
  J.sample_prompt = ids
end

local function sample_text(J)
  local r, prompt = J.r, J.sample_prompt
  local n = math.min(r.train.sample_tokens, J.cfg.max_position_embeddings - #prompt)
  local ids = J.sampler:generate(prompt, { max_new_tokens = math.max(n, 1), temperature = r.train.sample_temperature,
    top_k = 40, seed = J.seed })
  local all = {}
  for _, v in ipairs(prompt) do all[#all + 1] = v end
  for _, v in ipairs(ids) do all[#all + 1] = v end
  return (J.sampler:decode(all):gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub("\r", "\\r"))
end

-- MFU: model FLOPs over the hardware's peak (fsdp.peak, docs/TRAINING.md);
-- gemm_frac: over a GEMM rate measured now. Said once, with the job's shape.
local function open_rates(J)
  local r, device = J.r, J.device
  local bound = ffi.new("int[1]")
  C.fsdp_rank_cores(bound)
  J.flops_tok = llama.flops_per_token(J.cfg, J.T)
  J.the_peak = peak.for_rank({ device = device, dtype = r.fsdp.param_dtype, ranks = J.ranks_per_device, bound = bound[0] == 1,
    override = r.train.peak_tflops, gpu_name = device == "cuda" and fsdp.device_name(device) or nil,
    cpu = device ~= "cuda" and not r.train.peak_tflops and peak.this_cpu() or nil })
  J.gemm_rate = peak.gemm_rate(fsdp, device, r.fsdp.param_dtype)
  local cfg, B, T, K, dp = J.cfg, J.B, J.T, J.K, J.dp
  J.say("fsdp: %s parameters in %d units over %d ranks (mesh %s, %s, %s params); %d tokens per step (%d x %d x %d " ..
    "micro-batches x %d ranks); planned %.2f GiB per rank", human(llama.num_params(cfg)), #J.sharded.units, J.info.size,
    type(r.mesh) == "string" and r.mesh or "custom", plan_render.zero_text(J.plan), r.fsdp.param_dtype, J.tokens_step, B, T, K,
    dp, pretty.gib(J.need.total))
  if device == "cuda" and r.data.pack then
    J.say("attention: packed rows: our CUDA-core kernels (kernels/attention.cu), attention within each document")
  elseif device == "cuda" then
    -- cuDNN's deterministic backward holds partial sums growing with seq^2: say what it costs
    local ws = J.plan.attention_workspace.backward
    J.say("attention: %s%s", ops.attention_choice(r.fsdp.param_dtype, B, T, cfg.num_attention_heads,
      cfg.num_key_value_heads, cfg.head_dim), ws >= 2 ^ 20 and string.format("; its backward's workspace %.2f GiB (in the plan%s)",
      ws / 2 ^ 30, os.getenv("FSDP_CUDNN_DETERMINISTIC") ~= "0" and "; deterministic: FSDP_CUDNN_DETERMINISTIC=0 takes less" or "")
      or "")
  end
  J.say("fsdp: MFU peak: %s; GEMM rate measured now: %sFLOP/s per rank (gemm_frac in the metrics)%s", J.the_peak.what,
    human(J.gemm_rate), device == "cpu" and "; " .. ffi.string(C.fsdp_blas_core_note()) or "")
end

-- train.metrics: rank 0's JSONL file; a failed write warns once and the run goes on
local function open_metrics(J)
  local r = J.r
  if J.info.rank ~= 0 or not r.train.metrics then return end
  make_parent(r.train.metrics)
  local metrics = metrics_file.open(r.train.metrics, { resumed_at = J.resumed and J.start - 1 or nil, where = J.where })
  J.metrics = metrics
  if metrics.failed then -- (a resumed run: it goes on without them, as after a failed write mid-run)
    metrics.warned = true
    io.stderr:write(string.format("fsdp: warning: train.metrics: %s; this resumed run goes on without metrics\n",
      metrics.failed))
  elseif metrics.dropped > 0 then
    J.say("metrics: %s continues after step %d (%d records of steps after the checkpoint dropped)", r.train.metrics,
      J.start - 1, metrics.dropped)
  end
end

-- train.tensorboard: the same records as TensorBoard events in rank 0's
-- directory (fsdp.tensorboard), kept across resumes and failing as metrics do
local function open_tensorboard(J)
  local r = J.r
  if J.info.rank ~= 0 or not r.train.tensorboard then return end
  local tb = tensorboard.open(r.train.tensorboard, { resumed_at = J.resumed and J.start - 1 or nil, where = J.where })
  J.tensorboard = tb
  if tb.failed then
    tb.warned = true
    io.stderr:write(string.format("fsdp: warning: train.tensorboard: %s; this resumed run goes on without TensorBoard " ..
      "events\n", tb.failed))
  elseif tb.dropped > 0 then
    J.say("tensorboard: %s continues after step %d (%d events of steps after the checkpoint dropped)", tb.path,
      J.start - 1, tb.dropped)
  end
end

local function record(J, t)
  local metrics, tb = J.metrics, J.tensorboard
  if metrics and not metrics:record(t) and not metrics.warned then
    metrics.warned = true
    io.stderr:write(string.format("fsdp: warning: train.metrics: writing %s failed (%s); no more metrics are written " ..
      "in this run\n", J.r.train.metrics, metrics.failed))
  end
  if tb and not tb:record(t) and not tb.warned then
    tb.warned = true
    io.stderr:write(string.format("fsdp: warning: train.tensorboard: writing %s failed (%s); no more events are " ..
      "written in this run\n", tb.path, tb.failed))
  end
end

-- train.profile: one step's timeline (fsdp.profile), rank 0's; by default
-- the second step of this run (the first runs the one-time set-up)
local function choose_profile_step(J)
  local r = J.r
  local step = J.info.rank == 0 and r.train.profile and (r.train.profile_step or math.min(J.start + 1, J.last)) or nil
  if step and (step < J.start or step > J.last) then
    io.stderr:write(string.format("fsdp: warning: train.profile_step = %d is outside this run's steps %d-%d: no " ..
      "profile is written\n", step, J.start, J.last))
  end
  return step
end

local function profile_begin(J, step)
  if step ~= J.profile_step then return nil end
  local settle = function() J.sharded:synchronize() end
  return profile.start({ device = J.device, stream = J.device == "cuda" and ops.compute_stream() or nil,
    names = nn.paths(J.model), settle = settle }), settle
end

local function profile_end(J, prof, settle, step)
  prof:finish(settle)
  J.say("%s", prof:report(15))
  local path = J.r.train.profile
  make_parent(path)
  local f, err = io.open(path .. ".tmp", "w")
  local ok = f and f:write(prof:trace({ step = step, recipe = J.where, device = J.device })) and f:close()
  if ok and os.rename(path .. ".tmp", path) then
    J.say("profile: step %d's timeline written to %s (open it in ui.perfetto.dev or chrome://tracing)", step, path)
  else
    if f then os.remove(path .. ".tmp") end
    io.stderr:write(string.format("fsdp: warning: train.profile: writing %s failed (%s); training goes on\n", path,
      tostring(err or "write error")))
  end
end

local function save(J, step, lr, async)
  local r, o, sharded, loader = J.r, J.r.optimizer, J.sharded, J.train_loader
  return J.cm:save(sharded, step, { step = step, optimizer_step = sharded.step_count, consumed = loader.consumed,
    seed = J.seed, lr = lr, world = J.info.size, zero = r.fsdp.zero, optimizer = o.name, param_dtype = r.fsdp.param_dtype,
    skipped = sharded.skipped or 0, model = J.where, seq = J.T, micro_batch = J.B, windows = loader.nwin, dp = J.dp,
    grad_accum = J.K, global_batch_tokens = J.tokens_step }, J.carry, async)
end

-- fsdprun --repl [--break-at STEP]: a prompt on rank 0 at that step; the
-- time spent there is not training time. Returns whether to go on.
local function prompt(J, step)
  local S = J.stats
  J.live = J.live or { sharded = J.sharded, recipe = J.r, where = J.where, rank = J.info.rank, size = J.info.size,
    world = J.mesh:group("world"), cfg = J.cfg, engine = J.engine }
  J.live.step = step
  local t0 = C.fsdp_time_now()
  local k = require("fsdp.repl").live(J.live)
  local paused = C.fsdp_time_now() - t0
  S.t_start = S.t_start + paused
  if S.t_steady then S.t_steady = S.t_steady + paused end
  J.next_break = k and step + k or nil
  return k ~= nil
end

-- the step's line: every log_every steps, and (rank 0 on a terminal)
-- redrawn in place every step as a progress bar
local function log_step(J, step, m)
  local r, S = J.r, J.stats
  local logged = step % r.train.log_every == 0 or step == J.last
  if not (logged or J.tty) then return end
  local elapsed = C.fsdp_time_now() - S.t_start
  local eta = elapsed / (step - J.start + 1) * (J.last - step)
  local bar = ""
  if J.tty then
    local w = 20
    local f = math.floor(w * step / r.train.steps)
    bar = "[" .. string.rep("#", f) .. string.rep(".", w - f) .. "] "
  end
  local host = J.sharded.host_step_s
  local line = string.format("%sstep %d/%d | loss %.4f | lr %.2e | gnorm %.3f | %s tok/s | %.3f s | mfu %s | mem %.0f MiB%s | " ..
    "eta %s%s%s%s", bar, step, r.train.steps, m.loss, m.lr, m.grad_norm, human(m.tokens_per_s), m.step_time_s,
    m.mfu and string.format("%.1f%%", 100 * m.mfu) or "n/a", m.mem_bytes / 2 ^ 20,
    host and string.format(" | host step %.3f s", host) or "", M.duration(eta), restarts.suffix(J.restart),
    J.metrics and J.metrics.failed and " | metrics NOT written" or "",
    J.tensorboard and J.tensorboard.failed and " | tensorboard NOT written" or "")
  if logged then J.say("%s", line) else J.progress(line) end
end

-- one optimizer step: K micro-batches in one scope (their tensors, host
-- and device, are freed when it ends, not whenever the collector runs)
local function train_one(J, step)
  local r, o, S = J.r, J.r.optimizer, J.stats
  C.fsdp_heartbeat(step) -- fsdprun --heartbeat-timeout: alive, at this step
  stall_hook(J.info.rank, step)
  restarts.test_kill(J.restart, J.info.rank, step)
  fsdp.memory_reset_peak(J.device)
  local prof, settle = profile_begin(J, step)
  local t0 = C.fsdp_time_now()
  local lr = schedule.lr(step, r.train.steps, { lr = o.lr, warmup = r.schedule.warmup, decay = r.schedule.decay,
    min_lr_ratio = r.schedule.min_lr_ratio })
  local loss, norm, warn = autograd.scope(function()
    local batches = {}
    for k = 1, J.K do batches[k] = next_batch(J, J.train_loader) end
    return J.sharded:train_step(batches, { optimizer = o.name, lr = lr, beta1 = o.beta1, beta2 = o.beta2,
      eps = o.eps, weight_decay = o.weight_decay, clip = o.clip > 0 and o.clip or nil, momentum = o.momentum,
      loss = J.loss_fn, forward_loss = J.forward_loss })
  end)
  if prof then profile_end(J, prof, settle, step) end
  local dt = C.fsdp_time_now() - t0
  S.tokens_done = S.tokens_done + J.tokens_step
  if step == J.start + 1 then S.t_steady = t0 end
  if step > J.start then S.steady_tokens = S.steady_tokens + J.tokens_step end
  S.first_loss = S.first_loss or loss
  S.last_loss = loss
  S.losses[step] = loss
  local tps = J.tokens_step / dt
  local rank_flops = J.flops_tok * tps / J.info.size -- model FLOP/s of one rank (tp ranks share a dp rank's)
  local mstats = fsdp.memory_stats(J.device)
  S.run_peak = math.max(S.run_peak, mstats.peak)
  return { step = step, loss = loss, lr = lr, grad_norm = norm, tokens_per_s = tps, step_time_s = dt,
    mfu = J.the_peak.flops and rank_flops / J.the_peak.flops or nil, gemm_frac = rank_flops / J.gemm_rate,
    mem_bytes = mstats.peak, mem_reserved_bytes = mstats.peak_reserved, tokens = S.tokens_done,
    host_step_s = J.sharded.host_step_s, skipped = warn and true or nil, attempt = J.restart and J.restart.attempt }, warn
end

-- several skipped steps in a row mean the run has diverged (or its weights are gone): stop
local function check_diverged(J, step, warn)
  local S, r = J.stats, J.r
  S.bad_in_row = warn and S.bad_in_row + 1 or 0
  if S.bad_in_row >= r.train.max_bad_steps then
    error(string.format("%s: steps %d to %d were all skipped (step %d: %s): the run has diverged. Lower optimizer.lr, " ..
      "raise schedule.warmup, or resume from an earlier checkpoint (train.max_bad_steps = %d)", J.where,
      step - S.bad_in_row + 1, step, step, warn, r.train.max_bad_steps), 0)
  end
end

-- train.eval_every: the validation loss (and a sample) after this step
local function eval_step(J, step)
  local r, ck = J.r, J.r.checkpoint
  if not (r.train.eval_every > 0 and (step % r.train.eval_every == 0 or step == J.last)) then return end
  local vloss, evaluated = evaluate(J)
  if J.sharded.stop_signal then -- a stop during the evaluation: it ends here, and the step is saved below
    J.say("eval step %d | stopped by a signal after %d of %d batches: no val_loss recorded; %s", step, evaluated,
      r.train.eval_batches, ck.dir and string.format("saving step %d now (if the grace period runs out first, " ..
      "nothing is saved and train.resume=auto goes on from %s)", step, checkpoint.latest_name(ck.dir) or "no checkpoint yet")
      or "nothing to save (no checkpoint.dir)")
  else
    J.say("eval step %d | val_loss %.4f", step, vloss)
    record(J, { step = step, val_loss = vloss })
    if J.sampler then J.say("sample step %d | %s", step, sample_text(J)) end
  end
end

-- Everything the loop needs beyond the built job, checked before step one.
function M.open(J)
  local r = J.r
  J.stats = { t_start = C.fsdp_time_now(), tokens_done = 0, steady_tokens = 0, run_peak = 0, losses = {}, bad_in_row = 0 }
  J.loss_fn = function(logits, b, scale) return llama.loss(logits, b.y, scale, nil, b.y_dev) end
  -- train.loss_chunk_mb > 0: the head and the loss fused over chunks of rows (no full logits)
  J.forward_loss = llama.step_loss(r.train.loss_chunk_mb * 2 ^ 20).forward_loss -- (as the planner's dry run)
  J.last = math.min(r.train.steps, r.train.stop_after or r.train.steps)
  open_rates(J)
  open_metrics(J)
  open_tensorboard(J)
  open_sampler(J)
  J.tty = J.info.rank == 0 and fsdp.on_terminal(J.info)
  local warmup_note = require("fsdp.preflight").warmup_warning(r)
  if warmup_note then J.say("fsdp: warning: %s", warmup_note) end
  if J.start > r.train.steps then
    J.say("nothing to train: %s holds step %d and train.steps = %d", J.resumed, J.start - 1, r.train.steps)
  end
  J.profile_step = choose_profile_step(J)
end

-- The steps from J.start to J.last; a stop signal, the REPL or a
-- diverged run ends them sooner. break_at: fsdprun --repl's first stop.
function M.run(J, break_at)
  local r, ck = J.r, J.r.checkpoint
  J.next_break = os.getenv("FSDP_REPL") == "1" and (break_at or tonumber(os.getenv("FSDP_BREAK_AT") or "") or 0) or nil
  J.stopped = J.next_break and J.next_break < J.start and not prompt(J, J.start - 1)
  C.fsdp_stop_signals_watch(1)
  J.owned.training = true -- from here a failure is a fault, not the job's configuration
  for step = J.start, J.stopped and -1 or J.last do
    local m, warn = train_one(J, step)
    if warn then J.say("step %d: %s", step, warn) end
    log_step(J, step, m)
    record(J, m)
    check_diverged(J, step, warn)
    eval_step(J, step)
    J.cm:committed(checkpoint.poll(J.sharded))
    -- a stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1) on any rank: every
    -- rank has finished this step; save it, synchronously, and stop
    local sig, saved = J.sharded.stop_signal, nil
    if ck.dir and ((ck.every > 0 and step % ck.every == 0) or step == J.last or sig) then
      saved = save(J, step, m.lr, not sig and nil or false)
      J.cm:committed(saved)
    end
    if sig then
      J.signalled = { signal = sig, step = step, saved = saved }
      break
    end
    if J.next_break == step and not prompt(J, step) then J.stopped = true; break end
  end
  if J.next_break and not J.stopped then -- the run is over: one last look
    J.say("fsdp: training finished (train.steps = %d); continue(k) cannot train further", r.train.steps)
    prompt(J, math.min(J.last, r.train.steps))
  end
  J.cm:committed(checkpoint.wait(J.sharded))
end

return M
