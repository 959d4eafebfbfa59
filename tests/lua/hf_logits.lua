-- hf_logits.lua DIR ROOT OUT [tied|folder [EXPORT]]: the tiny recipe's model
-- (recipes/tiny.lua under ROOT; "tied": with tie_word_embeddings; "folder":
-- the architecture of DIR's config.json instead) with the weights of the
-- Hugging Face folder DIR, run forward on 2 x 48 fixed token ids; writes the
-- ids, then the logits, one number a line (17 digits), to OUT, and with
-- EXPORT exports the model there again (fp32). tests/scripts/
-- test_hf_transformers.sh compares them with transformers' LlamaForCausalLM
-- on the same folder (and on EXPORT).
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
fsdp.init()
local dir, root, out = arg[1], arg[2], arg[3]
local cfg
if arg[4] == "folder" then
  cfg = assert(hf_config.read(dir))
else
  local spec = dofile(root .. "/recipes/tiny.lua").model
  spec.tie_word_embeddings = arg[4] == "tied"
  cfg = llama.config(spec)
end
local mesh = fsdp.mesh("dp_shard=-1")
local s = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3 })
hf.import(s, cfg, dir, { quiet = true })
local B, T = 2, 48
local ids = fsdp.tensor({ B, T }, "int32")
local x = 12345
for i = 0, B * T - 1 do -- a fixed LCG over the vocabulary
  x = (x * 1103515245 + 12345) % 2147483648
  ids:ptr()[i] = x % cfg.vocab_size
end
local f = assert(io.open(out, "w"))
s:evaluate({ { x = ids, y = ids } }, function(y)
  for i = 0, B * T - 1 do f:write(tostring(ids:ptr()[i]), "\n") end
  local p = y:ptr()
  for i = 0, y:numel() - 1 do f:write(string.format("%.17g\n", p[i])) end
  return 0
end)
f:close()
if arg[5] then hf.export(s, cfg, arg[5], { dtype = "fp32" }) end
s:free()
mesh:free()
