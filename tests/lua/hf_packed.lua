-- hf_packed.lua DIR OUT: packed rows against Hugging Face. The model of the
-- Hugging Face folder DIR (its config.json) runs forward on 4 rows of 48
-- fixed token ids packed with documents: a row of 1, of 3 and of 7
-- documents, and a row holding the second piece of a document whose first
-- piece fills row 0 (pieces overlap by one token, as fsdp.packing cuts
-- them). Every target is the next token of the same document, some masked
-- (-100). Writes to OUT, one number a line: B, T, the ids, doc_start, the
-- targets, each target's log-probability (nan where masked; 17 digits),
-- then the loss over the targets. tests/scripts/hf_packed.py runs
-- transformers on each document alone and compares.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local hf = require "fsdp.hf"
local hf_config = require "fsdp.hf_config"
fsdp.init()
local dir, out = arg[1], arg[2]
local cfg = assert(hf_config.read(dir))
local mesh = fsdp.mesh("dp_shard=-1")
local s = fsdp.fully_shard(llama.model(cfg), { shard = mesh:group("dp_shard"), units = llama.units, zero = 3 })
hf.import(s, cfg, dir, { quiet = true })
local B, T = 4, 48
local rows = { { 48 }, { 10, 17, 21 }, { 3, 9, 5, 8, 6, 7, 10 }, { 20, 28 } }
local x, y, ds = fsdp.tensor({ B, T }, "int32"), fsdp.tensor({ B, T }, "int32"), fsdp.tensor({ B, T }, "int32")
local xp, yp, dp = x:ptr(), y:ptr(), ds:ptr()
local g = 12345
local function rnd(n)
  g = (g * 1103515245 + 12345) % 2147483648
  return g % n
end
for r, lens in ipairs(rows) do
  local t = 0
  for _, l in ipairs(lens) do
    for j = 0, l - 1 do
      local i = (r - 1) * T + t + j
      xp[i], dp[i] = rnd(cfg.vocab_size), t
    end
    t = t + l
  end
end
-- row 3's first document is a long document's second piece: it starts
-- with the last token of row 0, whose 48 tokens are its first piece
xp[3 * T] = xp[T - 1]
for i = 0, B * T - 1 do
  local nxt = i % T + 1 < T and dp[i + 1] == dp[i]
  yp[i] = (nxt and rnd(5) > 0) and xp[i + 1] or -100 -- a fifth of the targets masked
end
local f = assert(io.open(out, "w"))
f:write(B, "\n", T, "\n")
for _, t in ipairs({ xp, dp, yp }) do for i = 0, B * T - 1 do f:write(t[i], "\n") end end
local loss = s:evaluate({ { x = x, y = y, doc_start = ds } }, function(logits, b)
  local lp, V = logits:ptr(), cfg.vocab_size
  for i = 0, B * T - 1 do
    local t = yp[i]
    if t == -100 then f:write("nan\n") else
      local mx = -math.huge
      for c = 0, V - 1 do mx = math.max(mx, lp[i * V + c]) end
      local z = 0
      for c = 0, V - 1 do z = z + math.exp(lp[i * V + c] - mx) end
      f:write(string.format("%.17g\n", lp[i * V + t] - mx - math.log(z)))
    end
  end
  return (llama.loss(logits, b.y, 0))
end)
f:write(string.format("%.17g\n", loss))
f:close()
s:free()
mesh:free()
