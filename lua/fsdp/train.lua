-- fsdp.train: the trainer behind `fsdprun -n N RECIPE.lua [section.field=value ...]`.
-- A job in four parts: pre-flight (the recipe checked, the memory it will
-- need against the machine before anything is allocated: fsdp.preflight),
-- build (the mesh, the checkpoints a resume loads: fsdp.checkpoint_manager,
-- the data, the Llama model sharded by the recipe's FSDP policy, its
-- weights), the loop (fsdp.train_loop: steps, evaluation, checkpoints,
-- metrics) and finish (the export, the summary, everything released). And
-- the refusals: a job refused for its configuration ends with status 78.
local fsdp = require "fsdp"
local recipe = require "fsdp.recipe"
local planner = require "fsdp.planner"
local llama = require "fsdp.models.llama"
local tp = require "fsdp.tp"
local data = require "fsdp.data"
local job = require "fsdp.job"
local engine = require "fsdp.engine"
local hf = require "fsdp.hf"
local ops = require "fsdp.ops"
local hf_config = require "fsdp.hf_config"
local hf_files = require "fsdp.hf_files"
local restarts = require "fsdp.restarts"
local dir_lock = require "fsdp.dir_lock"
local loop = require "fsdp.train_loop"
local checkpoint_manager = require "fsdp.checkpoint_manager"
local preflight = require "fsdp.preflight"
local profile = require "fsdp.profile"
local ffi, C = fsdp.ffi, fsdp.C
local human = require("fsdp.pretty").count

local M = {}

-- (the pre-flight checks live in fsdp.preflight; tests reach them here too)
for _, k in ipairs({ "ranks_per_gpu", "gpu_sharing_refusal", "warmup_warning" }) do M[k] = preflight[k] end

-- An error of fsdp.mesh or fsdp.data (messages that start so) is the
-- recipe's doing: raised again naming the recipe, without fsdp's source
-- position or status. Anything else (a program error) goes on as it was.
local function recipe_error(where, err)
  local msg = tostring(err):gsub("^[^:\n]+:%d+: ", "")
  if not (msg:find("^fsdp%.mesh: ") or msg:find("^data[.:]")) then error(err, 0) end
  error(string.format("%s: %s", where, (msg:gsub("^fsdp%.mesh: ", ""):gsub(" %(FSDP_%u+%)$", ""))), 0)
end

local function dataset_of(r, vocab_size, max_positions)
  local d = r.data
  if d.corpus then
    local c = {}
    for k, v in pairs(d.corpus) do c[k] = v end
    c.root = c.root or (debug.getinfo(1, "S").source:match("^@(.*)/lua/fsdp/[^/]*$") or ".")
    c.val_fraction = c.val_fraction or d.val_fraction
    return data.corpus(c)
  end
  require("fsdp.token_manifest").check(r, vocab_size) -- `fsdp prepare`'s manifest against the model
  local ds = data.token_file({ path = d.token_file, format = d.format, val_path = d.val_token_file,
    val_fraction = d.val_fraction, vocab_size = vocab_size })
  -- data.pack (build() settles its default): whole documents packed into
  -- rows, none seeing another
  if d.pack then ds:pack({ seq = d.seq, split_long = d.split_long, max_piece = max_positions }) end
  return ds
end

-- Rank 0's lines: J.say(fmt, ...) prints one; J.progress(line) draws the
-- progress line without its newline (a step between log lines), which the
-- next line said replaces.
local function console(J)
  local bar_open = false
  J.say = function(...)
    if J.info.rank ~= 0 then return end
    if bar_open then io.stdout:write("\r\27[K") bar_open = false end
    print(string.format(...))
    io.stdout:flush()
  end
  J.progress = function(line)
    io.stdout:write("\r\27[K", line)
    io.stdout:flush()
    bar_open = true
  end
end

-- The job's life, in four parts: pre-flight (the recipe against the
-- machine, before anything is allocated), build (mesh, checkpoints, data,
-- model, weights), the loop (fsdp.train_loop), finish (export, summary,
-- release). J is the job: what each part made, for the ones after it.

