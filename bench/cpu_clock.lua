-- cpu_clock.lua: the MFU's CPU clock and FLOPs per cycle on this host, each
-- read several times, and the check that ties them (issue 38):
--   fsdp bench/cpu_clock.lua [READINGS]
-- The clock is two timed chains of dependent instructions (register adds,
-- 64-bit multiplies; src/base/core_clock.c) that must agree within 10%. Its
-- check needs no counter the host may lack: twelve independent chains of
-- fused multiply-adds run the core's units at full rate, which is a power of
-- two FLOPs per cycle on every x86-64 core (units x lanes x 2), so their
-- timed rate over the clock lands near a power of two only where the clock
-- is right: a clock 10% off puts it 10% off (unless off by a factor of 2,
-- which the two chains already rule out). The "off" column is that distance.
local fsdp = require "fsdp"
local peak = require "fsdp.peak"
local C = fsdp.C
local n = tonumber(arg[1] or "") or 7

local cpus = peak.parse_cpuinfo(require("fsdp.checkpoint").read_text("/proc/cpuinfo") or "")
local c = cpus[1] or {}
print(string.format("cpu_clock: %s (%s, family %s model %s); the kernel says %s MHz", c.name or "?", c.vendor or "?",
  tostring(c.family), tostring(c.model), tostring(c.mhz)))
print(string.format("%-8s %10s %12s %10s %12s %10s %8s", "reading", "clock MHz", "512-bit GF/s", "FLOP/cyc", "256-bit GF/s",
  "FLOP/cyc", "off"))
local worst, checked = 0, 0
for i = 1, n do
  local hz = C.fsdp_core_clock_hz()
  local f512, f256 = C.fsdp_core_fma_flops(512), C.fsdp_core_fma_flops(256)
  local function per(f) return hz > 0 and f > 0 and f / hz or nil end
  local widest = per(f512) or per(f256)
  local off
  if widest then
    local p2 = 2 ^ math.floor(math.log(widest) / math.log(2) + 0.5)
    off = widest / p2 - 1
    worst, checked = math.max(worst, math.abs(off)), checked + 1
  end
  print(string.format("%-8d %10s %12s %10s %12s %10s %8s", i, hz > 0 and string.format("%.0f", hz / 1e6) or "none",
    f512 > 0 and string.format("%.1f", f512 / 1e9) or "-", per(f512) and string.format("%.1f", per(f512)) or "-",
    f256 > 0 and string.format("%.1f", f256 / 1e9) or "-", per(f256) and string.format("%.1f", per(f256)) or "-",
    off and string.format("%+.1f%%", 100 * off) or "-"))
end
local p, why = peak.this_cpu()
print("cpu_clock: the MFU's peak: " .. (p and p.what or why))
if checked == 0 then
  print("cpu_clock: no multiply-adds and clock to hold against each other here (no FMA, or the clock chains "
    .. "disagreed): the clock is not checked")
else
  print(string.format("cpu_clock: the widest multiply-adds' FLOP per cycle, at worst %.1f%% from a power of two%s",
    100 * worst, worst <= 0.1 and " (the clock holds within that)" or ": the clock is off, the timing was disturbed, "
      .. "or the vector units run at a lower clock than the integer ones (AVX-512 on Xeons before Ice Lake)"))
end
