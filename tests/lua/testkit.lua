-- testkit.lua: the Lua tests' assertion kit, the twin of tests/c/check.h.
--   local T = dofile(dir .. "testkit.lua")(label)
--   T.check(ok, what); T.fails(fn, needle, what); T.finish()  -- prints "N passed, M failed", exits
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
  -- fn() must raise an error whose message contains needle (plain text)
  function T.fails(fn, needle, what)
    local ok, err = pcall(fn)
    T.check(not ok and tostring(err):find(needle, 1, true) ~= nil, what .. ": " .. tostring(err))
  end
  function T.finish()
    print(string.format("%s: %d passed, %d failed", label, T.passed, T.failed))
    os.exit(T.failed == 0 and 0 or 1)
  end
  return T
end
