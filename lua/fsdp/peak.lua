-- fsdp.peak: the hardware's peak FLOP/s, the denominator of the trainer's
-- MFU (model FLOPs per second over this peak), and the GEMM rate measured
-- at start (the trainer's separate gemm_frac). How each peak is found is
-- in docs/TRAINING.md ("MFU").
local M = {}

-- GPUs by name: the first entry whose pattern is in the lower-cased device
-- name. Dense TFLOP/s (no 2:4 sparsity) from NVIDIA's datasheets: bf16 on
-- the tensor cores, fp32 on the CUDA cores (our fp32 GEMMs compute in
-- CUBLAS_COMPUTE_32F: no TF32). H100/H200 SXM at their 1.98 GHz boost.
M.gpus = {
  { "h100 pcie", "H100 PCIe", bf16 = 756, fp32 = 51 },
  { "h100 nvl", "H100 NVL", bf16 = 835, fp32 = 60 },
  { "h200 nvl", "H200 NVL", bf16 = 835, fp32 = 60 },
  { "gh200", "GH200", bf16 = 989, fp32 = 67 },
  { "h100", "H100 SXM", bf16 = 989, fp32 = 67 },
  { "h200", "H200 SXM", bf16 = 989, fp32 = 67 },
  { "a100", "A100", bf16 = 312, fp32 = 19.5 },
}

-- FLOP/s of one GPU named name at dtype ("bf16" or "fp32"), and what it is;
-- nil and why for a GPU not in the table
function M.gpu(name, dtype)
  local lower = name:lower()
  for _, g in ipairs(M.gpus) do
    if lower:find(g[1], 1, true) then
      local t = g[dtype]
      if not t then return nil, string.format("no %s peak for %s in fsdp.peak's table", dtype, name) end
      return t * 1e12, string.format("%s, %s datasheet: %g TFLOP/s dense %s", name, g[2], t, dtype)
    end
  end
  return nil, string.format("GPU '%s' is not in fsdp.peak's table", name)
end

-- "0-3,8,10-11" -> { [0] = true, ... }
function M.cpu_list(s)
  local set = {}
  for part in s:gmatch("[^,%s]+") do
    local a, b = part:match("^(%d+)%-(%d+)$")
    a, b = tonumber(a or part), tonumber(b or part)
    if a and b then for i = a, b do set[i] = true end end
  end
  return set
end

-- /proc/cpuinfo's text -> one table per processor
function M.parse_cpuinfo(text)
  local cpus, cur = {}, nil
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local k, v = line:match("^([^:]-)%s*:%s*(.*)$")
    if k == "processor" then
      cur = { id = tonumber(v), flags = {} }
      cpus[#cpus + 1] = cur
    elseif cur and k then
      if k == "flags" then for f in v:gmatch("%S+") do cur.flags[f] = true end
      elseif k == "vendor_id" then cur.vendor = v
      elseif k == "cpu family" then cur.family = tonumber(v)
      elseif k == "model" then cur.model = tonumber(v)
      elseif k == "model name" then cur.name = v
      elseif k == "cpu MHz" then cur.mhz = tonumber(v)
      elseif k == "physical id" then cur.package = v
      elseif k == "core id" then cur.core = v
      end
    end
  end
  return cpus
end

-- fp32 FLOPs per cycle of one core by its flags: vector lanes x 2 (a fused
-- multiply-add, or a multiply and an add) x the units that issue them each
-- cycle; the instruction set it reads that from; and the widest the flags
-- allow (the cap of a timed figure, below)
local function per_cycle(c)
  local f = c.flags
  local bits, units, isa
  if f.avx512f then bits, units, isa = 512, 2, "avx512f"
  elseif f.avx2 and f.fma then bits, units, isa = 256, 2, "avx2+fma"
  elseif f.avx then bits, units, isa = 256, 1, "avx"
  elseif f.sse2 or f.sse then bits, units, isa = 128, 1, "sse"
  else return nil end
  local widest = bits / 32 * 2 * units
  -- untimed, AMD before Zen 5 (family 26) has no wider datapath than 256
  -- bits (Zen 4 runs AVX-512 as two halves), Zen and Zen+ 128 bits
  if c.vendor == "AuthenticAMD" and (c.family or 0) < 26 then
    local width = ((c.family or 0) == 23 and (c.model or 0) < 0x30) and 128 or 256
    if bits > width then isa = string.format("%s on %d-bit units", isa, width) end
    bits = math.min(bits, width)
  end
  return bits / 32 * 2 * units, isa, widest
end

-- FLOPs per cycle from timed fused multiply-adds (fsdp_core_fma_flops over
-- the clock): a core's units and their width are powers of two, so the
-- nearest one, which absorbs a timing off by up to 41% either way; never
-- above what the flags allow (a clock read low, the kernel's nominal one,
-- only makes the rate look faster). nil where nothing was timed.
function M.timed_per_cycle(fma_flops, hz, widest)
  if not (fma_flops and fma_flops > 0 and hz and hz > 0) then return nil end
  local raw = fma_flops / hz
  local p2 = 2 ^ math.floor(math.log(raw) / math.log(2) + 0.5)
  return math.max(math.min(p2, widest), 1), raw
end

-- The peak of the CPUs this process may use: cores x clock x FLOPs per
-- cycle. text: /proc/cpuinfo; opts.allowed: the Cpus_allowed_list of
-- /proc/self/status (nil: every processor); opts.max_khz: { [cpu id] =
-- cpufreq's cpuinfo_max_freq } where it exists (else cpuinfo's "cpu MHz");
-- opts.measured_mhz: the clock a core was measured at (fsdp_core_clock_hz),
-- taken where it is higher (a VM's cpuinfo says the nominal clock while
-- the core boosts: 2596 against 3700 MHz on a Zen 4); opts.fma_flops: one
-- core's timed fused multiply-adds (fsdp_core_fma_flops), which set the
-- FLOPs per cycle where given (M.timed_per_cycle), else the flags do.
-- Returns { flops, cores, mhz, per_cycle, isa, name, widest (the flags'
-- most FLOPs per cycle), what }, or nil and why.
function M.cpu(text, opts)
  opts = opts or {}
  local allowed = opts.allowed and M.cpu_list(opts.allowed)
  local cores, n, mhz, first, cpufreq = {}, 0, 0, nil, false
  for _, c in ipairs(M.parse_cpuinfo(text)) do
    if not allowed or allowed[c.id] then
      first = first or c
      -- hardware threads of one core share its vector units
      local key = c.core and ((c.package or "0") .. ":" .. c.core) or ("cpu" .. c.id)
      if not cores[key] then cores[key] = true; n = n + 1 end
      local khz = opts.max_khz and opts.max_khz[c.id]
      cpufreq = cpufreq or khz ~= nil
      mhz = math.max(mhz, khz and khz / 1000 or c.mhz or 0)
    end
  end
  if not first then return nil, "no processor of /proc/cpuinfo is available to this process" end
  local fpc, isa, widest = per_cycle(first)
  if not fpc then return nil, "/proc/cpuinfo names no x86 vector unit (avx512f, avx2, avx, sse)" end
  local clock = string.format("%.0f MHz", mhz)
  local measured = opts.measured_mhz or 0
  if measured > mhz then
    clock = mhz > 0 and string.format("%.0f MHz (measured; the kernel says %.0f)", measured, mhz)
      or string.format("%.0f MHz (measured)", measured)
    mhz = measured
  end
  if mhz <= 0 then return nil, "neither cpufreq nor /proc/cpuinfo gives a clock, and none was measured" end
  -- timed FLOPs per cycle need a clock near the one the core ran them at:
  -- a measured one or cpufreq's; a VM's `cpu MHz` alone is often the
  -- nominal clock, far under the boosted one (Zen 4's 32 read as 45.5
  -- there, nearer 64), and then the flags decide
  local timed, raw
  if cpufreq or measured > 0 then timed, raw = M.timed_per_cycle(opts.fma_flops, mhz * 1e6, widest) end
  if timed then
    fpc, isa = timed, string.format("%s, timed at %.1f", isa:match("^%S+"), raw)
  end
  local flops = n * mhz * 1e6 * fpc
  local name = first.name or "CPU"
  return { flops = flops, cores = n, mhz = mhz, per_cycle = fpc, isa = isa, name = name, widest = widest,
    what = string.format("%s, %d cores x %s x %d fp32 FLOP/cycle (%s)", name, n, clock, fpc, isa) }
end

-- the core's clock and its fused multiply-adds, measured once per process
-- (~10 ms + ~10 ms; later calls, e.g. a second run in one process, get the
-- same peak). A rate below the flags' widest unit is timed twice more, 20
-- ms apart, and the best kept: a rank whose measurement shared a core's
-- units with another (hardware threads) reads half.
local measured_mhz, measured_fma
local function core_mhz()
  measured_mhz = measured_mhz or require("fsdp.ffi").C.fsdp_core_clock_hz() / 1e6
  return measured_mhz
end
local function core_fma(hz, widest)
  if measured_fma then return measured_fma end
  local C, ffi = require("fsdp.ffi").C, require "ffi"
  pcall(ffi.cdef, "int usleep(unsigned int us);")
  local bits = widest == 64 and 512 or widest == 32 and 256 or -1 -- -1: nothing to time (AVX, SSE)
  local best = C.fsdp_core_fma_flops(bits)
  for _ = 1, 2 do
    if not (best > 0 and hz > 0) or M.timed_per_cycle(best, hz, widest) >= widest then break end
    ffi.C.usleep(20000)
    best = math.max(best, C.fsdp_core_fma_flops(bits))
  end
  measured_fma = best
  return best
end

-- M.cpu on this machine's files and its measured clock
function M.this_cpu()
  local slurp = require("fsdp.checkpoint").read_text
  local text = slurp("/proc/cpuinfo")
  if not text then return nil, "cannot read /proc/cpuinfo" end
  local status = slurp("/proc/self/status") or ""
  local max_khz = {}
  for _, c in ipairs(M.parse_cpuinfo(text)) do
    max_khz[c.id] = tonumber(slurp(string.format("/sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq", c.id)) or "")
  end
  local opts = { allowed = status:match("Cpus_allowed_list:%s*([%d,%-]+)"), max_khz = max_khz,
    measured_mhz = core_mhz() }
  local untimed, why = M.cpu(text, opts)
  if not untimed then return nil, why end
  opts.fma_flops = core_fma(untimed.mhz * 1e6, untimed.widest)
  return M.cpu(text, opts)
end

-- The peak one rank divides by. o.device ("cpu", "cuda"), o.dtype (the
-- GPU's compute dtype; CPU ops compute in fp32), o.ranks (ranks sharing the device: a machine's CPU
-- ranks, or a GPU's), o.override (train.peak_tflops: one device's peak),
-- o.gpu_name, o.cpu (M.this_cpu()'s result, or nil and why in o.cpu_why),
-- o.bound (a launcher bound this rank to its own cores, fsdp_rank_cores: the
-- CPUs o.cpu counted are this rank's alone, not shared by o.ranks).
-- Returns { flops = per-rank FLOP/s or nil, what = one line to print }.
function M.for_rank(o)
  local dev, why
  if o.override then
    dev, why = o.override * 1e12, string.format("train.peak_tflops = %g", o.override)
  elseif o.device == "cuda" then
    dev, why = M.gpu(o.gpu_name, o.dtype)
  elseif o.cpu then
    dev, why = o.cpu.flops, o.cpu.what
  else
    why = o.cpu_why or "no CPU peak"
  end
  if not dev then return { what = why .. "; no MFU is reported: set train.peak_tflops" } end
  local unit = dev >= 1e12 and string.format("%.1f TFLOP/s", dev / 1e12) or string.format("%.1f GFLOP/s", dev / 1e9)
  if o.bound and o.device ~= "cuda" and not o.override then
    return { flops = dev, what = string.format("%s per rank, the cores its launcher bound it to (%s)", unit, why) }
  end
  local share = o.ranks > 1 and string.format(", shared by %d ranks", o.ranks) or ""
  return { flops = dev / o.ranks, what = string.format("%s per %s%s (%s)", unit, o.device == "cuda" and "GPU" or "machine",
    share, why) }
end

-- The GEMM rate of one rank (FLOP/s), the best of n-cube GEMMs in the
-- compute dtype (fp32 on CPUs) on the compute stream over 0.1 s, at least
-- three: a secondary figure (gemm_frac), not worth a longer start (every
-- run paid 0.3 s for it, most of a small run's start)
function M.gemm_rate(fsdp, device, dtype)
  local C, check = fsdp.C, fsdp.check
  local n, reps = device == "cuda" and 4096 or 1024, device == "cuda" and 10 or 1
  dtype = device == "cuda" and dtype or "fp32"
  local a, b, c = fsdp.tensor({ n, n }, dtype, device), fsdp.tensor({ n, n }, dtype, device), fsdp.tensor({ n, n }, dtype, device)
  check(C.fsdp_memset(a.data, 0x3c, a:nbytes(), nil), "gemm rate")
  check(C.fsdp_memset(b.data, 0x3c, b:nbytes(), nil), "gemm rate")
  local ops = require "fsdp.ops"
  local cs = device == "cuda" and ops.compute_stream() or nil
  local best, t_end, runs = 0, C.fsdp_time_now() + 0.1, 0
  while runs < 3 or C.fsdp_time_now() < t_end do
    runs = runs + 1
    local t0 = C.fsdp_time_now()
    for _ = 1, reps do ops.linear_forward(c, a, b.data, nil, n, n, n) end
    if cs then cs:synchronize() end
    local dt = C.fsdp_time_now() - t0
    if dt > 0 then best = math.max(best, reps * 2 * n ^ 3 / dt) end
  end
  a:free(); b:free(); c:free()
  return best
end

return M
