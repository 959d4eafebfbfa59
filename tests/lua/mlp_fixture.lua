-- mlp_fixture.lua: the small MLP that test_fully_shard and test_offload
-- shard and train, its parameter names, and its deterministic batches.
--   local F = dofile(dir .. "mlp_fixture.lua")(fsdp)
--   F.mlp(); F.names; F.batch(g, k, t)  -- global micro-batch g, its k-th, step t
return function(fsdp)
  local nn = fsdp.nn
  local F = {}
  function F.mlp()
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
  end
  F.names = { "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias" }
  local ROWS = 4
  function F.batch(g, k, t)
    local x, y = fsdp.tensor({ ROWS, 8 }), fsdp.tensor({ ROWS, 4 })
    for i = 0, ROWS * 8 - 1 do x:set(i, math.sin(0.7 * g + 1.3 * k + 0.17 * t + 0.31 * i)) end
    for i = 0, ROWS * 4 - 1 do y:set(i, 0.5 * math.cos(0.5 * g + 0.9 * k + 0.23 * t + 0.41 * i)) end
    return { x = x, y = y }
  end
  return F
end
