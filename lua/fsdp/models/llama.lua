-- fsdp.models.llama: a Llama decoder (Llama 2/3 family) built from the
-- engine's modules, computing what Hugging Face's LlamaForCausalLM computes
-- for the same weights: RMSNorm in fp32, rotate-half rotary embeddings
-- (optionally with Llama-3 frequency scaling), grouped-query attention
-- (query head h reads kv head h / (heads / kv_heads)), SwiGLU MLP, and the
-- same parameter names (model.layers.3.self_attn.q_proj.weight), so weights
-- move to and from that ecosystem.
--
--   local llama = require "fsdp.models.llama"
--   local cfg = llama.config("llama3_8b", {num_hidden_layers = 2})  -- or a table of HF fields
--   local model = llama.model(cfg, {checkpoint = "none" | "full" | k, recompute = "light" | "mlp" | "none"})
--   logits = model:forward(ctx, ids)      -- ids: int32 {B, T}; logits {B, T, vocab}
--   model:backward(ctx, dlogits)          -- consumes dlogits
-- No code here frees a tensor: fsdp.autograd's rules free every activation
-- at its last use (with ctx.no_grad, each layer's as soon as the next has
-- run); modules only say what their backward needs (m.saved).
-- The model declares its parameters and allocates nothing until sharded.
local tensor = require "fsdp.tensor"
local ops = require "fsdp.ops"
local nn = require "fsdp.nn"
local autograd = require "fsdp.autograd"
local tpm = require "fsdp.tp"
local cpm = require "fsdp.cp"
local cp_ring = require "fsdp.cp_ring"
local base = require "fsdp.ffi"
local C, check = base.C, base.check

local M = {}

-- Hugging Face LlamaConfig fields, with the values of the published models.
M.presets = {
  llama3_8b = { hidden_size = 4096, intermediate_size = 14336, num_attention_heads = 32, num_key_value_heads = 8,
    num_hidden_layers = 32, vocab_size = 128256, rope_theta = 500000, rms_norm_eps = 1e-5,
    max_position_embeddings = 8192, tie_word_embeddings = false },
  llama3_70b = { hidden_size = 8192, intermediate_size = 28672, num_attention_heads = 64, num_key_value_heads = 8,
    num_hidden_layers = 80, vocab_size = 128256, rope_theta = 500000, rms_norm_eps = 1e-5,
    max_position_embeddings = 8192, tie_word_embeddings = false },
  -- Llama 3.1: the same shapes, a 128k context through Llama-3 rope scaling
  llama3_1_8b = { hidden_size = 4096, intermediate_size = 14336, num_attention_heads = 32, num_key_value_heads = 8,
    num_hidden_layers = 32, vocab_size = 128256, rope_theta = 500000, rms_norm_eps = 1e-5,
    max_position_embeddings = 131072, tie_word_embeddings = false,
    rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
      original_max_position_embeddings = 8192 } },
  llama3_1_70b = { hidden_size = 8192, intermediate_size = 28672, num_attention_heads = 64, num_key_value_heads = 8,
    num_hidden_layers = 80, vocab_size = 128256, rope_theta = 500000, rms_norm_eps = 1e-5,
    max_position_embeddings = 131072, tie_word_embeddings = false,
    rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
      original_max_position_embeddings = 8192 } },
}

local INT_MAX = 2147483647
local fields = {
  hidden_size = "int", intermediate_size = "int", num_attention_heads = "int", num_key_value_heads = "int",
  num_hidden_layers = "int", vocab_size = "int", rope_theta = "number", rms_norm_eps = "number",
  max_position_embeddings = "int", tie_word_embeddings = "boolean", rope_scaling = "table", head_dim = "int",
  initializer_range = "number", model_type = "string", architectures = "table", torch_dtype = "string",
  bos_token_id = "any", eos_token_id = "any", hidden_act = "string", attention_bias = "boolean", mlp_bias = "boolean",
  attention_dropout = "number", pretraining_tp = "int", use_cache = "boolean", transformers_version = "string",
}

