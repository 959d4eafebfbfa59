-- hf_logits.lua DIR ROOT OUT [tied|folder [EXPORT]] [mesh=SPEC] [cp_attention=WAY]: the tiny
-- recipe's model (recipes/tiny.lua under ROOT; "tied": with
-- tie_word_embeddings; "folder": the architecture of DIR's config.json
-- instead) with the weights of the Hugging Face folder DIR, run forward on
-- 2 x 48 fixed token ids; writes the ids, then the logits, one number a line
-- (17 digits), to OUT, and with EXPORT exports the model there again (fp32).
-- tests/scripts/test_hf_transformers.sh compares them with transformers'
-- LlamaForCausalLM on the same folder (and on EXPORT).
-- mesh=SPEC (under fsdprun -n W): the model at that mesh, its tp and cp
-- groups and FSDP's shard group as the trainer makes them (dp_shard=1,tp=2;
-- dp_shard=1,cp=2; dp_shard=1,cp=2,tp=2). With tp every rank has the whole
-- logits (the head's vocabulary columns gathered); with cp each rank has its
-- two chunks' rows of each sequence: rank 0 gathers every rank's rows and
-- puts each at its sequence position from fsdp.cp.positions, then writes OUT
-- in the order of one rank's. The tp ranks of a cp rank must have the same
-- logits, bit for bit (checked here: the run fails if not). cp_attention:
-- all_gather (the default) or ring (llama.model's option).
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
local tpm = require "fsdp.tp"
local cpm = require "fsdp.cp"
local info = fsdp.init()
local args, spec, way = {}, "dp_shard=-1", nil
for i = 1, #arg do
  local m, w = arg[i]:match("^mesh=(.+)$"), arg[i]:match("^cp_attention=(.+)$")
  if m then spec = m elseif w then way = w else args[#args + 1] = arg[i] end
end
local dir, root, out = args[1], args[2], args[3]
local cfg
if args[4] == "folder" then
  cfg = assert(hf_config.read(dir))
else
  local r = dofile(root .. "/recipes/tiny.lua").model
  r.tie_word_embeddings = args[4] == "tied"
  cfg = llama.config(r)
end
local mesh = fsdp.mesh(spec)
local size = {}
for _, d in ipairs(mesh:dims()) do size[d.name] = d.size end
local P, Cp = size.tp or 1, size.cp or 1
local tpc, cpc = P > 1 and mesh:group("tp") or nil, Cp > 1 and mesh:group("cp") or nil
local model = llama.model(cfg, { tp = tpc and tpm.group(tpc), cp = cpc and tpm.group(cpc), cp_attention = way })
local s = fsdp.fully_shard(model, { shard = mesh:group(cpc and "dp_shard,cp" or "dp_shard"), tp = tpc, units = llama.units,
  zero = 3 })
hf.import(s, cfg, dir, { quiet = true })
local B, T = 2, 48
local ids = fsdp.tensor({ B, T }, "int32")
local x = 12345
for i = 0, B * T - 1 do -- a fixed LCG over the vocabulary
  x = (x * 1103515245 + 12345) % 2147483648
  ids:ptr()[i] = x % cfg.vocab_size
end
local V, Tl = cfg.vocab_size, T / Cp
s:evaluate({ { x = ids, y = ids } }, function(y)
  if y:numel() ~= B * Tl * V then
    error(string.format("hf_logits: %d logits on rank %d, expected %d x %d x %d", y:numel(), info.rank, B, Tl, V))
  end
  -- every rank's logits to every rank ({world, B * Tl, V}): world rank w is
  -- (..., cp rank, tp rank) in the mesh's order, tp innermost
  local world = mesh:group("world")
  local W = world:size()
  local all = fsdp.tensor({ W, B * Tl, V })
  world:all_gather(all, y)
  world:synchronize()
  if info.rank == 0 then
    local a, n = all:ptr(), B * Tl * V
    for w = 0, W - 1 do -- the tp ranks of a cp rank: the same whole logits
      local first = w - w % P
      for i = 0, n - 1 do
        if a[w * n + i] ~= a[first * n + i] then
          error(string.format("hf_logits: world rank %d's logit %d is %.9g, rank %d's %.9g", w, i, a[w * n + i], first,
            a[first * n + i]))
        end
      end
    end
    local rows = {} -- global row b * T + t -> (world rank, local row)
    for c = 0, Cp - 1 do
      local w = c * P -- (cp rank c's tp rank 0; dp_shard = 1, no dp_outer)
      local pos = Cp > 1 and cpm.positions(tpm.group(nil, Cp, c), T) or nil
      for b = 0, B - 1 do
        for j = 0, Tl - 1 do rows[b * T + (pos and pos:ptr()[j] or j)] = { w, b * Tl + j } end
      end
      if pos then pos:free() end
    end
    local f = assert(io.open(out, "w"))
    for i = 0, B * T - 1 do f:write(tostring(ids:ptr()[i]), "\n") end
    for g = 0, B * T - 1 do
      local at = rows[g]
      if not at then error("hf_logits: no rank holds row " .. g .. " of the sequences") end
      local o = (at[1] * B * Tl + at[2]) * V
      for v = 0, V - 1 do f:write(string.format("%.17g\n", a[o + v])) end
    end
    f:close()
  end
  all:free()
  return 0
end)
if args[5] then hf.export(s, cfg, args[5], { dtype = "fp32" }) end
s:free()
mesh:free()
