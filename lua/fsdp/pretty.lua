-- fsdp.pretty: values for a person to read. show/render print values at the
-- prompt (tables as nested fields, sorted keys, cycles marked), one line per
-- value; count, bytes and gib are the one way numbers are written for
-- people (the planner's tables, the trainer's lines, the REPL).
local M = {}

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") end

local function render(v, depth, seen)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth > 3 then return "{...}" end
  seen[v] = true
  local parts, n = {}, #v
  for i = 1, n do parts[#parts + 1] = render(v[i], depth + 1, seen) end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local key = is_ident(k) and k or ("[" .. render(k, depth + 1, seen) .. "]")
    parts[#parts + 1] = key .. " = " .. render(v[k], depth + 1, seen)
  end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

function M.render(v) return render(v, 0, {}) end

-- a count for a person: 70.55G, 56.21M, 184.6k, 7. SI letters, not "B"
-- for billions: the same text serves parameters, tokens, bytes and FLOP/s;
-- two decimals above a million, so that near sizes still differ
function M.count(n)
  if n >= 1e9 then return string.format("%.2fG", n / 1e9) end
  if n >= 1e6 then return string.format("%.2fM", n / 1e6) end
  if n >= 1e3 then return string.format("%.1fk", n / 1e3) end
  return string.format("%.0f", n)
end

-- bytes for a person, in binary units: 2.05 GiB, 62.63 MiB, 1.3 KiB, 0 B
function M.bytes(b)
  if b >= 2 ^ 30 then return string.format("%.2f GiB", b / 2 ^ 30) end
  if b >= 2 ^ 20 then return string.format("%.2f MiB", b / 2 ^ 20) end
  if b >= 2 ^ 10 then return string.format("%.1f KiB", b / 2 ^ 10) end
  return string.format("%d B", b)
end

-- bytes as a number of GiB, for a message's own %.2f
function M.gib(b) return b / 2 ^ 30 end

function M.show(...)
  local out = {}
  for i = 1, select("#", ...) do out[#out + 1] = render(select(i, ...), 0, {}) end
  print(table.concat(out, "\t"))
end

return M