-- A validated config: a preset name and/or a table of Hugging Face fields
-- (overrides). Errors name the field and what was expected; `where` (e.g.
-- "recipes/tiny.lua: model") prefixes them.
function M.config(preset, overrides, where)
  where = where or "llama config"
  if type(preset) == "table" then preset, overrides = nil, preset end
  local c = {}
  if preset then
    local p = M.presets[preset]
    if not p then
      local names = {}
      for k in pairs(M.presets) do names[#names + 1] = k end
      table.sort(names)
      error(string.format("%s: unknown preset '%s' (have: %s)", where, tostring(preset), table.concat(names, ", ")), 2)
    end
    for k, v in pairs(p) do c[k] = v end
  end
  for k, v in pairs(overrides or {}) do
    local want = fields[k]
    if not want then error(string.format("%s: unknown field '%s' (Hugging Face LlamaConfig names, e.g. hidden_size)", where, tostring(k)), 2) end
    local ok = want == "any" or (want == "int" and type(v) == "number" and v % 1 == 0) or type(v) == want
    if not ok then error(string.format("%s: %s = %s; expected %s", where, k, tostring(v), want == "int" and "an integer" or "a " .. want), 2) end
    -- sizes reach int32 token ids and C's sizes: refused here, named, not
    -- as a count of 1e23 parameters or a kernel's argument error
    if want == "int" and math.abs(v) > INT_MAX then
      error(string.format("%s: %s = %s; expected an integer up to %d", where, k, tostring(v), INT_MAX), 2)
    end
    if want == "number" and not (v == v and math.abs(v) < math.huge) then
      error(string.format("%s: %s = %s; expected a finite number", where, k, tostring(v)), 2)
    end
    c[k] = v
  end
  local need = { "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size" }
  for _, k in ipairs(need) do
    if not c[k] then error(string.format("%s: %s is required", where, k), 2) end
    if c[k] < 1 then error(string.format("%s: %s = %s; expected >= 1", where, k, c[k]), 2) end
  end
  c.num_key_value_heads = c.num_key_value_heads or c.num_attention_heads
  c.rope_theta = c.rope_theta or 10000
  c.rms_norm_eps = c.rms_norm_eps or 1e-6
  if c.num_key_value_heads < 1 then error(string.format("%s: num_key_value_heads = %s; expected >= 1", where, c.num_key_value_heads), 2) end
  if not (c.rope_theta > 0) then error(string.format("%s: rope_theta = %s; expected > 0 (the rotary base)", where, c.rope_theta), 2) end
  if not (c.rms_norm_eps >= 0) then error(string.format("%s: rms_norm_eps = %s; expected >= 0", where, c.rms_norm_eps), 2) end
  c.max_position_embeddings = c.max_position_embeddings or 2048
  c.initializer_range = c.initializer_range or 0.02
  c.hidden_act = c.hidden_act or "silu"
  if c.tie_word_embeddings == nil then c.tie_word_embeddings = false end
  c.head_dim = c.head_dim or c.hidden_size / c.num_attention_heads
  if c.head_dim % 1 ~= 0 then
    error(string.format("%s: hidden_size %d is not a multiple of num_attention_heads %d", where, c.hidden_size, c.num_attention_heads), 2)
  end
  if c.head_dim % 2 ~= 0 then error(string.format("%s: head_dim %d must be even (rotary pairs)", where, c.head_dim), 2) end
  if c.num_attention_heads % c.num_key_value_heads ~= 0 then
    error(string.format("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
      c.num_attention_heads, c.num_key_value_heads), 2)
  end
  if c.hidden_act ~= "silu" then error(string.format("%s: hidden_act = '%s'; only 'silu' (SwiGLU) is supported", where, c.hidden_act), 2) end
  if c.attention_bias or c.mlp_bias then error(where .. ": attention_bias / mlp_bias are not supported (Llama has none)", 2) end
  local rs = c.rope_scaling
  if rs then
    local t = rs.rope_type or rs.type
    if t ~= "llama3" then error(string.format("%s: rope_scaling.rope_type = '%s'; only 'llama3' is supported", where, tostring(t)), 2) end
    for _, k in ipairs({ "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" }) do
      local v = rs[k]
      if type(v) ~= "number" then error(string.format("%s: rope_scaling.%s is required (a number)", where, k), 2) end
      if not (v > 0 and v < math.huge) then error(string.format("%s: rope_scaling.%s = %s; expected a finite number > 0", where, k, v), 2) end
    end
  end
  return c
end

-- Parameter count (all weights, as Hugging Face counts them).
function M.num_params(c)
  local h, kv = c.hidden_size, c.num_key_value_heads * c.head_dim
  local q = c.num_attention_heads * c.head_dim
  local layer = h * q + 2 * h * kv + q * h + 3 * h * c.intermediate_size + 2 * h
  local embed = c.vocab_size * h
  return embed + c.num_hidden_layers * layer + h + (c.tie_word_embeddings and 0 or embed), embed
end

-- Training FLOPs per token: 6 per weight that multiplies (every weight but
-- the embedding table's lookups) plus attention's scores and weighted sum,
-- 12 * layers * seq * (heads * head_dim), uncorrected for causality (the
-- usual convention, as in the PaLM paper's appendix B).
function M.flops_per_token(c, seq)
  local n, embed = M.num_params(c)
  local matmul = n - embed -- a tied head still multiplies by the embedding table
  if c.tie_word_embeddings then matmul = matmul + embed end
  return 6 * matmul + 12 * c.num_hidden_layers * seq * c.num_attention_heads * c.head_dim
end

local class = nn.class

---------------------------------------------------------------- attention
local Attention = class("LlamaAttention")


-- Tensor parallelism (tp, a group of size > 1): the heads split over the
-- tp ranks (q, k, v column-parallel, o row-parallel); with fewer kv heads
-- than ranks each rank computes with the one kv head its query heads read,
-- of k and v weights every rank holds whole. The block runs on all rows
-- (GatherRows in, ScatterRows out: sequence parallelism around it).
local function new_attention(cfg, rope, packed, tp)
  local h, hd = cfg.hidden_size, cfg.head_dim
  local nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
  local o = { std = cfg.initializer_range, bias = false }
  local a = setmetatable({ cfg = cfg, rope = rope, packed = packed, params = {}, nh = nh, nkv = nkv,
    child_names = { "q_proj", "k_proj", "v_proj", "o_proj" } }, Attention)
  if not tp then
    a.children = { nn.Linear(h, nh * hd, o), nn.Linear(h, nkv * hd, o), nn.Linear(h, nkv * hd, o), nn.Linear(nh * hd, h, o) }
    return a
  end
  local function par(kind, rows) return { std = o.std, bias = false, tp = tp, parallel = kind, rows = rows } end
  local kv = par("column")
  if nkv % tp.size ~= 0 then -- (tp.size % nkv == 0: M.tp_check) its query heads' kv head
    kv = par("replicated", { math.floor(tp.rank * nkv / tp.size) * hd, hd })
    a.nkv = 1
  else
    a.nkv = nkv / tp.size
  end
  a.nh = nh / tp.size
  a.children = { nn.Linear(h, nh * hd, par("column")), nn.Linear(h, nkv * hd, kv), nn.Linear(h, nkv * hd, kv),
    nn.Linear(nh * hd, h, par("row")) }
  a.gather, a.scatter = tpm.GatherRows(tp), tpm.ScatterRows(tp)
  return a
end

-- rope over x's T positions of each of B rows; packed rows at their
-- documents' positions; with context parallelism (cpl) this rank's two
-- chunks of each row at theirs (each a run of consecutive positions)
local function rope(x, t, B, T, heads, hd, backward, docs, cpl)
  if not cpl then return ops.rope(x, t, B, T, heads, hd, backward, nil, docs) end
  local c, w, Tf = T / 2, heads * hd, cpl.T
  local ds = cpl.starts and not cpl.starts.meta and cpl.starts:ptr() -- (packed rows: each document's run at its place in it)
  for b = 0, B - 1 do
    for h = 0, 1 do
      local first, i = cpm.chunk(cpl.g.size, cpl.g.rank, h) * c, 0
      while i < c do
        local j, at = c, first
        if ds then
          local d = ds[b * Tf + first + i]
          j, at = i + 1, first + i - d
          while j < c and ds[b * Tf + first + j] == d do j = j + 1 end
        end
        ops.rope(x:view((b * T + h * c + i) * w, { 1, j - i, w }), t, 1, j - i, heads, hd, backward, at)
        i = j
      end
    end
  end
end

-- (tensor parallelism) x through the block's entry, y through its exit.
-- Generation (forward_last sets the group's `whole`) runs all rows on
-- every tp rank: nothing to gather, and the row-parallel layer's partial
-- sums are all-reduced.
local function enter_block(ctx, m, x, phase)
  if not m.gather or m.gather.tp.whole then return x end
  return nn.call(ctx, m.gather, phase, x)
end
local function leave_block(ctx, m, y, phase)
  if not m.scatter then return y end
  if m.scatter.tp.whole then return tpm.sum_rows(m.scatter.tp, y) end
  local z = nn.call(ctx, m.scatter, phase, y)
  autograd.consume(y)
  return z
end

-- the cos/sin tables, shared by the layers, per device
function Attention:tables(seq, device)
  local r, c = self.rope, self.cfg
  local t = r[device]
  if not t or t.seq < seq then -- kept across steps: nobody's activation
    t = autograd.untracked(ops.rope_tables, seq, c.head_dim, c.rope_theta, c.rope_scaling, device)
    r[device] = t
  end
  return t
end

-- Generation (ctx.kv, fsdp.generate): the new positions' keys and values
-- go into the layer's cache, and the queries attend to every cached
-- position up to theirs. kv = {pos = first new position, cap = positions
-- the caches hold, layers = {[attention] = {k, v}}}; nothing is saved.
-- With tp each rank caches and attends with its heads (all rows), and the
-- output projection's partial sums are all-reduced; with cp every rank
-- runs the whole sequence (the model is whole there: forward_last).
function Attention:forward_cached(ctx, x, phase)
  if self.packed.cp then error("LlamaAttention: generation runs whole rows (forward_last), not cp's chunks", 2) end
  local cfg, ch, kv = self.cfg, self.children, ctx.kv
  local B, T = x.shape[1], x.shape[2]
  local nh, nkv, hd = self.nh, self.nkv, cfg.head_dim
  local pos, cap = kv.pos, kv.cap
  if pos + T > cap then
    error(string.format("LlamaAttention: positions up to %d do not fit the KV cache of %d", pos + T, cap), 2)
  end
  local q = nn.call(ctx, ch[1], phase, x)
  local k = nn.call(ctx, ch[2], phase, x)
  local v = nn.call(ctx, ch[3], phase, x)
  local t = self:tables(cap, x.device)
  ops.rope(q, t, B, T, nh, hd, false, pos)
  ops.rope(k, t, B, T, nkv, hd, false, pos)
  local c = kv.layers[self]
  if not c then -- lasting state, nobody's activation: freed by the generator
    local w = nkv * hd
    c = autograd.untracked(function()
      return { k = ops.like(k, { B, cap, w }), v = ops.like(v, { B, cap, w }) }
    end)
    kv.layers[self] = c
  end
  local w, stream = nkv * hd, x.device == "cuda" and ops.compute_stream() or nil
  for b = 0, B - 1 do -- this sequence's new rows, after its cached ones (views: nobody's)
    c.k:view((b * cap + pos) * w, { T * w }):copy_from(k:view(b * T * w, { T * w }), stream)
    c.v:view((b * cap + pos) * w, { T * w }):copy_from(v:view(b * T * w, { T * w }), stream)
  end
  local out = ops.like(q)
  if pos == 0 and T > 1 then -- a prompt from the start: the training kernels (GEMMs, flash attention) are faster
    ops.attention_forward(out, tensor.new({ B, nh, T }, "fp32", q.device), q, k, v, B, T, nh, nkv, hd)
  else
    ops.attention_cached(out, q, c.k, c.v, B, T, pos, cap, nh, nkv, hd)
  end
  return leave_block(ctx, self, nn.call(ctx, ch[4], phase, out), phase)
end

function Attention:forward(ctx, x, phase)
  phase = phase or "forward"
  if ctx.kv then return self:forward_cached(ctx, x, phase) end
  local cfg, ch = self.cfg, self.children
  x = enter_block(ctx, self, x, phase)
  local B, T = x.shape[1], x.shape[2]
  local nh, nkv, hd = self.nh, self.nkv, cfg.head_dim
  local full = self.packed.cp and self.packed.cp.T or T
  if full > cfg.max_position_embeddings and not (self.packed.docs or (self.packed.cp and self.packed.cp.lo)) then -- (packed rows: pack() checks each document)
    error(string.format("LlamaAttention: sequence length %d exceeds max_position_embeddings %d", full, cfg.max_position_embeddings), 2)
  end
  local q = nn.call(ctx, ch[1], phase, x)
  local k = nn.call(ctx, ch[2], phase, x)
  local v = nn.call(ctx, ch[3], phase, x)
  if self.input_norm then nn.let_go({ ch[1], ch[2], ch[3] }) end
  local cpl = self.packed.cp -- (context parallelism: this rank's tokens at their positions, the sequence's keys)
  local t, docs = self:tables(cpl and cpl.T or T, x.device), self.packed.docs
  rope(q, t, B, T, nh, hd, false, docs, cpl)
  rope(k, t, B, T, nkv, hd, false, docs, cpl)
  local out, lse
  if cpl and cpl.way == "ring" then -- (this rank's keys and values alone, kept for backward)
    out, lse = cp_ring.forward(cpl, q, k, v, B, T, nh, nkv, hd)
  elseif cpl then -- (every rank's keys and values gathered, kept for backward)
    local ka, va
    out, lse, ka, va = cpm.attention_forward(cpl, q, k, v, B, T, nh, nkv, hd)
    autograd.consume(k)
    autograd.consume(v)
    k, v = ka, va
  else
    out, lse = ops.like(q, { B, T, nh * hd }), tensor.new({ B, nh, T }, "fp32", q.device)
    ops.attention_forward(out, lse, q, k, v, B, T, nh, nkv, hd, docs)
  end
  self.saved = { q = q, k = k, v = v, out = out, lse = lse, B = B, T = T, docs = docs, cp = cpl }
  return leave_block(ctx, self, nn.call(ctx, ch[4], phase, out), phase)
end

function Attention:backward(ctx, dy)
  local cfg, ch, s = self.cfg, self.children, self.saved
  local nh, nkv, hd = self.nh, self.nkv, cfg.head_dim
  local B, T = s.B, s.T
  if self.scatter then dy = nn.call(ctx, self.scatter, "backward", dy) end
  local dout = nn.call(ctx, ch[4], "backward", dy)
  local cpl, dq, dk, dv = s.cp
  if cpl and cpl.way == "ring" then
    dq, dk, dv = cp_ring.backward(cpl, dout, s.q, s.k, s.v, s.out, s.lse, B, T, nh, nkv, hd)
  elseif cpl then -- (the key and value grads of every rank's block, back to their owners)
    dq, dk, dv = cpm.attention_backward(cpl, dout, s.q, s.k, s.v, s.out, s.lse, B, T, nh, nkv, hd)
  else
    dq, dk, dv = ops.like(s.q), ops.like(s.k), ops.like(s.v)
    ops.attention_backward(dq, dk, dv, dout, s.q, s.k, s.v, s.out, s.lse, B, T, nh, nkv, hd, s.docs)
  end
  local t = self:tables(cpl and cpl.T or T, dq.device)
  rope(dq, t, B, T, nh, hd, true, s.docs, cpl)
  rope(dk, t, B, T, nkv, hd, true, s.docs, cpl)
  local n = self.input_norm and nn.bring_back(ctx, self.input_norm, { ch[1], ch[2], ch[3] }, self.gather)
  return nn.linears_backward(ctx, { ch[1], ch[2], ch[3] }, { dq, dk, dv }, self.gather, n or nil)
end

---------------------------------------------------------------- MLP
local MLP = class("LlamaMLP")

-- (tp: gate and up column-parallel, down row-parallel, on all rows)
local function new_mlp(cfg, tp)
  local h, i = cfg.hidden_size, cfg.intermediate_size
  local function o(kind) return { std = cfg.initializer_range, bias = false, tp = tp, parallel = tp and kind or nil } end
  local m = setmetatable({ params = {}, children = { nn.Linear(h, i, o("column")), nn.Linear(h, i, o("column")),
    nn.Linear(i, h, o("row")) }, child_names = { "gate_proj", "up_proj", "down_proj" } }, MLP)
  if tp then m.gather, m.scatter = tpm.GatherRows(tp), tpm.ScatterRows(tp) end
  return m
end

function MLP:forward(ctx, x, phase)
  phase = phase or "forward"
  local ch = self.children
  x = enter_block(ctx, self, x, phase)
  local g = nn.call(ctx, ch[1], phase, x)
  local u = nn.call(ctx, ch[2], phase, x)
  local light = self.input_norm ~= nil
  if light then nn.let_go({ ch[1], ch[2] }) end
  local a = ops.like(g)
  ops.swiglu_forward(a, g, u)
  -- recompute "mlp": gate and up are not kept but made again in backward
  -- (not when a checkpoint's re-run makes them right before that backward)
  if self.again and phase ~= "recompute" then self.saved = { again = true } else self.saved = { g = g, u = u } end
  local y = nn.call(ctx, ch[3], phase, a)
  if light then nn.let_go({ ch[3] }) end -- the SwiGLU product: made again from gate and up
  return leave_block(ctx, self, y, phase)
end

function MLP:backward(ctx, dy)
  local ch, s = self.children, self.saved
  local g, u, n
  if self.scatter then dy = nn.call(ctx, self.scatter, "backward", dy) end
  if s.again then -- gate and up again, from the norm's output made again: the same GEMMs, the same bits
    n = nn.bring_back(ctx, self.input_norm, { ch[1], ch[2] }, self.gather)
    g = nn.call(ctx, ch[1], "recompute", n)
    u = nn.call(ctx, ch[2], "recompute", n)
  end
  local a
  if ch[3].saved.x == nil then -- let go of in forward: the same bits again
    a = ops.like(g or s.g)
    ops.swiglu_forward(a, g or s.g, u or s.u)
    ch[3].saved.x = a
  end
  local da = nn.call(ctx, ch[3], "backward", dy)
  if a then autograd.consume(a) end
  -- the gradients written over gate and up (each element read first)
  local dg, du = g, u
  if not g then dg, du = autograd.take(self, "g"), autograd.take(self, "u") end
  ops.swiglu_backward(dg, du, da, dg, du)
  autograd.consume(da)
  if not n then n = self.input_norm and nn.bring_back(ctx, self.input_norm, { ch[1], ch[2] }, self.gather) end
  return nn.linears_backward(ctx, { ch[1], ch[2] }, { dg, du }, self.gather, n or nil)
end

---------------------------------------------------------------- decoder layer
local Layer = class("LlamaDecoderLayer")

-- recompute "light": the norms' outputs and the SwiGLU product are not
-- kept for backward but made again there (attention and MLP know their
-- input's norm); "mlp": the MLP's gate and up projections too
local function new_layer(cfg, rope, checkpoint, recompute, packed, tp)
  local norm1, attn = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, { tp = tp }), new_attention(cfg, rope, packed, tp)
  local norm2, mlp = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, { tp = tp }), new_mlp(cfg, tp)
  if recompute ~= "none" then attn.input_norm, mlp.input_norm = norm1, norm2 end
  mlp.again = recompute == "mlp"
  return setmetatable({ params = {}, checkpoint = checkpoint, children = { norm1, attn, norm2, mlp },
    child_names = { "input_layernorm", "self_attn", "post_attention_layernorm", "mlp" } }, Layer)
end

-- h = x + attn(norm1(x)); y = h + mlp(norm2(h)). With self.checkpoint,
-- fsdp.autograd keeps only x and re-runs this in backward ("recompute").
function Layer:forward(ctx, x, phase)
  local ch = self.children
  local h = nn.residual(ctx, { ch[1], ch[2] }, x, phase)
  return nn.residual(ctx, { ch[3], ch[4] }, h, phase)
end

-- dh = dy + norm2'(mlp'(dy)); dx = dh + norm1'(attn'(dh))
function Layer:backward(ctx, dy)
  local ch = self.children
  local dh = nn.residual_backward(ctx, { ch[3], ch[4] }, dy)
  return nn.residual_backward(ctx, { ch[1], ch[2] }, dh)
end

---------------------------------------------------------------- the model
local ModuleList = class("ModuleList") -- the layers, run as a chain
function ModuleList:forward(ctx, x, phase) return nn.forward_chain(ctx, self.children, x, phase) end
function ModuleList:backward(ctx, dy) return nn.backward_chain(ctx, self.children, dy) end
local Model = class("LlamaModel")
local CausalLM = class("LlamaForCausalLM")

-- checkpoint: "none" (default), "full" (every layer) or k (every k-th
-- layer): a checkpointed layer keeps only its input and runs its forward
-- again in backward. recompute: "light" (default), "mlp" or "none": with
-- "light" every layer lets go of its norms' outputs and its SwiGLU product
-- after forward and makes them again in backward (elementwise work, the
-- same bits): a third less activation memory per layer at Llama's shapes;
-- "mlp" also runs the gate and up projections again in backward (two of
-- the layer's seven GEMMs once more, the same bits): two thirds less.
-- opts.tp: a tp group (fsdp.tp.group) of size > 1: tensor parallelism
-- with sequence parallelism (M.tp_check says which sizes split the model);
-- opts.tp_overlap (default true): the sequence-parallel reduce-scatters
-- of the backward run while the weight gradients compute
-- (nn.linears_backward; false: one after the other, the same bits).
-- opts.cp: a cp group of size > 1: context parallelism (fsdp.cp); the
-- forwards then take whole rows of ids (and targets) and compute this
-- rank's chunks of them; opts.cp_attention: how attention reaches the
-- other cp ranks' keys and values, "all_gather" (fsdp.cp, the default:
-- measured the faster on CPU ranks, bench/RESULTS.md) or "ring"
-- (fsdp.cp_ring: less memory).
function M.model(cfg, opts)
  opts = opts or {}
  local tp, cp = opts.tp, opts.cp
  if tp and tp.size == 1 then tp = nil end
  if cp and cp.size == 1 then cp = nil end
  if opts.cp_attention ~= nil and not cpm.attention_ways[opts.cp_attention] then
    error(string.format("llama.model: cp_attention = %s; expected 'all_gather' or 'ring'", tostring(opts.cp_attention)), 2)
  end
  if opts.tp_overlap ~= nil and type(opts.tp_overlap) ~= "boolean" then
    error(string.format("llama.model: tp_overlap = %s; expected true or false", tostring(opts.tp_overlap)), 2)
  end
  if tp then
    local why = M.tp_check(cfg, tp.size)
    if why then error("llama.model: " .. why, 2) end
    tp.overlap = opts.tp_overlap ~= false
  end
  local ck = opts.checkpoint or "none"
  if ck ~= "none" and ck ~= "full" and not (type(ck) == "number" and ck >= 1 and ck % 1 == 0) then
    error(string.format("llama.model: checkpoint = %s; expected 'none', 'full' or an integer k >= 1 (every k-th layer)", tostring(ck)), 2)
  end
  local rc = opts.recompute or "light"
  if rc ~= "light" and rc ~= "mlp" and rc ~= "none" then
    error(string.format("llama.model: recompute = %s; expected 'light', 'mlp' or 'none'", tostring(rc)), 2)
  end
  -- shared by the layers: the rope tables, and the packed rows' layout of
  -- the batch being run (CausalLM's forwards set it)
  local rope, packed = {}, {}
  local layers = {}
  for i = 1, cfg.num_hidden_layers do
    local on = ck == "full" or (type(ck) == "number" and (i - 1) % ck == 0)
    layers[i] = new_layer(cfg, rope, on, rc, packed, tp)
  end
  local model = setmetatable({ params = {}, children = {
    nn.Embedding(cfg.vocab_size, cfg.hidden_size, { std = cfg.initializer_range, tp = tp }),
    setmetatable({ params = {}, children = layers }, ModuleList),
    nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, { tp = tp }) }, child_names = { "embed_tokens", "layers", "norm" } }, Model)
  -- (tp: the head vocab-parallel, as the embedding: a tied head's slice is the embedding's)
  local head = nn.Linear(cfg.hidden_size, cfg.vocab_size, { std = cfg.initializer_range, bias = false, tp = tp,
    parallel = tp and "column" or nil })
  if cfg.tie_word_embeddings then -- the head computes with the embedding's weight (HF's tying)
    head.params, head.shares = {}, model.children[1]
  end
  local lm = setmetatable({ cfg = cfg, params = {}, rope = rope, packed = packed, tp = tp, cp = cp, cp_layouts = {},
    cp_attention = opts.cp_attention, -- (nil: fsdp.cp.layout's default)
    children = { model, head },
    child_names = { "model", "lm_head" } }, CausalLM)
  if tp then -- the sequence-parallel rows' ends: after the embedding, around the head
    lm.tp_mods = { embed_out = tpm.ScatterRows(tp), head_in = tpm.GatherRows(tp), logits = tpm.GatherColumns(tp) }
  end
  return lm
end

-- Why a tp size does not split cfg (nil when it does): heads, kv heads
-- (split when there are at least tp of them, else shared: tp a multiple
-- of them), the MLP's and the vocabulary's sizes; each message names the
-- field and the tp sizes that would work.
function M.tp_check(cfg, tp)
  local function sizes(n, extra)
    local ok = {}
    for t = 2, math.min(n, 64) do if n % t == 0 and (not extra or extra(t)) then ok[#ok + 1] = t end end
    return #ok > 0 and table.concat(ok, ", ") or "none"
  end
  local nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
  local function kv_ok(t) return nkv % t == 0 or t % nkv == 0 end
  if nh % tp ~= 0 or not kv_ok(tp) then
    return string.format("tp = %d does not split num_attention_heads = %d with num_key_value_heads = %d (kv heads split " ..
      "when tp divides them, else each is shared by tp / kv_heads ranks); tp sizes that do: %s", tp, nh, nkv,
      sizes(nh, kv_ok))
  end
  for _, f in ipairs({ "intermediate_size", "vocab_size" }) do
    if cfg[f] % tp ~= 0 then
      return string.format("tp = %d does not divide model.%s = %d; tp sizes that do: %s", tp, f, cfg[f], sizes(cfg[f]))
    end
  end
end

-- frees the rope tables the layers share (made again if the model runs
-- on): fsdp.fully_shard's free calls it, so a freed model leaves no device
-- memory for the collector to find some time later
function CausalLM:release()
  for device, t in pairs(self.rope) do
    ops.rope_tables_free(t)
    self.rope[device] = nil
  end
  for k, l in pairs(self.cp_layouts) do -- (context parallelism's positions)
    cpm.layout_free(l)
    self.cp_layouts[k] = nil
  end
end

-- Context parallelism: the layout of rows of T on the ids' device
-- (fsdp.cp.layout), kept for the shape: nobody's activation (freed by release)
local function cp_layout(self, T, device)
  local l = self.cp_layouts[T]
  if not l then
    l = autograd.untracked(cpm.layout, self.cp, T, device, self.cp_attention)
    self.cp_layouts[T] = l
  end
  return l
end

-- (context parallelism) this rank's chunks of whole rows (ids {B, T} or targets {B * T})
local function local_part(self, x, B)
  if not self.cp then return x end
  return cpm.split(self.cp, x, B)
end

-- the modules in forward order: embedding, layers, final norm (and head);
-- with tp, the embedding's partial sums reduce-scattered into this rank's rows
local function trunk(self)
  local m = self.children[1]
  if self.tp then return { m.children[1], self.tp_mods.embed_out, m.children[2], m.children[3] } end
  return { m.children[1], m.children[2], m.children[3] }
end

-- (tp) the head runs on all rows, each rank its columns of the
-- vocabulary: the trunk's rows of this rank gathered
local function head_rows(self, ctx, nf)
  if not self.tp then return nf end
  local all = nn.call(ctx, self.tp_mods.head_in, "forward", nf)
  autograd.consume(nf)
  return all
end

-- the modules after the trunk up to whole logits: the head (with tp: on
-- all rows, its vocabulary columns gathered into whole rows)
local function head_mods(self, mods)
  local t = self.tp_mods
  if t then
    mods[#mods + 1] = t.head_in
    mods[#mods + 1] = self.children[2]
    mods[#mods + 1] = t.logits
  else
    mods[#mods + 1] = self.children[2]
  end
  return mods
end

-- doc_start against ids ({B, T} both, fsdp_doc_start_check) and the
-- model: a row may be longer than the model's positions; no document may
local function check_docs(self, ids, doc_start)
  if doc_start.shape[1] ~= ids.shape[1] or doc_start.shape[2] ~= ids.shape[2] then
    error(string.format("llama: doc_start is {%s}, the ids {%s}", table.concat(doc_start.shape, ", "),
      table.concat(ids.shape, ", ")), 4)
  end
  local B, T = ids.shape[1], ids.shape[2]
  if doc_start.meta then return end -- (a dry run: nothing to read)
  local ds = doc_start:ptr()
  check(C.fsdp_doc_start_check(ds, B, T), "llama: packed rows")
  if T <= self.cfg.max_position_embeddings then return end
  local longest = 0
  for i = 0, B * T - 1 do longest = math.max(longest, i % T - ds[i] + 1) end
  if longest > self.cfg.max_position_embeddings then
    error(string.format("llama: a packed document of %d tokens passes max_position_embeddings %d", longest,
      self.cfg.max_position_embeddings), 4)
  end
end

-- Packed rows (documents one after another in a row of ids): doc_start,
-- an int32 {B, T} CPU tensor, the first position of each position's
-- document (ops.doc_layout); nil: each row is one sequence. The layers
-- read it until the next forward (a checkpointed layer's backward runs its
-- forward again with it).
local function pack(self, ids, doc_start)
  if self.cp then
    local B, T = ids.shape[1], ids.shape[2]
    local why = cpm.check(T, self.cp.size)
    if why then error("llama: " .. why, 3) end
    self.packed.cp = cp_layout(self, T, ids.device)
    if doc_start then -- packed rows: each query sees its document's keys alone, at its place in it
      check_docs(self, ids, doc_start)
      self.packed.cp = setmetatable({ starts = doc_start, lo = cpm.doc_bounds(self.cp, T, doc_start, ids.device) },
        { __index = self.packed.cp })
    end
    if self.tp then -- (this rank's rows: of its chunks)
      self.tp.whole = nil
      if (B * T / self.cp.size) % self.tp.size ~= 0 then
        error(string.format("llama: %d x %d tokens per cp rank do not split into rows for %d tp ranks", B, T / self.cp.size,
          self.tp.size), 3)
      end
      self.tp.rows = { B, T / self.cp.size }
    end
    self.packed.docs = nil
    return
  end
  if doc_start then check_docs(self, ids, doc_start) end
  if self.tp then -- (sequence parallelism: every tp rank holds an equal share of the rows)
    self.tp.whole = nil
    local B, T = ids.shape[1], ids.shape[2]
    if (B * T) % self.tp.size ~= 0 then
      error(string.format("llama: %d x %d tokens do not split into rows for %d tp ranks (micro-batch x data.seq must " ..
        "be a multiple of tp)", B, T, self.tp.size), 3)
    end
    self.tp.rows = { B, T }
  end
  self.packed.docs = doc_start and ops.doc_layout(doc_start, ids.device) or nil
end

function CausalLM:forward(ctx, ids, doc_start)
  ctx = ctx or nn.plain
  pack(self, ids, doc_start)
  return nn.forward_chain(ctx, head_mods(self, trunk(self)), local_part(self, ids, ids.shape[1]))
end

-- The logits of the last position only, {B = 1, vocab} (generation: the
-- head runs on one row, not on every prompt position). With tp every rank
-- runs all rows (the embedding's and each block's partial sums
-- all-reduced, each rank's heads cached) and the head's vocabulary
-- columns are gathered; with cp every rank runs the whole sequence, as
-- its model is whole.
function CausalLM:forward_last(ctx, ids)
  ctx = ctx or nn.plain
  if ids.shape[1] ~= 1 then error("llama forward_last: one sequence at a time (batch " .. ids.shape[1] .. ")", 2) end
  self.packed.cp, self.packed.docs = nil, nil
  local h, m, t = self.cfg.hidden_size, self.children[1], self.tp_mods
  local mods = { m.children[1], m.children[2], m.children[3] }
  if t then -- (until the next forward's pack)
    self.tp.whole, self.tp.rows = true, nil
    t.embed_sum = t.embed_sum or tpm.SumRows(self.tp)
    table.insert(mods, 2, t.embed_sum)
  end
  return autograd.scope(function()
    local nf = nn.forward_chain(ctx, mods, ids)
    local T = nf:numel() / h
    local logits = nn.call(ctx, self.children[2], "forward", nf:view((T - 1) * h, { 1, h }))
    if t then return nn.call(ctx, t.logits, "forward", logits) end
    return logits
  end)
end

-- How many targets count (not ignore_index), each checked against the vocabulary.
local function count_targets(targets, n, V, ignore_index)
  if targets:numel() ~= n then error(string.format("llama loss: %d targets for %d positions", targets:numel(), n), 3) end
  if targets.meta then return n end -- (a dry run: no ids to read)
  local t, count = targets:ptr(), 0
  for i = 0, n - 1 do
    local v = t[i]
    if v ~= ignore_index then
      if v < 0 or v >= V then
        error(string.format("llama loss: target %d at position %d is outside the vocabulary [0, %d)", v, i, V), 3)
      end
      count = count + 1
    end
  end
  return count
end

-- The forward and the mean cross-entropy over the targets that count, with
-- the head and the loss fused over chunks of rows: each chunk's logits (at
-- most chunk_bytes of them) are computed, turned into their gradient in
-- place, and pushed through the head's backward at once (its weight's
-- gradient accumulates, its input's goes into rows of one buffer), so the
-- full logits, the largest activation of a long sequence (1 GiB for 4096
-- tokens of a 128256 vocabulary in bf16), never exist. scale multiplies the
-- gradient (1 / micro-batches); backward(ctx) then starts from the head's
-- input. Without grads (ctx.no_grad) only the loss. targets: a CPU int32
-- tensor; on CUDA, targets_dev is its device copy. o.doc_start: packed
-- rows (CausalLM:forward). Returns the loss (a
-- number, or an ops.deferred on a GPU) and the count (with cp: of the
-- whole rows' targets, all cp ranks' together).
function CausalLM:forward_loss(ctx, ids, targets, o)
  ctx = ctx or nn.plain
  o = o or {}
  local cfg, head = self.cfg, self.children[2]
  local ignore = o.ignore_index or -100
  local V, h = cfg.vocab_size, cfg.hidden_size
  local count, norm
  pack(self, ids, o.doc_start)
  local tp = self.tp
  local sum, dnf = autograd.scope(function()
    local B = ids.shape[1]
    local nf = nn.forward_chain(ctx, trunk(self), local_part(self, ids, B))
    -- (cp: the loss is the mean over the rows' targets on every cp rank,
    -- which the step averages over them: each rank's sum over 1/cp of the
    -- count, however the targets fall into its chunks (masks, packed rows))
    if self.cp then count = count_targets(targets, targets:numel(), V, ignore) end
    targets = local_part(self, targets, B)
    local tdev = o.targets_dev and local_part(self, o.targets_dev, B)
    local coef = o.coef and local_part(self, o.coef, B)
    nf = head_rows(self, ctx, nf)
    local n = nf:numel() / h
    local here = count_targets(targets, n, V, ignore)
    count = count or here
    norm = self.cp and count / self.cp.size or count
    if nf.device == "cuda" and not tdev then error("llama forward_loss: on cuda the targets' device copy is needed", 0) end
    local rows = M.loss_rows(n, tp and V / tp.size or V, nf.esize, o.chunk_bytes or M.loss_chunk_bytes)
    local gscale = count > 0 and (o.scale or 1) / norm or 0
    local grad = not ctx.no_grad and ops.like(nf) or nil
    local parts = {}
    if coef and coef:numel() ~= n then error(string.format("llama forward_loss: %d coefficients for %d positions", coef:numel(), n), 0) end
    for r0 = 0, n - 1, rows do
      local r = math.min(rows, n - r0)
      autograd.scope(function() -- one chunk's logits, turned into their gradient in place
        local logits = nn.call(ctx, head, "forward", nf:view(r0 * h, { r, h }))
        local tv, tdv = targets:view(r0, r), tdev and tdev:view(r0, r)
        if coef and tp then -- a loss written over the log-probs: its gradient, coef (onehot - softmax)
          tpm.token_logprobs(tp, logits, tv, tdv, coef:view(r0, r), nil, nil, r, V, (tp:part(V)), ignore)
        elseif coef then
          ops.token_logprobs(nil, nil, logits, tv, tdv, coef:view(r0, r), r, V, ignore)
        elseif tp then
          parts[#parts + 1] = tpm.cross_entropy(tp, logits, tv, tdv, r, V, (tp:part(V)), ignore,
            grad and gscale or nil)
        else
          parts[#parts + 1] = ops.cross_entropy(logits, tv, tdv, r, V, ignore, gscale)
        end
        if grad then
          head.dx_into = grad:view(r0 * h, { r, h })
          nn.call(ctx, head, "backward", logits)
        end
      end)
    end
    if grad and tp then -- the head's input gradient: partial sums of all rows -> this rank's
      grad = nn.call(ctx, self.tp_mods.head_in, "backward", grad)
    end
    return #parts > 0 and ops.sum(parts) or 0, grad
  end)
  self.dnf = dnf
  if count == 0 or o.coef then return 0, count end
  return sum / norm, count
end

-- Forward only (ctx.no_grad): each position's log-probability of its
-- target (0 where the target is ignore_index) and, with o.entropy, the
-- entropy of its distribution: fp32 {n} tensors on the model's device,
-- computed over chunks of rows as forward_loss does (the full logits never
-- exist). o.doc_start, o.targets_dev, o.chunk_bytes as there. With
-- tensor parallelism each tp rank's slice of the vocabulary combines over
-- the group (fsdp.tp.token_logprobs); with context parallelism each cp
-- rank computes its tokens' and they are all-gathered (fsdp.cp.join):
-- every rank returns all n.
function CausalLM:forward_logprobs(ctx, ids, targets, o)
  ctx = ctx or nn.plain
  o = o or {}
  local cfg, head = self.cfg, self.children[2]
  local ignore = o.ignore_index or -100
  local V, h = cfg.vocab_size, cfg.hidden_size
  local tp, cp = self.tp, self.cp
  pack(self, ids, o.doc_start)
  return autograd.scope(function()
    local B = ids.shape[1]
    local nf = nn.forward_chain(ctx, trunk(self), local_part(self, ids, B))
    targets = local_part(self, targets, B)
    local tdev = o.targets_dev and local_part(self, o.targets_dev, B)
    nf = head_rows(self, ctx, nf)
    local n = nf:numel() / h
    count_targets(targets, n, V, ignore)
    if nf.device == "cuda" and not o.targets_dev then error("llama forward_logprobs: on cuda the targets' device copy is needed", 0) end
    local lp = tensor.new({ n }, "fp32", nf.device)
    local en = o.entropy and tensor.new({ n }, "fp32", nf.device) or nil
    local rows = M.loss_rows(n, tp and V / tp.size or V, nf.esize, o.chunk_bytes or M.loss_chunk_bytes)
    for r0 = 0, n - 1, rows do
      local r = math.min(rows, n - r0)
      autograd.scope(function()
        local logits = nn.call(ctx, head, "forward", nf:view(r0 * h, { r, h }))
        local lv, ev, tv, tdv = lp:view(r0, r), en and en:view(r0, r), targets:view(r0, r), tdev and tdev:view(r0, r)
        if tp then
          tpm.token_logprobs(tp, logits, tv, tdv, nil, lv, ev, r, V, (tp:part(V)), ignore)
        else
          ops.token_logprobs(lv, ev, logits, tv, tdv, nil, r, V, ignore)
        end
      end)
    end
    if cp then -- every cp rank's positions, in the sequence's order
      lp = cpm.join(cp, lp, B)
      en = en and cpm.join(cp, en, B)
    end
    return lp, en
  end)
end
-- chunk bytes of logits in forward_loss (the recipe's train.loss_chunk_mb)
M.loss_chunk_bytes = 256 * 2 ^ 20

-- Rows of logits per chunk in forward_loss (and the planner's): as many of
-- n as chunk_bytes hold, from 128 up a multiple of 128, so that the head's
-- GEMMs run whole tiles (4096 tokens of a 128256 vocabulary in bf16 go as
-- four chunks of 1024 rows, not three of 1046 and one of 958)
function M.loss_rows(n, V, esize, chunk_bytes)
  local rows = math.max(1, math.min(n, math.floor(chunk_bytes / (V * esize))))
  if rows < n and rows >= 128 then rows = rows - rows % 128 end
  return rows
end

-- train_step's and evaluate's opt.forward_loss for batches {x = ids,
-- y = targets, y_dev = their device copy on CUDA, doc_start = packed rows'
-- layout or nil}, chunk_bytes of logits at a time
function M.forward_loss(chunk_bytes)
  return function(model, ctx, b, scale)
    return (model:forward_loss(ctx, b.x, b.y, { scale = scale, targets_dev = b.y_dev, chunk_bytes = chunk_bytes,
      doc_start = b.doc_start }))
  end
end

-- train_step's loss options for train.loss_chunk_mb's chunk_bytes: the
-- fused head and loss over chunks (forward_loss), or with 0 the whole
-- logits and llama.loss (the trainer's, the planner's dry run's)
function M.step_loss(chunk_bytes)
  if chunk_bytes > 0 then return { forward_loss = M.forward_loss(chunk_bytes) } end
  return { loss = function(logits, b, scale) return M.loss(logits, b.y, scale, nil, b.y_dev) end }
end

-- from dlogits, or (after forward_loss) from the head input's gradient
function CausalLM:backward(ctx, dlogits)
  ctx = ctx or nn.plain
  local mods = trunk(self)
  local dy = self.dnf
  self.dnf = nil
  if not dy then
    head_mods(self, mods)
    dy = dlogits
  end
  nn.backward_chain(ctx, mods, dy)
end

-- The default FSDP units: one per decoder layer, the embeddings their own,
-- the final norm with the head.
function M.units(m, path)
  if m.kind == "LlamaDecoderLayer" then return path end
  if path == "model.embed_tokens" then return "embed" end
  if path == "model.norm" or path == "lm_head" then return "head" end
end

-- Mean cross-entropy over the tokens whose target is not ignore_index, and
-- its gradient written over the logits (fused: no second logits-sized
-- buffer); scale multiplies the gradient (1 / micro-batches).
-- targets: a CPU int32 tensor (counted and checked here); on CUDA,
-- targets_dev is its copy on the device.
function M.loss(logits, targets, scale, ignore_index, targets_dev)
  ignore_index = ignore_index or -100
  local V = logits.shape[#logits.shape]
  local n = logits:numel() / V
  local count = count_targets(targets, n, V, ignore_index)
  if logits.device == "cuda" and not targets_dev then error("llama loss: logits on cuda need the targets' device copy", 2) end
  local sum = ops.cross_entropy(logits, targets, targets_dev, n, V, ignore_index, count > 0 and (scale or 1) / count or 0)
  if count == 0 then return 0, logits, 0 end
  return sum / count, logits, count
end

return M
