-- test_peak.lua (fsdp test_peak.lua): the MFU's peaks (lua/fsdp/peak.lua)
-- against values computed by hand: CPUs from made-up /proc/cpuinfo texts
-- (cores x clock x FLOPs per cycle of the widest vector unit), GPUs from
-- their names, train.peak_tflops, and the share of each rank. Exact up to
-- 1e-12 relative (the arithmetic is a few products).
local fsdp = require "fsdp"
local peak = require "fsdp.peak"
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")("test_peak")
local check = T.check

local function near(a, b) return a and b and math.abs(a - b) <= 1e-12 * math.abs(b) end

-- one "processor" block of /proc/cpuinfo
local function proc(id, o)
  local lines = { "processor\t: " .. id, "vendor_id\t: " .. o.vendor, "cpu family\t: " .. o.family, "model\t\t: " .. o.model,
    "model name\t: " .. o.name }
  if o.mhz then lines[#lines + 1] = "cpu MHz\t\t: " .. o.mhz end
  if o.core then
    lines[#lines + 1] = "physical id\t: " .. (o.package or 0)
    lines[#lines + 1] = "core id\t\t: " .. o.core
  end
  lines[#lines + 1] = "flags\t\t: fpu vme de pse tsc msr " .. o.flags .. " rdrand hypervisor"
  return table.concat(lines, "\n") .. "\n\n"
end
local function cpuinfo(list)
  local parts = {}
  for i, o in ipairs(list) do parts[i] = proc(i - 1, o) end
  return table.concat(parts)
end

-- Intel with AVX-512, 2 cores x 2 hardware threads (processors 0 and 2 on core 0)
local xeon = { vendor = "GenuineIntel", family = 6, model = 85, name = "Intel(R) Xeon(R) Gold 6148", mhz = "2000.000",
  flags = "sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512dq" }
local function at(o, core) local c = {}; for k, v in pairs(o) do c[k] = v end; c.core = core; return c end
local xeon4 = cpuinfo({ at(xeon, 0), at(xeon, 1), at(xeon, 0), at(xeon, 1) })
do
  local p = peak.cpu(xeon4)
  check(p and p.cores == 2 and p.per_cycle == 64 and near(p.flops, 2 * 2000e6 * 64), "avx512f: 2 cores x 2000 MHz x 64 (hardware threads not counted)")
  p = peak.cpu(xeon4, { max_khz = { [0] = 3500000, 3500000, 3500000, 3500000 } })
  check(p and near(p.flops, 2 * 3500e6 * 64) and p.mhz == 3500, "cpufreq's max clock, where it exists, over cpu MHz")
  p = peak.cpu(xeon4, { allowed = "0,2", max_khz = { [0] = 3500000, 3500000, 3500000, 3500000 } })
  check(p and p.cores == 1 and near(p.flops, 3500e6 * 64), "only the allowed processors (0 and 2: one core)")
  check(p.what:find("Xeon", 1, true) and p.what:find("1 cores x 3500 MHz x 64 fp32 FLOP/cycle (avx512f)", 1, true), "described: " .. p.what)
end

-- this development machine's kind: AMD EPYC (Zen 4, family 25) with AVX-512 on 256-bit units, no core ids in a VM
do
  local zen4 = { vendor = "AuthenticAMD", family = 25, model = 17, name = "AMD EPYC", mhz = "2596.142",
    flags = "sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512bw avx512vl" }
  local p = peak.cpu(cpuinfo({ zen4, zen4 }))
  check(p and p.cores == 2 and p.per_cycle == 32 and near(p.flops, 2 * 2596.142e6 * 32), "Zen 4: 2 x 2596.142 MHz x 32")
  check(p.isa == "avx512f on 256-bit units", "Zen 4's isa: " .. tostring(p.isa))
  local zen1 = { vendor = "AuthenticAMD", family = 23, model = 1, name = "AMD EPYC 7601", mhz = "2200.000",
    flags = "sse sse2 fma avx avx2" }
  p = peak.cpu(cpuinfo({ zen1 }))
  check(p and p.per_cycle == 16 and near(p.flops, 2200e6 * 16), "Zen 1: 128-bit units, 16 FLOP/cycle")
  local zen5 = { vendor = "AuthenticAMD", family = 26, model = 2, name = "AMD EPYC 9005", mhz = "3000.000",
    flags = "sse sse2 fma avx avx2 avx512f" }
  check(peak.cpu(cpuinfo({ zen5 })).per_cycle == 64, "Zen 5: full 512-bit units")
  -- a VM's cpuinfo says the nominal clock while the core boosts: the measured clock where it is higher
  p = peak.cpu(cpuinfo({ zen4, zen4 }), { measured_mhz = 3694.4 })
  check(p and near(p.flops, 2 * 3694.4e6 * 32) and p.mhz == 3694.4, "the measured clock over cpuinfo's lower one")
  check(p.what:find("2 cores x 3694 MHz (measured; the kernel says 2596) x 32 fp32", 1, true), "described: " .. p.what)
  p = peak.cpu(cpuinfo({ zen4, zen4 }), { measured_mhz = 1800 })
  check(p and near(p.flops, 2 * 2596.142e6 * 32) and not p.what:find("measured", 1, true),
    "a measured clock under the kernel's (a busy core) leaves the kernel's")
  p = peak.cpu(xeon4, { max_khz = { [0] = 3500000, 3500000, 3500000, 3500000 }, measured_mhz = 3400 })
  check(p and near(p.flops, 2 * 3500e6 * 64), "cpufreq's turbo clock over a lower measured one")
end

-- FLOPs per cycle timed: fused multiply-adds over the clock, to the nearest
-- power of two, never above the flags' widest unit; they replace the flags'
-- rule, which a VM's CPUID (another family) or a Xeon with one AVX-512 unit
-- gets wrong
do
  local t = peak.timed_per_cycle
  check(t(265e9, 4.15e9, 64) == 64, "two 512-bit units: 64")
  check(t(133e9, 4.15e9, 64) == 32, "512-bit vectors on 256-bit units, or one 512-bit unit: 32")
  check(t(67.2e9, 2.1e9, 64) == 32, "a Xeon with one AVX-512 unit at 2.1 GHz: 32")
  check(t(46e9, 1e9, 64) == 64 and t(45e9, 1e9, 64) == 32, "the nearest power of two (the boundary at 45.25)")
  check(t(190e9, 2.1e9, 64) == 64, "a nominal clock under the real one reads faster: capped at the flags' 64")
  check(t(138e9, 4.3e9, 32) == 32, "AVX2 + FMA: 32")
  check(t(0, 4e9, 64) == nil and t(100e9, 0, 64) == nil and t(nil, 4e9, 64) == nil, "nothing timed: nil")
  local zen4 = { vendor = "AuthenticAMD", family = 25, model = 17, name = "AMD EPYC", mhz = "2596.142",
    flags = "sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512bw avx512vl" }
  local p = peak.cpu(cpuinfo({ zen4, zen4 }), { measured_mhz = 4200, fma_flops = 268.8e9 })
  check(p and p.per_cycle == 64 and near(p.flops, 2 * 4200e6 * 64) and p.what:find("x 64 fp32 FLOP/cycle (avx512f, timed at 64.0)", 1, true),
    "a VM naming family 25 on cores that time 64 FLOP a cycle: 64, said so: " .. (p and p.what or "nil"))
  p = peak.cpu(xeon4, { measured_mhz = 2000, fma_flops = 2000e6 * 32 })
  check(p and p.per_cycle == 32 and near(p.flops, 2 * 2000e6 * 32), "a Xeon whose AVX-512 times 32 FLOP a cycle: 32")
  p = peak.cpu(cpuinfo({ zen4, zen4 }), { measured_mhz = 4200, fma_flops = 0 })
  check(p and p.per_cycle == 32 and p.isa == "avx512f on 256-bit units", "nothing timed: the flags' rule")
  p = peak.cpu(cpuinfo({ zen4, zen4 }), { fma_flops = 3700e6 * 32 })
  check(p and p.per_cycle == 32 and p.isa == "avx512f on 256-bit units",
    "no clock but a VM's cpu MHz (2596 where the core runs 3700: 45.6 a cycle): the flags' rule, not 64")
  p = peak.cpu(xeon4, { max_khz = { [0] = 3500000, 3500000, 3500000, 3500000 }, fma_flops = 3500e6 * 32 })
  check(p and p.per_cycle == 32, "cpufreq's clock: the timing stands (32)")
end

-- older vector units
do
  local function one(flags) return peak.cpu(cpuinfo({ { vendor = "GenuineIntel", family = 6, model = 60, name = "x",
    mhz = "3000.000", flags = flags } })) end
  check(near(one("sse sse2 avx avx2 fma").flops, 3000e6 * 32), "AVX2 + FMA: 32 FLOP/cycle")
  check(near(one("sse sse2 avx").flops, 3000e6 * 16), "AVX without FMA: 16")
  check(near(one("sse sse2").flops, 3000e6 * 8), "SSE: 8")
  check(one("sse sse2 avx avx2").per_cycle == 16, "AVX2 without FMA counts as AVX")
end

-- what it cannot know
do
  local arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\nCPU implementer\t: 0x41\n\n"
  local p, why = peak.cpu(arm)
  check(p == nil and why:find("no x86 vector unit", 1, true), "no x86 flags: no peak, and why: " .. tostring(why))
  p, why = peak.cpu(cpuinfo({ { vendor = "GenuineIntel", family = 6, model = 60, name = "x", flags = "sse sse2 avx" } }))
  check(p == nil and why:find("clock", 1, true), "no clock: no peak, and why")
  p = peak.cpu(cpuinfo({ { vendor = "GenuineIntel", family = 6, model = 60, name = "x", flags = "sse sse2 avx" } }),
    { measured_mhz = 3000 })
  check(p and near(p.flops, 3000e6 * 16) and p.what:find("3000 MHz (measured)", 1, true), "no clock from the kernel: the measured one")
  p, why = peak.cpu(xeon4, { allowed = "7" })
  check(p == nil and why:find("no processor", 1, true), "no allowed processor: no peak, and why")
  local s = peak.cpu_list("0-3,8,10-11")
  check(s[0] and s[3] and s[8] and s[10] and s[11] and not s[4] and not s[9], "cpu lists")
end

-- GPUs by name
do
  local cases = {
    { "NVIDIA H100 80GB HBM3", "bf16", 989 }, { "NVIDIA H100 80GB HBM3", "fp32", 67 }, { "NVIDIA H100 PCIe", "bf16", 756 },
    { "NVIDIA H100 NVL", "bf16", 835 }, { "NVIDIA H200", "bf16", 989 }, { "NVIDIA H200 NVL", "bf16", 835 },
    { "NVIDIA GH200 480GB", "bf16", 989 }, { "NVIDIA A100-SXM4-80GB", "bf16", 312 }, { "NVIDIA A100 80GB PCIe", "fp32", 19.5 },
  }
  for _, c in ipairs(cases) do
    local f, what = peak.gpu(c[1], c[2])
    check(near(f, c[3] * 1e12) and what:find(c[1], 1, true), string.format("%s %s: %g TFLOP/s (%s)", c[1], c[2], c[3], tostring(what)))
  end
  local f, why = peak.gpu("NVIDIA L4", "bf16")
  check(f == nil and why:find("not in fsdp.peak's table", 1, true), "an unknown GPU: no peak, and why")
end

-- one rank's share; train.peak_tflops overrides
do
  local cpu = peak.cpu(xeon4)
  local p = peak.for_rank({ device = "cpu", dtype = "fp32", ranks = 2, cpu = cpu })
  check(near(p.flops, cpu.flops / 2) and p.what:find("shared by 2 ranks", 1, true), "a CPU rank: the machine's peak / its ranks: " .. p.what)
  -- bound by its launcher (mpirun's default): the CPUs counted are its own, not divided
  p = peak.for_rank({ device = "cpu", dtype = "fp32", ranks = 2, bound = true, cpu = cpu })
  check(near(p.flops, cpu.flops) and p.what:find("per rank, the cores its launcher bound it to", 1, true),
    "a CPU rank bound to its own cores: their peak, whole: " .. p.what)
  p = peak.for_rank({ device = "cpu", dtype = "bf16", ranks = 1, override = 0.5, cpu = cpu })
  check(near(p.flops, 0.5e12) and p.what:find("train.peak_tflops = 0.5", 1, true), "train.peak_tflops replaces the CPU's")
  p = peak.for_rank({ device = "cuda", dtype = "bf16", ranks = 1, override = 400, gpu_name = "NVIDIA H100 80GB HBM3" })
  check(near(p.flops, 400e12), "train.peak_tflops replaces the table's")
  p = peak.for_rank({ device = "cuda", dtype = "bf16", ranks = 1, gpu_name = "NVIDIA H100 80GB HBM3" })
  check(near(p.flops, 989e12) and p.what:find("989.0 TFLOP/s per GPU", 1, true), "an H100 rank: " .. p.what)
  p = peak.for_rank({ device = "cuda", dtype = "bf16", ranks = 1, gpu_name = "Some GPU" })
  check(p.flops == nil and p.what:find("set train.peak_tflops", 1, true), "unknown: no MFU, and what to set: " .. p.what)
  p = peak.for_rank({ device = "cpu", dtype = "fp32", ranks = 1, cpu_why = "cannot read /proc/cpuinfo" })
  check(p.flops == nil and p.what:find("cannot read /proc/cpuinfo", 1, true), "no CPU peak: why")
end

-- this machine: a peak, or the reason there is none; and no GEMM faster than
-- the peak (the MFU passed 100% where cpuinfo's nominal clock was taken for
-- the boosted one: 116% on the development machine's Zen 4 in a VM). The
-- GEMM runs on every core this process may use, as the peak counts them.
do
  local p, why = peak.this_cpu()
  check((p and p.flops > 0 and p.cores >= 1) or (not p and #why > 0), "this machine: " .. (p and p.what or why))
  local hz = fsdp.C.fsdp_core_clock_hz()
  check(hz == 0 or (hz > 2e8 and hz < 7e9), string.format("the measured core clock is a clock: %.0f MHz", hz / 1e6))
  -- two chains must agree: an Intel core of family 6 model 207 (2.1 GHz)
  -- folded a chain of immediate adds into 5.3-15.9 GHz (issue 38)
  local pick = fsdp.C.fsdp_core_clock_pick
  check(pick(4.10e9, 4.12e9) == 4.12e9, "two chains within 10%: the faster")
  check(pick(15.96e9, 2.1e9) == 0 and pick(5.32e9, 2.1e9) == 0, "a chain folded by the renamer: no clock")
  check(pick(8.2e9, 8.3e9) == 0, "both chains above 7 GHz: no clock")
  check(pick(0, 3e9) == 0 and pick(3e9, 0) == 0, "a chain that did not run: no clock")
  -- the timed multiply-adds against what the flags allow: a rate above it
  -- is a wrong timing (16 chains that the compiler merged into one read 128
  -- FLOP a cycle on a 64-FLOP core); the 10% is the clock's own tolerance
  for _, bits in ipairs({ 512, 256 }) do
    local f = fsdp.C.fsdp_core_fma_flops(bits)
    if f > 0 and hz > 0 then
      local most = bits / 32 * 2 * 2
      check(f / hz <= most * 1.1 and f / hz >= most / 4, string.format("%d-bit multiply-adds: %.1f FLOP a cycle, at most %d",
        bits, f / hz, most))
    end
  end
  if p then
    local gemm = peak.gemm_rate(fsdp, "cpu", "fp32")
    check(gemm <= p.flops * 1.02, string.format("a 1024-cube GEMM at %.1f GFLOP/s is within the peak of %.1f (%s)",
      gemm / 1e9, p.flops / 1e9, p.what))
  end
end

T.finish()
