-- testkit.lua: the Lua tests' assertion kit, the twin of tests/c/check.h.
--   local T = dofile(dir .. "testkit.lua")(label)
--   T.check(ok, what); T.fails(fn, needle, what); T.finish()  -- prints "N passed, M failed", exits
--   T.workdir(name) -> a fresh /tmp directory; T.launch(fsdprun, n, args, env) -> ok, output
--   T.params(s) -> a sharded model's parameters; T.same_params(a, b) -> ok, where not
--   T.losses(path) -> {step = loss as written} of a metrics file
--   T.read(path) -> the file's bytes; T.write(path, bytes[, mode]) (mode "wb" unless given: "ab" appends)
--   T.joined(list, ...) -> a new list: the lists' items in order (a run's common arguments and its own)
--   T.measured(fsdp, device, fn) -> the allocator's peak during fn(), its start, what stays (collector stopped)
--   T.unit_bytes_diff(fsdp, s, p) -> where a sharded model's units hold other bytes than plan p says
--   T.lcg(seed) -> rnd(n): integers in [0, n) from a small LCG, the same on every rank and machine
--   T.int32(fsdp, list, shape) -> an int32 CPU tensor of the list's values
--   T.append_row(ids, tg, ds, row, r, k, seq, packed) -> the targets counted: a row's ids, next-token targets and
--     doc_start appended to the lists; packed: documents of 1 to 6 tokens (placed by row r and step k), no target
--     across a document's end
--   T.engine_grpo(fsdp, E, b, opt) -> {lp, en, steps}: fsdp.engine E's log-probs and entropies of batch b,
--     then 3 GRPO steps (clip 0.2, KL 0.04 against those log-probs, fixed advantages) and their {loss, norm}
--   T.engine_compare(got, want, n, label) -> two such runs held to each other (1e-5 absolute, relative)
--   T.generation(fsdp, s, cfg) -> a sharded model's 10 greedy tokens after a fixed prompt, with the KV caches
--     and without, and the prompt's last logits; T.generation_compare(got, want, V, label) holds two to each other
--   T.generate_then_grpo(fsdp, s, cfg, b, opt) -> T.engine_grpo's record with .gen, T.generation's (first: the
--     weights as built), the model freed
return function(label)
  local T = { passed = 0, failed = 0 }
  function T.check(ok, what)
    if ok then
      T.passed = T.passed + 1
    else
      T.failed = T.failed + 1
      io.stderr:write(label, ": FAILED: ", tostring(what), "\n")
    end
  end
  function T.read(path)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    return text
  end
  function T.write(path, bytes, mode)
    local f = assert(io.open(path, mode or "wb"))
    assert(f:write(bytes))
    f:close()
  end
  function T.joined(...)
    local out = {}
    for i = 1, select("#", ...) do
      for _, v in ipairs((select(i, ...))) do out[#out + 1] = v end
    end
    return out
  end
  -- fn() must raise an error whose message contains needle (plain text)
  function T.fails(fn, needle, what)
    local ok, err = pcall(fn)
    T.check(not ok and tostring(err):find(needle, 1, true) ~= nil, what .. ": " .. tostring(err))
  end
  -- a fresh scratch directory for this process: /tmp/fsdp-test-NAME-PID
  function T.workdir(name)
    local ffi = require "ffi"
    pcall(ffi.cdef, "int getpid(void);")
    local dir = string.format("/tmp/fsdp-test-%s-%d", name, ffi.C.getpid())
    assert(os.execute(string.format("rm -rf '%s' && mkdir -p '%s'", dir, dir)) == 0, "cannot create " .. dir)
    return dir
  end
  -- `[env] fsdprun -n n --timeout 120 args...` (a list): ok (exit 0), its output (stdout and stderr)
  function T.launch(fsdprun, n, args, env)
    local p = io.popen(string.format("%s%s -n %d --timeout 120 %s 2>&1; echo \"EXIT=$?\"", env and (env .. " ") or "",
      fsdprun, n, table.concat(args, " ")))
    local out = p:read("*a")
    p:close()
    return tonumber(out:match("EXIT=(%d+)%s*$")) == 0, out
  end
  -- every parameter of a sharded model s, gathered: {name = {values}}
  function T.params(s)
    local out = {}
    for _, u in ipairs(s.units) do for _, p in ipairs(u.params) do out[p.name] = s:gather(p.name) end end
    return out
  end
  -- a's parameters all in b with equal values: true, or false and where not
  function T.same_params(a, b)
    for name, va in pairs(a) do
      local vb = b[name]
      if not vb or #vb ~= #va then return false, name .. " missing" end
      for i = 1, #va do if va[i] ~= vb[i] then return false, name .. " differs at " .. i end end
    end
    return true
  end
  -- per-step losses of a metrics file, as written (17 digits: the double itself)
  function T.losses(path)
    local t, f = {}, io.open(path, "rb")
    local text = f and f:read("*a") or ""
    if f then f:close() end
    for step, loss in text:gmatch('"step":(%d+),[^\n]-"loss":([^,}]+)') do t[tonumber(step)] = loss end
    return t
  end
  function T.finish()
    print(string.format("%s: %d passed, %d failed", label, T.passed, T.failed))
    os.exit(T.failed == 0 and 0 or 1)
  end
  -- fn() with the garbage collector stopped: the allocator's peak during
  -- it above its start, that start, and what stays allocated above it (activations are freed at their
  -- last use, not when Lua collects them)
  function T.lcg(seed)
    local st = seed
    return function(n)
      st = (st * 1103515245 + 12345) % 2147483648
      return st % n
    end
  end
  function T.int32(fsdp, list, shape)
    local t = fsdp.tensor(shape, "int32")
    for i, v in ipairs(list) do t:set(i - 1, v) end
    return t
  end
  function T.measured(fsdp, device, fn)
    collectgarbage()
    collectgarbage("stop")
    local base = fsdp.memory_stats(device).allocated
    fsdp.memory_reset_peak(device)
    fn()
    local st = fsdp.memory_stats(device)
    collectgarbage("restart")
    return st.peak - base, base, st.allocated - base
  end
  -- each unit's resident bytes as fsdp_unit_memory_info reports them
  -- against the plan's rows: a list of "unit.field planned X, allocated Y"
  local unit_fields = { "params_full", "params_shard", "main_params", "optimizer", "grads_full", "grads_main", "scratch",
    "offloaded" }
  function T.unit_bytes_diff(fsdp, s, p)
    local m, bad = fsdp.ffi.new("fsdp_unit_memory"), {}
    for i, u in ipairs(s.units) do
      fsdp.C.fsdp_unit_memory_info(u.handle, m)
      for _, f in ipairs(unit_fields) do
        if tonumber(m[f]) ~= p.units[i].mem[f] then
          bad[#bad + 1] = string.format("%s.%s planned %d, allocated %d", u.name, f, p.units[i].mem[f], tonumber(m[f]))
        end
      end
    end
    return bad
  end
  function T.append_row(ids, tg, ds, row, r, k, seq, packed)
    local start, count = 0, 0
    for t = 0, seq - 1 do
      if packed and t > 0 and (t + 3 * r + k) % 6 == 0 then start = t end
      local last = packed and (t == seq - 1 or (t + 1 + 3 * r + k) % 6 == 0)
      ids[#ids + 1], tg[#tg + 1], ds[#ds + 1] = row[t], last and -100 or row[t + 1], start
      if not last then count = count + 1 end
    end
    return count
  end
  function T.engine_grpo(fsdp, E, b, opt)
    local losses = require "fsdp.losses"
    local n = b.y:numel()
    local lp, en = E:logprobs(b, { entropy = true })
    local out = { lp = {}, en = {}, steps = {} }
    for i = 0, n - 1 do out.lp[i], out.en[i] = lp:get(i), en:get(i) end
    b.advantages, b.ref_logp = fsdp.tensor(n), lp
    for i = 0, n - 1 do b.advantages:set(i, ((i * 37) % 11 - 5) / 5) end
    for k = 1, 3 do
      b.old_logp = E:logprobs(b)
      local o = {}
      for key, v in pairs(opt) do o[key] = v end
      out.steps[k] = { E:step({ b }, losses.grpo({ clip = 0.2, kl = 0.04 }), o) }
    end
    return out
  end
  function T.generation(fsdp, s, cfg)
    local g = require("fsdp.generate").wrap(s, cfg, {})
    local prompt = { 5, 17, 3, 99, 42, 7, 64 }
    local o = { max_new_tokens = 10, greedy = true, stop_at_eos = false }
    local out = { cached = g:generate(prompt, o) }
    o.no_cache = true
    out.whole = g:generate(prompt, o)
    local pt = T.int32(fsdp, prompt, { 1, #prompt })
    local lg = s:infer(function(model, ctx) return model:forward_last(ctx, pt) end)
    if lg.device == "cuda" then require("fsdp.ops").compute_stream():synchronize() end -- (the kernels that wrote it)
    local host = lg.device == "cuda" and fsdp.tensor(lg.shape, lg.dtype):copy_from(lg) or lg
    out.logits = {}
    for i = 0, cfg.vocab_size - 1 do out.logits[i] = host:get(i) end
    if host ~= lg then host:free() end
    lg:free(); pt:free()
    return out
  end
  function T.generation_compare(got, want, V, what)
    local worst = 0
    for i = 0, V - 1 do worst = math.max(worst, math.abs(got.logits[i] - want.logits[i])) end
    T.check(worst <= 1e-5, string.format("%s: the prompt's last logits within 1e-5 of one rank's (worst %.2g)", what, worst))
    local a, c, d = table.concat(got.cached, " "), table.concat(got.whole, " "), table.concat(want.cached, " ")
    T.check(a == d and c == d, string.format("%s: 10 greedy tokens with KV caches (%s) and without (%s) equal one " ..
      "rank's (%s)", what, a, c, d))
    return string.format("generation: logits %.2g", worst)
  end
  function T.generate_then_grpo(fsdp, s, cfg, b, opt)
    local gen = T.generation(fsdp, s, cfg)
    local out = T.engine_grpo(fsdp, require("fsdp.engine").new(s, cfg), b, opt)
    out.gen = gen
    s:free()
    return out
  end
  -- (positions i % 7 == 3 are the ignored targets: 0 there)
  function T.engine_compare(got, want, n, what)
    local worst, zeros, wl, wn = 0, true, 0, 0
    local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end
    for i = 0, n - 1 do
      worst = math.max(worst, math.abs(got.lp[i] - want.lp[i]), math.abs(got.en[i] - want.en[i]))
      if i % 7 == 3 then zeros = zeros and got.lp[i] == 0 and got.en[i] == 0 end
    end
    for k = 1, 3 do
      wl = math.max(wl, rel(got.steps[k][1], want.steps[k][1]))
      wn = math.max(wn, rel(got.steps[k][2], want.steps[k][2]))
    end
    T.check(worst <= 1e-5 and zeros, string.format("%s: log-probs and entropies within 1e-5 of one rank's, 0 at the " ..
      "ignored targets (worst %.2g)", what, worst))
    T.check(wl <= 1e-5 and wn <= 1e-5, string.format("%s: 3 GRPO steps' losses and grad norms within 1e-5 relative of " ..
      "one rank's (worst %.2g and %.2g)", what, wl, wn))
    return string.format("%s: log-probs %.2g, GRPO losses %.2g, norms %.2g", what, worst, wl, wn)
  end
  return T
end
