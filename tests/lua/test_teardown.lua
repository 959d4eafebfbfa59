-- test_teardown.lua (fsdprun -n W, run many times by tests/scripts/test_teardown.sh):
-- a script that leaves everything to the collector: a mesh, a fully_shard
-- model of two units, one step, and the end of the script with nothing
-- freed by hand. Lua's collector then runs the finalizers of the mesh, the
-- units and the pools in no set order; each C object holds counted
-- references to what it uses, so whichever goes first, nothing is used
-- after it is freed (AddressSanitizer watches in the sanitizer build) and
-- the rank exits at once (a unit syncing a freed stream hung it before).
--   arg[1] = "error": fail with a Lua error after the step instead, as a
--   recipe with a mistake does: the rank must still exit, with status 1.
--   arg[1] = "mesh-first": free the mesh by hand before the model.
local fsdp = require "fsdp"
local nn = fsdp.nn
local info = fsdp.init()
local mesh = fsdp.mesh({ { "dp", info.size } })
local dp = mesh:group("dp")
local model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
local m = fsdp.fully_shard(model, { shard = dp, units = { "Linear" }, zero = 3 })
local x = fsdp.tensor({ 2, 8 }):fill(0.5)
local y = fsdp.tensor({ 2, 4 }):fill(0.25)
local loss = m:train_step({ { x = x, y = y } }, { lr = 1e-2 })
print(string.format("teardown rank %d: loss %.6f", info.rank, loss))
if arg[1] == "mesh-first" then mesh:free() end
if arg[1] == "error" then error("a mistake after the step, with the model alive") end
