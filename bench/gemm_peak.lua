-- gemm_peak.lua: the CPU GEMMs the trainer runs, against the cores' fp32 peak.
--   fsdp bench/gemm_peak.lua                      (the rank's cores: all of them alone)
--   FSDP_BLAS_THREADS=1 fsdp bench/gemm_peak.lua  (one core)
-- Runs through the engine's own GEMM (fsdp_linear_forward, on the threads the
-- engine gives it), on the OpenBLAS kernels the rank host chose
-- (src/ops/blas_core.c). Each shape: the best rate of runs over 0.3 s, and
-- that rate as a share of threads x clock x fp32 FLOP per cycle (fsdp.peak:
-- the clock measured by two timed chains, the FLOP per cycle by the widest
-- vector unit /proc/cpuinfo names). Shapes: squares, and the demo's
-- (recipes/tiny.lua: 1024 tokens, hidden 128, SwiGLU 352) and a 45M model's
-- (2048 tokens, hidden 512, SwiGLU 1408) linear layers.
local fsdp = require "fsdp"
local peak = require "fsdp.peak"
local ops = require "fsdp.ops"
local C = fsdp.C

local p, why = peak.this_cpu()
if not p then error("gemm_peak: no CPU peak here: " .. why, 0) end
local threads = tonumber(os.getenv("FSDP_BLAS_THREADS") or "") or C.fsdp_rank_cores(nil)
local per_core = p.flops / p.cores
print(string.format("gemm_peak: %s", fsdp.ffi.string(C.fsdp_blas_core_note())))
print(string.format("gemm_peak: peak %.1f GFLOP/s a core: %s", per_core / 1e9, p.what))
print(string.format("gemm_peak: %d thread%s", threads, threads == 1 and "" or "s"))
print(string.format("%-34s %10s %10s", "tokens x in -> out", "GFLOP/s", "of peak"))

local shapes = {
  { 512, 512, 512, "square 512" }, { 1024, 1024, 1024, "square 1024" }, { 2048, 2048, 2048, "square 2048" },
  { 1024, 128, 352, "demo: gate/up" }, { 1024, 352, 128, "demo: down" }, { 1024, 128, 128, "demo: q/o" },
  { 2048, 512, 1408, "45M: gate/up" }, { 2048, 1408, 512, "45M: down" }, { 2048, 512, 512, "45M: q/o" },
}
local worst = math.huge
for _, s in ipairs(shapes) do
  local n, inp, out = s[1], s[2], s[3]
  local x, w, y = fsdp.tensor({ n, inp }), fsdp.tensor({ out, inp }), fsdp.tensor({ n, out })
  x:fill(0.01)
  w:fill(0.02)
  local best, t_end, runs = 0, C.fsdp_time_now() + 0.3, 0
  while runs < 3 or C.fsdp_time_now() < t_end do
    runs = runs + 1
    local t0 = C.fsdp_time_now()
    ops.linear_forward(y, x, w.data, nil, n, inp, out)
    local dt = C.fsdp_time_now() - t0
    if dt > 0 then best = math.max(best, 2 * n * inp * out / dt) end
  end
  local share = best / (per_core * threads)
  worst = math.min(worst, share)
  print(string.format("%-34s %10.1f %9.1f%%", string.format("%s (%d x %d -> %d)", s[4], n, inp, out), best / 1e9, 100 * share))
  x:free(); w:free(); y:free()
end
print(string.format("gemm_peak: the lowest share %.1f%% of the peak", 100 * worst))
