-- fsdp.json: JSON text from Lua values, for the files fsdp writes
-- (checkpoint indexes, Hugging Face config.json and safetensors indexes).
-- Objects get their keys sorted, so the same table always gives the same
-- bytes (the checkpoint index is checksummed). Arrays are tables with
-- consecutive integer keys from 1; json.array{} marks an empty array.
-- Integers print exactly up to 2^53; other numbers with 17 digits.
local M = {}

local array_mark = setmetatable({}, { __mode = "k" })
function M.array(t) array_mark[t] = true; return t end

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function str(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function num(v)
  if v ~= v or v == math.huge or v == -math.huge then error("json: cannot encode " .. tostring(v), 3) end
  if v % 1 == 0 and math.abs(v) <= 2 ^ 53 then return string.format("%.0f", v) end
  return string.format("%.17g", v)
end

local function is_array(t)
  if array_mark[t] then return true end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n > 0 and n == #t
end

local function encode(v, out)
  local ty = type(v)
  if ty == "string" then out[#out + 1] = str(v)
  elseif ty == "number" then out[#out + 1] = num(v)
  elseif ty == "boolean" then out[#out + 1] = tostring(v)
  elseif ty == "nil" then out[#out + 1] = "null"
  elseif ty == "table" then
    if is_array(v) then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode(v[i], out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do
        if type(k) ~= "string" then error("json: object key " .. tostring(k) .. " is not a string", 3) end
        keys[#keys + 1] = k
      end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = str(k)
        out[#out + 1] = ":"
        encode(v[k], out)
      end
      out[#out + 1] = "}"
    end
  else
    error("json: cannot encode a " .. ty, 3)
  end
end

function M.encode(v)
  local out = {}
  encode(v, out)
  return table.concat(out)
end

return M
