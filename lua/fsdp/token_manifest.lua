-- fsdp.token_manifest: the manifest.json that `fsdp prepare`
-- (scripts/prepare_data.py) writes beside its token files, held against
-- the run before anything trains. A file the tool wrote and a model it does
-- not fit is a mistake the ids alone cannot show: another tokenizer's ids
-- below model.vocab_size train without an error, on text the model reads
-- as noise.
--
-- token_manifest.check(r, vocab_size): for data.token_file and
-- data.val_token_file, when a manifest of the tool lies beside the file and
-- lists it, refuses (an error starting "data.", which the trainer reports
-- as the recipe's, exit status 78):
--   * a file whose size is not the one the manifest records (not the file
--     it describes);
--   * a data.format that does not read the file as written (llm.c's header:
--     auto; headerless: raw_u16 or raw_u32 by the ids' width);
--   * a tokenizer with more ids than model.vocab_size;
--   * a model whose weights come from a Hugging Face folder
--     (checkpoint.init_hf, else model.from_hf unless init_hf = false) whose
--     tokenizer.json's sha256 is not the manifest's (a folder without
--     tokenizer.json is not compared).
-- A manifest.json of another tool (no "format": "fsdp-token-manifest") is
-- left alone.
local base = require "fsdp.ffi"
local json = require "fsdp.json"
local ffi, C = base.ffi, base.C

local M = {}

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end
local function basename(p) return p:match("([^/]*)$") end

-- sha256 of a file as 64 hex digits (src/io/sha256.c), or nil and why
function M.sha256_file(path)
  local hex = ffi.new("char[65]")
  if C.fsdp_sha256_file(path, hex) < 0 then return nil, ffi.string(C.fsdp_last_error()) end
  return ffi.string(hex)
end

-- The tool's manifest beside a token file and its path; nil when there is none.
function M.read(token_path, field)
  local mpath = dirname(token_path) .. "/manifest.json"
  local f = io.open(mpath, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local ok, m = pcall(json.decode, text)
  if not ok or type(m) ~= "table" then
    error(string.format("%s = '%s': %s beside it does not read as JSON (%s)", field, token_path, mpath,
      tostring(m):gsub("^[^:\n]+:%d+: ", "")), 0)
  end
  if m.format ~= "fsdp-token-manifest" then return nil end
  return m, mpath
end

local function size_of(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

-- The tokenizer data.token_file was prepared with, by its manifest: its
-- folder, or "bytes"; nil without a manifest (the trainer carries the
-- folder's files into checkpoints and the export: fsdp.hf_files)
function M.tokenizer_of(r)
  local path = r.data.token_file
  local ok, m = pcall(M.read, path or "", "data.token_file")
  if not path or not ok or not m or type(m.tokenizer) ~= "table" then return nil end
  if m.tokenizer.kind == "bytes" then return "bytes" end
  if m.tokenizer.kind == "hf" and type(m.tokenizer.path) == "string" then return m.tokenizer.path end
end

-- the Hugging Face folder the model's weights come from, and its recipe field
local function weights_folder(r)
  local init = r.checkpoint and r.checkpoint.init_hf
  if type(init) == "string" then return init, "checkpoint.init_hf" end
  if init ~= false and type(r.model.from_hf) == "string" then return r.model.from_hf, "model.from_hf" end
end

function M.check(r, vocab_size)
  local d = r.data
  for _, field in ipairs({ "data.token_file", "data.val_token_file" }) do
    local path = d[field:sub(6)]
    local m, mpath
    if path then m, mpath = M.read(path, field) end
    local split
    for _, s in pairs(m and type(m.splits) == "table" and m.splits or {}) do
      if type(s) == "table" and s.file == basename(path) then split = s end
    end
    if split then
      local function refuse(fmt, ...)
        error(string.format("%s = '%s': " .. fmt, field, path, ...), 0)
      end
      local size = size_of(path)
      if size and size ~= split.bytes then
        refuse("%d bytes, and %s records %s bytes for %s: it is not the file that manifest describes (prepare the " ..
          "data again, or remove the manifest)", size, mpath, tostring(split.bytes), split.file)
      end
      local want = m.file_format == "llmc" and "auto" or (m.dtype == "uint32" and "raw_u32" or "raw_u16")
      if d.format ~= want then
        refuse("data.format = '%s', and %s says the file is %s: data.format = '%s' reads it", d.format, mpath,
          m.file_format == "llmc" and "in llm.c's format (a 1024-byte header)" or "headerless " .. tostring(m.dtype), want)
      end
      local tk = type(m.tokenizer) == "table" and m.tokenizer or {}
      if type(m.vocab_size) == "number" and m.vocab_size > vocab_size then
        refuse("%s records a tokenizer of %d ids (%s), and model.vocab_size = %d: its ids would not fit. Train the " ..
          "model that tokenizer belongs to, or prepare the data with this model's tokenizer", mpath, m.vocab_size,
          tostring(tk.path), vocab_size)
      end
      local dir, from = weights_folder(r)
      local tj = dir and dir .. "/tokenizer.json"
      if tj and size_of(tj) then
        local sha, why = M.sha256_file(tj)
        if not sha then refuse("%s", why) end
        if sha ~= tk.sha256 then
          refuse("%s records the tokenizer %s (sha256 %s), and %s = '%s' has a tokenizer.json of sha256 %s: the data " ..
            "was tokenized for another model. Prepare it with `fsdp prepare --tokenizer %s ...`", mpath,
            tostring(tk.path), tostring(tk.sha256), from, dir, sha, dir)
        end
      end
    end
  end
end

return M