-- The mesh and the restart this is; a mesh the world cannot hold is the
-- recipe's mistake: named by its file, no trace.
local function build_mesh(J)
  local r, where, owned = J.r, J.where, J.owned
  local made, mesh = pcall(fsdp.mesh, r.mesh, { device = J.device })
  if not made then recipe_error(where, mesh) end
  owned.mesh = mesh
  J.mesh = mesh
  local names = {}
  for _, d in ipairs(mesh:dims()) do names[d.name or d[1]] = true end
  local dps = mesh:group("dp_shard") -- (recipe.check: the mesh has it)
  J.outer = names.dp_outer and mesh:group("dp_outer") or nil
  J.dp = dps:size() * (J.outer and J.outer:size() or 1)
  J.dp_rank = (J.outer and J.outer:rank() * dps:size() or 0) + dps:rank()
  -- context parallelism: the cp ranks of a data-parallel rank read the
  -- same rows and take their chunks; FSDP shards over dp_shard x cp
  J.shard = dps
  if names.cp and mesh:size("cp") > 1 then
    J.cp = mesh:group("cp")
    J.cpg = tp.group(J.cp)
    J.shard = mesh:group("dp_shard,cp")
  end
  -- tensor parallelism: the tp ranks of a data-parallel rank read the same
  -- batches (J.dp, J.dp_rank leave them out) and split its model
  if names.tp and mesh:size("tp") > 1 then
    J.tp = mesh:group("tp")
    J.tpg = tp.group(J.tp)
    local why = llama.tp_check(J.cfg, J.tp:size())
    if why then error(string.format("%s: mesh: %s", where, why), 0) end
    local span = preflight.tp_span(J.tp:size(), J.info.local_size, J.info.size, J.info.num_nodes)
    if span then J.say("fsdp: warning: %s", span) end
  end
  -- fsdprun --max-restarts: which attempt this is; restarting without
  -- checkpoints starts again at step 1 (allowed: a short run may want it)
  local restart = restarts.current()
  J.restart = restart
  if restart and restart.attempt > 0 then
    J.say("fsdp: restart %d of %d (fsdprun --max-restarts)", restart.attempt, restart.max)
  end
  if restart and restart.max > 0 and not r.checkpoint.dir and J.info.rank == 0 then
    io.stderr:write(string.format("fsdp: warning: fsdprun --max-restarts %d without checkpoint.dir: a restarted run " ..
      "starts again at step 1\n", restart.max))
  end
end

