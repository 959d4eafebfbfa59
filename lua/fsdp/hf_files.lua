-- fsdp.hf_files: the small files that make a Hugging Face model folder
-- usable beyond its weights: the tokenizer's files and
-- generation_config.json. The trainer carries them from the folder the
-- model came from (model.from_hf, checkpoint.init_hf, or the tokenizer a
-- token file was prepared with) through every checkpoint (step-N/hf/) to
-- checkpoint.export_hf, so that transformers' AutoTokenizer and generate
-- work on an export; a byte-level model (vocab 256, data.corpus) gets a
-- byte-level tokenizer.json whose ids are the bytes. fsdp generate reads
-- the same files for its tokenizer and end-of-text token.
local base = require "fsdp.ffi"
local json = require "fsdp.json"
local ckpt_dir = require "fsdp.ckpt_dir"
local ffi, C = base.ffi, base.C

local M = {}

-- what is carried (tokenizer.model: SentencePiece's model, Llama 2's;
-- chat_template.jinja: where transformers 5 saves a chat template)
M.names = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
  "tokenizer.model", "chat_template.jinja" }

local read = ckpt_dir.read_text

-- {name = bytes} of the carried files in dir (none: an empty table)
function M.read(dir)
  local out = {}
  for _, n in ipairs(M.names) do out[n] = read(dir:gsub("/+$", "") .. "/" .. n) end
  return out
end

-- writes files ({name = bytes}) into dir, each atomically; errors name the file
function M.write(dir, files)
  for _, n in ipairs(M.names) do
    local t = files[n]
    if t and C.fsdp_fs_write_atomic(dir .. "/" .. n, t, #t) < 0 then
      error(dir .. "/" .. n .. ": " .. ffi.string(C.fsdp_last_error()), 0)
    end
  end
end

-- GPT-2's map of the 256 bytes to printable characters (what the ByteLevel
-- pre-tokenizer and decoder of `tokenizers` use), as UTF-8 strings
local function byte_chars()
  local keep, chars, n = {}, {}, 0
  for b = 33, 126 do keep[b] = true end
  for b = 161, 172 do keep[b] = true end
  for b = 174, 255 do keep[b] = true end
  for b = 0, 255 do
    local cp = b
    if not keep[b] then cp, n = 256 + n, n + 1 end
    if cp < 128 then
      chars[b] = string.char(cp)
    else -- two UTF-8 bytes cover code points below 2048
      chars[b] = string.char(192 + math.floor(cp / 64), 128 + cp % 64)
    end
  end
  return chars
end

-- tokenizer.json of a byte-level model: token id = byte value (a BPE of no
-- merges over ByteLevel's 256 characters), so the ids the engine trained on
-- (data.corpus: the file's bytes) are the ids transformers' tokenizer gives
function M.byte_tokenizer()
  local chars, vocab = byte_chars(), {}
  for b = 0, 255 do vocab[chars[b]] = b end
  local bl = { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false }
  return json.encode({ version = "1.0", truncation = json.null, padding = json.null, added_tokens = json.array({}),
    normalizer = json.null, pre_tokenizer = bl, post_processor = json.null, decoder = bl,
    model = { type = "BPE", dropout = json.null, unk_token = json.null, continuing_subword_prefix = json.null,
      end_of_word_suffix = json.null, fuse_unk = false, byte_fallback = false, ignore_merges = false, vocab = vocab,
      merges = json.array({}) } })
end

-- the files of a byte-level model (no end-of-text token: its 256 ids are bytes)
function M.byte_files(max_len)
  local cfg = json.encode({ tokenizer_class = "PreTrainedTokenizerFast", model_max_length = max_len,
    clean_up_tokenization_spaces = false })
  return { ["tokenizer.json"] = M.byte_tokenizer(), ["tokenizer_config.json"] = cfg,
    ["generation_config.json"] = json.encode({ do_sample = false }) }
end

-- What a run carries into its checkpoints and export, and where it came
-- from (a sentence for the log): the files of the folder the model came
-- from (from_hf: model.from_hf or checkpoint.init_hf), else of the
-- checkpoint it resumed (resumed: that checkpoint's path), else of the
-- tokenizer folder its token file was prepared with (tokenizer_dir), else
-- byte-level files for a model of 256 ids trained on bytes (o.bytes); nil
-- when none applies.
function M.carried(o)
  local function any(f) return next(f) ~= nil end
  if o.from_hf then
    local f = M.read(o.from_hf)
    if any(f) then return f, o.from_hf end
  end
  if o.resumed then
    local f = M.read(o.resumed .. "/hf")
    if any(f) then return f, o.resumed .. "/hf" end
  end
  if o.tokenizer_dir then
    local f = M.read(o.tokenizer_dir)
    if any(f) then return f, o.tokenizer_dir end
  end
  if o.bytes ~= false and o.vocab_size == 256 then return M.byte_files(o.max_len), "byte-level (ids are bytes)" end
  return nil
end

-- the end-of-text ids of a folder's files and config (a list, maybe empty):
-- generation_config.json's eos_token_id, else config.json's
function M.eos_ids(files, config_raw)
  local v
  local g = files and files["generation_config.json"]
  if g then
    local ok, t = pcall(json.decode, g)
    if ok and type(t) == "table" then v = t.eos_token_id end
  end
  if v == nil and config_raw then v = config_raw.eos_token_id end
  if type(v) == "number" then return { v } end
  local out = {}
  if type(v) == "table" then for _, x in ipairs(v) do if type(x) == "number" then out[#out + 1] = x end end end
  return out
end

return M
