-- alloc_trace.lua RECIPE [field=value ...]: trains RECIPE and prints every
-- tensor allocation on the device (ALLOC_TRACE_DEVICE, default cuda) with the
-- allocator's allocated and peak bytes after it and where it was made, and
-- a line at each step's peak reset: where a step's peak comes from, for
-- when the planner and a run disagree (a jump of the peak that no Lua
-- allocation explains was made inside C, such as cuDNN's workspace).
--   fsdprun -n 1 --host build/fsdp bench/alloc_trace.lua bench/llama1b.lua train.steps=3
local fsdp = require "fsdp"
local tensor = require "fsdp.tensor"
require "fsdp.autograd"
local train = require "fsdp.train"
local dev = os.getenv("ALLOC_TRACE_DEVICE") or "cuda"
local on_new = tensor.on_new
local function where()
  local out = {}
  for lvl = 3, 12 do
    local i = debug.getinfo(lvl, "Sl")
    if not i then break end
    local s = i.short_src:match("[^/]*$")
    if s ~= "tensor.lua" and s ~= "autograd.lua" and s ~= "alloc_trace.lua" then out[#out + 1] = s .. ":" .. i.currentline end
    if #out == 3 then break end
  end
  return table.concat(out, " < ")
end
tensor.on_new = function(t)
  if on_new then on_new(t) end
  if t.device == dev then
    local st = fsdp.memory_stats(dev)
    print(string.format("trace alloc %10d %-5s %-18s allocated %12d peak %12d  %s", t.n * t.esize, t.dtype,
      table.concat(t.shape, "x"), st.allocated, st.peak, where()))
  end
end
local reset = fsdp.memory_reset_peak
fsdp.memory_reset_peak = function(d)
  local st = fsdp.memory_stats(dev)
  print(string.format("trace reset (before: allocated %d peak %d)", st.allocated, st.peak))
  return reset(d)
end
local path = arg[1]
local r = dofile(path)
local over = {}
for i = 2, #arg do over[#over + 1] = arg[i] end
train.main(r, path, unpack(over))
local st = fsdp.memory_stats(dev)
print(string.format("trace end allocated %d peak %d", st.allocated, st.peak))
