-- fsdp.json: JSON text from Lua values, for the files fsdp writes
-- (checkpoint indexes, Hugging Face config.json and safetensors indexes).
-- Objects get their keys sorted, so the same table always gives the same
-- bytes (the checkpoint index is checksummed). Arrays are tables with
-- consecutive integer keys from 1; json.array{} marks an empty array;
-- json.null writes null.
-- Integers print exactly up to 2^53; other numbers with 17 digits;
-- json.float(x) prints x as a float however it reads (8 -> 8.0, 1e-5 ->
-- 1e-05, the shortest text that reads back as x), for readers that check
-- a field's type (Hugging Face's config.json).
-- json.decode(text) reads JSON into Lua values (null becomes nil).
local M = {}

local array_mark = setmetatable({}, { __mode = "k" })
function M.array(t) array_mark[t] = true; return t end

-- json.null: a value that writes as null where a reader wants the key
-- present (a tokenizer.json's optional parts)
M.null = setmetatable({}, { __tostring = function() return "json.null" end })

local float_mt = {}
function M.float(x)
  if type(x) ~= "number" then error("json.float: " .. tostring(x) .. " is not a number", 2) end
  return setmetatable({ x }, float_mt)
end

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function str(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or string.format("\\u%04x", c:byte()) end) .. '"'
end

local function num(v)
  if v ~= v or v == math.huge or v == -math.huge then error("json: cannot encode " .. tostring(v), 3) end
  if v % 1 == 0 and math.abs(v) <= 2 ^ 53 then return string.format("%.0f", v) end
  return string.format("%.17g", v)
end

local function float_text(v)
  if v ~= v or v == math.huge or v == -math.huge then error("json: cannot encode " .. tostring(v), 4) end
  local t
  for digits = 15, 17 do
    t = string.format("%." .. digits .. "g", v)
    if tonumber(t) == v then break end
  end
  if not t:find("[.e]") then t = t .. ".0" end
  return t
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
  elseif ty == "nil" or v == M.null then out[#out + 1] = "null"
  elseif ty == "table" and getmetatable(v) == float_mt then out[#out + 1] = float_text(v[1])
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

-- ---- decode: a recursive descent over the text; errors give the byte offset ----

local unescapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xc0 + math.floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then return string.char(0xe0 + math.floor(cp / 4096), 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64) end
  return string.char(0xf0 + math.floor(cp / 262144), 0x80 + math.floor(cp / 4096) % 64, 0x80 + math.floor(cp / 64) % 64, 0x80 + cp % 64)
end

local value

local function bad(text, i, what) error(string.format("JSON: %s at byte %d", what, i), 0) end
local function skip(text, i) return text:find("[^ \t\r\n]", i) or #text + 1 end

local function string_at(text, i) -- text[i] is the opening quote
  local out, j = {}, i + 1
  while true do
    local k = text:find('["\\%c]', j)
    if not k then bad(text, i, "unterminated string") end
    out[#out + 1] = text:sub(j, k - 1)
    local c = text:sub(k, k)
    if c == '"' then return table.concat(out), k + 1 end
    if c ~= "\\" then bad(text, k, "control character in a string") end
    local e = text:sub(k + 1, k + 1)
    if e == "u" then
      local hex = text:match("^%x%x%x%x", k + 2)
      if not hex then bad(text, k, "bad \\u escape") end
      local cp = tonumber(hex, 16)
      j = k + 6
      if cp >= 0xd800 and cp < 0xdc00 then -- a surrogate pair
        local lo = text:match("^\\u(%x%x%x%x)", j)
        lo = lo and tonumber(lo, 16)
        if not lo or lo < 0xdc00 or lo >= 0xe000 then bad(text, k, "lone surrogate") end
        cp, j = 0x10000 + (cp - 0xd800) * 1024 + (lo - 0xdc00), j + 6
      end
      out[#out + 1] = utf8(cp)
    elseif unescapes[e] then
      out[#out + 1], j = unescapes[e], k + 2
    else
      bad(text, k, "bad escape")
    end
  end
end

value = function(text, i, depth)
  if depth > 200 then bad(text, i, "nesting deeper than 200") end
  i = skip(text, i)
  local c = text:sub(i, i)
  if c == "{" then
    local t = {}
    i = skip(text, i + 1)
    if text:sub(i, i) == "}" then return t, i + 1 end
    while true do
      if text:sub(i, i) ~= '"' then bad(text, i, "expected a string key") end
      local k, v
      k, i = string_at(text, i)
      i = skip(text, i)
      if text:sub(i, i) ~= ":" then bad(text, i, "expected ':'") end
      v, i = value(text, i + 1, depth + 1)
      t[k] = v
      i = skip(text, i)
      c = text:sub(i, i)
      if c == "}" then return t, i + 1 end
      if c ~= "," then bad(text, i, "expected ',' or '}'") end
      i = skip(text, i + 1)
    end
  elseif c == "[" then
    local t, n = M.array({}), 0
    i = skip(text, i + 1)
    if text:sub(i, i) == "]" then return t, i + 1 end
    while true do
      n = n + 1
      t[n], i = value(text, i, depth + 1)
      i = skip(text, i)
      c = text:sub(i, i)
      if c == "]" then return t, i + 1 end
      if c ~= "," then bad(text, i, "expected ',' or ']'") end
      i = i + 1
    end
  elseif c == '"' then
    return string_at(text, i)
  end
  local _, e = text:find("^-?%d+", i)
  if e then -- -?digits[.digits][e[+-]digits], no leading zero
    if text:find("^-?0%d", i) then bad(text, i, "leading zero in a number") end
    e = select(2, text:find("^%.%d+", e + 1)) or e
    e = select(2, text:find("^[eE][-+]?%d+", e + 1)) or e
    return tonumber(text:sub(i, e)), e + 1
  end
  if text:sub(i, i + 3) == "true" then return true, i + 4 end
  if text:sub(i, i + 4) == "false" then return false, i + 5 end
  if text:sub(i, i + 3) == "null" then return nil, i + 4 end
  bad(text, i, #text < i and "unexpected end" or "unexpected '" .. c .. "'")
end

function M.decode(text)
  local v, i = value(text, 1, 0)
  if skip(text, i) <= #text then bad(text, skip(text, i), "text after the value") end
  return v
end

return M
