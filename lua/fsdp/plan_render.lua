-- fsdp.plan_render: a plan (fsdp.planner's) for people and programs. The
-- text `fsdp plan` and the REPL print (memory per rank by buffer, the
-- communication, the units, the ranks; the difference between two plans)
-- and the JSON of `fsdp plan --json`. Numbers go through fsdp.pretty, so a
-- plan reads like the trainer's lines.
--   print(plan_render.render(p)); plan_render.json(p); plan_render.diff(a, b)
local planner = require "fsdp.planner"
local json = require "fsdp.json"
local pretty = require "fsdp.pretty"
local bytes, count = pretty.bytes, pretty.count

local M = {}

-- A text table: rows of cells, the first row the header; numbers right-aligned
function M.table(rows)
  local w = {}
  for _, row in ipairs(rows) do
    for i, c in ipairs(row) do w[i] = math.max(w[i] or 0, #tostring(c)) end
  end
  local out = {}
  for k, row in ipairs(rows) do
    local cells = {}
    for i, c in ipairs(row) do
      local s = tostring(c)
      local right = k > 1 and i > 1 and s:match("^%-?[%d.]+%s?%a*$") -- numbers and sizes
      cells[i] = right and string.rep(" ", w[i] - #s) .. s or s .. string.rep(" ", w[i] - #s)
    end
    out[#out + 1] = "  " .. table.concat(cells, "  "):gsub("%s+$", "")
  end
  return table.concat(out, "\n")
end

-- "2 x 116.01 MiB + 501.00 MiB": a pool's slots, equal ones counted
local function slot_list(v)
  if #v == 0 then return "none" end
  local out, i = {}, 1
  while i <= #v do
    local j = i
    while j < #v and v[j + 1] == v[i] do j = j + 1 end
    out[#out + 1] = (j > i and (j - i + 1) .. " x " or "") .. bytes(v[i])
    i = j + 1
  end
  return table.concat(out, " + ")
end

-- a row's note for what n of the units do ("resident" where none does);
-- fmt's %s is where: "" (every unit) or " in n of N units"
local function units_note(p, n, fmt)
  n = n or 0
  if n == 0 then return "resident" end
  return string.format(fmt, n == #p.units and "" or string.format(" in %d of %d units", n, #p.units))
end

function M.memory_rows(p)
  local m = p.resident
  local rows = {
    { "what", "bytes per rank", "" },
    { "params (compute copy)", bytes(m.params_full + m.params_shard), "resident" },
    -- split: bf16 units keep only the low 16 bits of each fp32 main param
    -- (src/base/bf16_split.h); compact: the optimizer's grads in bf16
    { "main params (fp32)", bytes(m.main_params), units_note(p, p.split_units,
      "resident: the low 16 bits%s, the high 16 being the compute copy") },
    { "optimizer state", bytes(m.optimizer), "resident" },
    { "grads", bytes(m.grads_full + m.grads_main), units_note(p, p.compact_units,
      "resident: bf16%s (one micro-batch, reduced in bf16 or not at all: nothing for fp32 to add)") },
    { "comm scratch", bytes(m.scratch), "resident, shared by the units: the reduce staging (and the param staging of host-held shards)" },
    { "host staging (offload)", bytes(m.host_stage), "resident, host" },
    { "unit buffer pools", bytes(p.pools.params + p.pools.grads), string.format("params %s, grads %s; live at once: %d params, %d grads",
      slot_list(p.pools.slots.params), slot_list(p.pools.slots.grads), p.pools.peak_params, p.pools.peak_grads) },
    { "activations", bytes(p.activations), p.kind == "model" and "one micro-batch, run on the counting device (fsdp.dry_run)" or
      string.format("micro-batch %d x %d, checkpoint %s, recompute %s, logits %s%s",
      p.micro_batch, p.seq, tostring(p.checkpoint), p.recompute, p.loss_rows < p.micro_batch * p.seq and string.format("in chunks of %d rows", p.loss_rows) or "whole",
      p.attention_workspace and string.format("; attention workspace %s (%s)", bytes(p.attention_workspace.backward),
        p.attention_workspace_from) or "") },
    { p.kind == "model" and "model caches, batches" or "rope tables, batches", bytes(m.rope + m.norm_sums + p.batches),
      string.format("resident: %s %s%s; the step's %s %s", p.kind == "model" and "what the first step makes for the next" or
      "rope's tables", bytes(m.rope), m.norm_sums > 0 and ", the units' grad-norm sums " .. bytes(m.norm_sums) or "",
      p.kind == "model" and "batches" or "ids and targets", bytes(p.batches)) },
    { "peak", bytes(p.peak), p.host > 0 and string.format("%s on the device, %s in host memory (offload)", bytes(p.device_peak),
      bytes(p.host)) or "" },
  }
  if m.staging > 0 then -- after the host staging
    table.insert(rows, 8, p.device == "cuda" and { "fp32 staging (NCCL, bf16)", bytes(m.staging),
      "resident: bf16 grads cast to fp32, a chunk of each rank's slice at a time, for the reduce-scatters" } or
      { "fp32 staging (CPU, bf16)", bytes(m.staging),
      "resident: the running module's weights and grads in fp32 for the CPU ops, one pair for all" })
  end
  return rows
end

-- One row per unit, but a run of units that differ only in a trailing
-- number (model.layers.0 .. model.layers.79) and in nothing the table
-- shows is one row: "model.layers.0-79 x80".
function M.unit_rows(p)
  local rows = { { "#", "unit", "zero", "params", "shard", "compute", "main", "optimizer", "grads", "total" } }
  local run -- {first, last unit, prefix, first and last number, cells}
  local function flush()
    if not run then return end
    local n = run.last_n - run.first_n + 1
    local idx = n > 1 and (run.first.index .. "-" .. run.last.index) or run.first.index
    local name = n > 1 and string.format("%s%d-%d x%d", run.prefix, run.first_n, run.last_n, n) or run.first.name
    local row = { idx, name }
    for _, c in ipairs(run.cells) do row[#row + 1] = c end
    rows[#rows + 1] = row
    run = nil
  end
  for _, u in ipairs(p.units) do
    local m = u.mem
    local cells = { u.zero, count(u.numel), count(u.shard_numel), bytes(m.params_full + m.params_shard), bytes(m.main_params),
      bytes(m.optimizer), bytes(m.grads_full + m.grads_main + m.scratch), bytes(u.bytes) }
    local prefix, num = u.name:match("^(.-)(%d+)$")
    num = tonumber(num)
    local same = run and prefix == run.prefix and num == run.last_n + 1 and table.concat(cells, "|") == table.concat(run.cells, "|")
    if same then
      run.last, run.last_n = u, num
    else
      flush()
      run = { first = u, last = u, prefix = prefix or false, first_n = num or 0, last_n = num or 0, cells = cells }
    end
  end
  flush()
  return rows
end

-- Elements each rank owns (padding left out): equal up to padding; the
-- ranks are listed in runs of equal counts
function M.rank_rows(p)
  local runs = {}
  for r = 0, p.shard - 1 do
    local n = 0
    for _, u in ipairs(p.units) do
      for _, pc in ipairs(planner.pieces(p, u, r)) do n = n + pc["end"] - pc.begin end
    end
    local last = runs[#runs]
    if last and last.n == n then last.to = r else runs[#runs + 1] = { from = r, to = r, n = n } end
  end
  local rows = { { "shard ranks", "parameter elements owned", "bytes per rank" } }
  for _, run in ipairs(runs) do
    rows[#rows + 1] = { run.from == run.to and tostring(run.from) or (run.from .. "-" .. run.to), count(run.n), bytes(p.peak) }
  end
  return rows
end

-- "zero 3", or for a policy that mixes levels "zero 0, 2 and 3 (by unit:
-- 1 at 0, 2 at 2, 4 at 3)": the recipe's fsdp.zero alone would misstate it
function M.zero_text(p)
  local at, levels = {}, {} -- at[z]: the units at level z
  for _, u in ipairs(p.units) do
    if not at[u.zero] then levels[#levels + 1] = u.zero end
    at[u.zero] = (at[u.zero] or 0) + 1
  end
  if #levels <= 1 then return "zero " .. tostring(levels[1] or p.zero) end
  table.sort(levels)
  local names, by = {}, {}
  for i, z in ipairs(levels) do
    names[i] = tostring(z)
    by[i] = string.format("%d at %d", at[z], z)
  end
  return string.format("zero %s and %s (by unit: %s)", table.concat(names, ", ", 1, #names - 1), names[#names],
    table.concat(by, ", "))
end

function M.render(p)
  local out = {}
  for _, w in ipairs(p.warnings or {}) do out[#out + 1] = "warning: " .. w end
  out[#out + 1] = string.format("plan: %s on %d ranks (mesh %s: dp_shard %d x dp_outer %d%s%s), %s, %s params; %s parameters " ..
    "in %d units; %d micro-batch%s%s per step", p.where, p.world, p.mesh, p.dp_shard or p.shard, p.outer,
    ((p.cp or 1) > 1 and string.format(" x cp %d", p.cp) or "") .. ((p.tp or 1) > 1 and string.format(" x tp %d", p.tp) or ""),
    p.hfsdp and ", hfsdp" or "",
    M.zero_text(p), p.param_dtype, count(p.n_params), #p.units, p.grad_accum, p.grad_accum == 1 and "" or "es",
    p.kind == "model" and "" or string.format(" of %d x %d", p.micro_batch, p.seq))
  out[#out + 1] = "memory per rank (every rank holds the same bytes):"
  out[#out + 1] = M.table(M.memory_rows(p))
  local function comm(c) return string.format("all-gather %s, reduce-scatter %s, all-reduce %s", bytes(c.all_gather),
    bytes(c.reduce_scatter), bytes(c.all_reduce)) end
  if p.comm_tp or p.comm_cp then -- (each group's own: the dp groups' FSDP collectives, the tp and cp layers')
    out[#out + 1] = string.format("communication per rank per step (bytes sent, ring algorithms): dp groups: %s%s%s",
      comm(p.comm), p.comm_cp and string.format("; cp group (%d ranks): %s", p.cp, (p.comm_cp.shift or 0) > 0 and
      string.format("ring shifts %s", bytes(p.comm_cp.shift)) or string.format("all-gather %s, reduce-scatter %s",
      bytes(p.comm_cp.all_gather), bytes(p.comm_cp.reduce_scatter))) or "",
      p.comm_tp and string.format("; tp group (%d ranks): %s", p.tp, comm(p.comm_tp)) or "")
  else
    out[#out + 1] = "communication per rank per step (bytes sent, ring algorithms): " .. comm(p.comm)
  end
  out[#out + 1] = "units:"
  out[#out + 1] = M.table(M.unit_rows(p))
  out[#out + 1] = "ranks (of the shard group; replicas hold the same):"
  out[#out + 1] = M.table(M.rank_rows(p))
  return table.concat(out, "\n")
end

function M.json(p)
  local units = {}
  for _, u in ipairs(p.units) do
    local params = {}
    for _, q in ipairs(u.params) do params[#params + 1] = { name = q.name, shape = json.array(q.shape), numel = q.numel, offset = q.offset } end
    units[#units + 1] = { name = u.name, zero = u.zero, numel = u.numel, shard_numel = u.shard_numel, total_numel = u.total_numel,
      bytes = u.mem, params = json.array(params) }
  end
  return json.encode({ recipe = p.where, world = p.world, dp_shard = p.shard, dp_outer = p.outer, tp = p.tp, comm_tp = p.comm_tp, cp = p.cp,
    comm_cp = p.comm_cp,
    hfsdp = p.hfsdp, zero = p.zero,
    param_dtype = p.param_dtype, parameters = p.n_params, micro_batches = p.grad_accum, resident = p.resident,
    split_main_units = p.split_units or 0,
    pools = p.pools, activations = p.activations, checkpoint = p.checkpoint, recompute = p.recompute, peak = p.peak, comm = p.comm,
    attention_workspace = p.attention_workspace, attention_workspace_from = p.attention_workspace_from, batches = p.batches,
    units = json.array(units) })
end

-- Lines of difference between two plans: the resident buffers, pools,
-- activations, peak and communication per step that differ
function M.diff(a, b)
  local rows = { { "", "A", "B", "B - A" } }
  local function row(name, x, y) if x ~= y then rows[#rows + 1] = { name, bytes(x), bytes(y), (y >= x and "+" or "-") .. bytes(math.abs(y - x)) } end end
  for _, k in ipairs({ "params_full", "params_shard", "main_params", "optimizer", "grads_full", "grads_main", "scratch", "staging" }) do
    row(k, a.resident[k] or 0, b.resident[k] or 0)
  end
  row("unit buffer pools", a.pools.params + a.pools.grads, b.pools.params + b.pools.grads)
  row("activations", a.activations, b.activations)
  row("peak", a.peak, b.peak)
  row("all-gather / step", a.comm.all_gather, b.comm.all_gather)
  row("reduce-scatter / step", a.comm.reduce_scatter, b.comm.reduce_scatter)
  row("all-reduce / step", a.comm.all_reduce, b.comm.all_reduce)
  local out = { string.format("A: %d ranks, zero %d, %d units; B: %d ranks, zero %d, %d units", a.world, a.zero, #a.units, b.world, b.zero, #b.units) }
  out[#out + 1] = #rows > 1 and M.table(rows) or "  (the same bytes)"
  return table.concat(out, "\n")
end

return M