-- Pre-flight: the micro-batches a step takes (from the checkpoint a resume
-- will load, if any: fsdp.checkpoint_manager), the weights and optimizer
-- state against the machine, then the plan against what the device has.
local function preflight_checks(J, args, appended, original_resume)
  local r, where, info, cfg = J.r, J.where, J.info, J.cfg
  J.cm = checkpoint_manager.open(r, { where = where, rank = info.rank, shard = J.shard, outer = J.outer,
    appended = appended, original_resume = original_resume, say = J.say, owned = J.owned })
  J.K = J.cm:grad_accum(args, J.dp)
  -- the run's own from here on: the plan and the REPL's recipe (with
  -- train.global_batch_tokens, K is that one's already, and the REPL's
  -- plans on other world sizes work it out again from it)
  if not r.train.global_batch_tokens then r.train.grad_accum = J.K end
  -- (packed rows may be longer: positions restart at each document, whose
  -- pieces packing keeps within max_position_embeddings)
  if J.T > cfg.max_position_embeddings and not r.data.pack then
    error(string.format("%s: data.seq = %d exceeds model.max_position_embeddings = %d (packed rows, data.pack or " ..
      "data.max_tokens, may be longer: each document's positions restart)", where, J.T, cfg.max_position_embeddings), 0)
  end
  preflight.floor(r, cfg, where, info)
  -- (on a GPU: once it is selected, which cuDNN's plans need)
  J.plan = planner.plan(r, { world = info.size, where = where, strict = true,
    attention_workspace = J.device == "cuda" and ops.attention_workspace(r.fsdp.param_dtype, J.B, J.T,
      cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) or nil })
  J.need = J.plan.need
  preflight.memory(r, J.plan, where, info, J.ranks_per_device)
  -- the attention the plan chose (train.attention; "auto" past cuDNN's workspace bound: ours)
  if J.device == "cuda" then
    local which = ({ own = C.FSDP_ATTN_OWN, cudnn = C.FSDP_ATTN_CUDNN })[J.plan.attention_impl or r.train.attention]
    if which then fsdp.check(require("fsdp.ffi").cuda().fsdp_cuda_attention_impl_set(which), where .. ": train.attention") end
  end
end

-- The data, and its splits checked: a split shorter than one window fails
-- here, not at the first evaluation after training steps.
local function open_data(J)
  local r, where, T = J.r, J.where, J.T
  local read, ds = pcall(dataset_of, r, J.cfg.vocab_size, J.cfg.max_position_embeddings)
  if not read then recipe_error(where, ds) end
  if ds.vocab_size and ds.vocab_size > J.cfg.vocab_size then
    error(string.format("%s: the data has token ids up to %d but model.vocab_size = %d", where, ds.vocab_size - 1,
      J.cfg.vocab_size), 0)
  end
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
  J.ds = ds
  if ds.packed then -- what packing made of the documents (docs/TRAINING.md, "Documents, packing and loss masks")
    local st = ds.packed.train:stats()
    J.say("data: %d pieces of documents packed into %d rows of %d tokens (%.1f%% full%s%s)%s", st.pieces, st.rows, T,
      100 * st.fill, st.split > 0 and string.format("; %d long documents cut into pieces", st.split) or "",
      st.dropped > 0 and string.format("; %d documents of under 2 tokens left out", st.dropped) or "",
      ds.masked and "; targets where the loss mask says (the assistant's turns)" or "")
  end
end

local function build_model(J)
  local r = J.r
  J.model = llama.model(J.cfg, { checkpoint = r.fsdp.checkpoint, recompute = r.fsdp.recompute, tp = J.tpg, cp = J.cpg,
    cp_attention = r.train.cp_attention,
    tp_overlap = r.train.tp_overlap })
  J.sharded = fsdp.fully_shard(J.model, { shard = J.shard, outer = J.outer, tp = J.tp, units = planner.policy(r.fsdp.units, J.where),
    zero = r.fsdp.zero, prefetch = r.fsdp.prefetch, max_live_units = r.fsdp.max_live_units, seed = J.seed,
    hfsdp = r.fsdp.hfsdp, offload = r.fsdp.offload, comm_register = r.fsdp.comm_register,
    separate_reduce = r.fsdp.separate_reduce, micro_batches = J.K, overlap_step = r.fsdp.overlap_step,
    mixed = { param_dtype = r.fsdp.param_dtype, reduce_dtype = r.fsdp.reduce_dtype } })
  J.owned.sharded = J.sharded
  J.engine = engine.new(J.sharded, J.cfg) -- (the same model as post-training drives it: the REPL's engine())
end

-- The weights: resumed (train.resume), else from Hugging Face files
-- (checkpoint.init_hf, by default model.from_hf's folder), else the meta
-- init's. Returns false when a stop signal came while loading.
local function load_weights(J)
  local r, where, ck, T = J.r, J.where, J.r.checkpoint, J.T
  -- stop signals are recorded from here on: one during a long checkpoint
  -- load ends it cleanly, one later stops the run after its first step
  C.fsdp_stop_signals_watch(1)
  local got = J.cm:resume(J.sharded, { seed = J.seed, windows = J.ds:windows("train", T), seq = T, micro_batch = J.B,
    world = J.mesh:group("world") })
  if got.stopped then J.stopped_loading = got.stopped return false end
  J.start, J.resumed, J.seed = got.start, got.resumed, got.seed
  local init_hf = ck.init_hf
  if init_hf == nil then init_hf = r.model.from_hf end
  if not J.resumed and init_hf then
    local field = ck.init_hf and "checkpoint.init_hf" or "model.from_hf"
    -- (packed rows: each document's positions restart, within the model's)
    local seq = r.data.pack and math.min(T, J.cfg.max_position_embeddings) or T
    local ok, e = pcall(hf.import, J.sharded, J.cfg, init_hf, { seq = seq })
    if not ok then
      J.sharded:free() -- now, while the mesh it uses is alive (the collector's order is any)
      error(where .. ": " .. field .. ": " .. tostring(e), 0)
    end
    J.say("initial weights from %s", init_hf)
  end
  -- beside the weights, every checkpoint (its hf/ folder) and the export
  -- carry the model's config.json and its tokenizer's files (fsdp.hf_files)
  local data_tok = require("fsdp.token_manifest").tokenizer_of(r)
  J.carried, J.carried_from = hf_files.carried({ from_hf = init_hf or r.model.from_hf, resumed = J.resumed,
    vocab_size = J.cfg.vocab_size, max_len = J.cfg.max_position_embeddings,
    bytes = r.data.token_file == nil or data_tok == "bytes", tokenizer_dir = data_tok ~= "bytes" and data_tok or nil })
  J.carry = { ["config.json"] = hf_config.encode(J.cfg, "fp32") }
  for k, v in pairs(J.carried or {}) do J.carry[k] = v end
  J.train_loader = J.ds:loader({ split = "train", batch = J.B, seq = T, rank = J.dp_rank, world = J.dp, seed = J.seed,
    state = { consumed = got.consumed } })
  return true
end

local function build(r, where, args, owned)
  local info = fsdp.init()
  local appended, original_resume = restarts.original_resume(r, args)
  r = recipe.check(recipe.apply_overrides(r, args, where), where)
  -- data.pack's default, settled before the plan (packed rows hold a
  -- doc_start a micro-batch): on for chat data (a loss mask beside the file)
  if r.data.pack == nil then r.data.pack = r.data.token_file ~= nil and data.has_mask(r.data.token_file) end
  local J = job.new({ r = r, where = where, owned = owned, info = info, device = r.train.device, seed = r.train.seed,
    B = r.data.micro_batch, T = r.data.seq, ranks_per_device = info.local_size })
  console(J)
  J.cfg = hf_config.model(r.model, where)
  if J.device == "cuda" then J.ranks_per_device = preflight.select_gpu(r, where, info) end
  build_mesh(J)
  preflight_checks(J, args, appended, original_resume)
  open_data(J)
  build_model(J)
  if not load_weights(J) then return J end
  J.tokens_step = J.B * J.T * J.K * J.dp
  return J
end

-- Stopped by a signal and saved: the launcher's SIGTERM to the ranks still
-- ending (srun -K after the first exited 138) is ignored, so the job's
-- status stays the first signal's (still watched during an export: a stop
-- there ends it cleanly).
local function export(J)
  local ck, sharded = J.r.checkpoint, J.sharded
  C.fsdp_stop_signals_watch(J.signalled and 2 or 1)
  if ck.export_hf and not J.signalled then
    local ok, e = pcall(hf.export, sharded, J.cfg, ck.export_hf, { dtype = ck.export_dtype,
      shard_bytes = ck.export_shard_mb * 1e6, files = J.carry })
    local sig = not ok and sharded:stop_agreed() -- (the export failed on every rank: a stop signal, or not)
    if sig then -- stopped during the export: nothing half-written is left, the run is in its checkpoint
      J.signalled = { signal = sig, step = J.last, saved = J.cm.last_saved, note = string.format("during the export " ..
        "to %s: nothing exported (%s.tmp removed)", ck.export_hf, ck.export_hf:gsub("/+$", "")) }
    elseif not ok then
      error(J.where .. ": checkpoint.export_hf: " .. tostring(e), 0)
    else
      J.say("exported %s (%d files, %s bytes, %s) for Hugging Face", ck.export_hf, e.files, human(e.bytes), ck.export_dtype)
    end
  end
  C.fsdp_stop_signals_watch(J.signalled and 2 or 0)
end

-- The run's summary, the memory check fsdprun --ranks-per-gpu asks of
-- each rank, a stop's message, and everything released.
local function finish(J)
  local S, info = J.stats, J.info
  export(J)
  local wall = C.fsdp_time_now() - S.t_start
  local steady = S.t_steady and S.steady_tokens / (C.fsdp_time_now() - S.t_steady) or S.tokens_done / wall
  if S.first_loss then
    J.say("done: %d steps in %s; loss %.4f -> %.4f; %s tok/s after the first step (%s over %d ranks)",
      S.tokens_done / J.tokens_step, loop.duration(wall), S.first_loss, S.last_loss, human(steady),
      human(S.tokens_done) .. " tokens", info.size)
  end
  if J.metrics then J.metrics:close() end
  if J.tensorboard then J.tensorboard:close() end
  -- every rank: fsdprun --ranks-per-gpu checks each one's bytes against its plan
  if os.getenv("FSDPRUN_RANKS_PER_GPU") ~= nil and S.first_loss then
    local plan = J.device == "cuda" and J.need.device or J.need.total
    print(string.format("fsdp: rank %d memory: peak %d bytes, planned %d bytes per rank on the %s (%+.2f%%)", info.rank,
      S.run_peak, plan, J.device, 100 * (S.run_peak - plan) / plan))
    io.stdout:flush()
  end
  local s = J.signalled
  if s then -- rank 0 says so before any rank exits (fsdprun would stop the others at the first exit)
    if info.rank == 0 then
      io.stderr:write(string.format("fsdp: stopped by %s after step %d%s; %s\n", s.signal > 0 and
        ffi.string(C.fsdp_signal_name(s.signal)) or "a signal to another rank", s.step, s.note and " " .. s.note or "",
        s.saved and "checkpoint saved at " .. s.saved .. " (train.resume=auto continues from it)" or
        "nothing saved (no checkpoint.dir)"))
      io.stderr:flush()
    end
    J.mesh:group("world"):barrier()
  end
  J.cm:release()
  J.sharded:free()
  J.mesh:free()
  return { first_loss = S.first_loss, last_loss = S.last_loss, losses = S.losses, tokens_per_s = steady,
    peak = J.the_peak, flops_per_token = J.flops_tok, metrics_failed = J.metrics and J.metrics.failed,
    tensorboard_failed = J.tensorboard and J.tensorboard.failed, signalled = s }
end

local function run(r, where, args, break_at, owned)
  local J = build(r, where, args, owned)
  if J.stopped_loading then -- stopped while loading: nothing trained, nothing to save; the checkpoint is as it was
    J.mesh:group("world"):barrier()
    C.fsdp_stop_signals_watch(0)
    J.cm:release()
    J.sharded:free()
    J.mesh:free()
    return { losses = {}, signalled = { signal = J.stopped_loading, step = 0 } }
  end
  loop.open(J)
  loop.run(J, break_at)
  return finish(J)
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

