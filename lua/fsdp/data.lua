-- fsdp.data: training data for the trainer.
--
-- data.corpus{root = DIR, include = {"README.md", "docs/*.md", ...}, val_fraction = 0.1}
--   The demo corpus: text files that ship with the project, read in sorted
--   path order, joined by a blank line, tokenised byte by byte (vocabulary
--   256: no tokenizer to download). The first (1 - val_fraction) of the
--   bytes are the training split, the rest the validation split.
--
-- ds:loader{split = "train" | "val", batch = B, seq = T, rank = r, world = W, seed = s, state = st}
--   loader:next() -> x, y: int32 tensors {B, T}; y is x shifted by one token.
--   A split is cut into windows of T + 1 tokens starting every T tokens.
--   Training: each epoch visits every window once, in an order shuffled by
--   (seed, epoch); the data-parallel group takes G = B * W windows per step,
--   rank r the ones at positions r, r + W, ... of those G. So the global
--   batch of a step does not depend on how the ranks split it, and
--   loader:state() ({consumed = windows taken by the whole group}) resumes
--   exactly where it stopped. Validation: windows in order, no shuffle.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local ffi, C, bit = base.ffi, base.C, require "bit"

local M = {}
local Dataset, Loader = {}, {}
Dataset.__index, Loader.__index = Dataset, Loader

-- A split reads from a source: read(offset, n, int32 dst)
local function array_source(toks)
  return { read = function(off, n, dst) ffi.copy(dst, toks + off, n * 4) end }
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- the files a glob names (the shell expands it), sorted
local function glob(root, pattern)
  local out = {}
  local p = io.popen("cd " .. shell_quote(root) .. " && for f in " .. pattern:gsub("[^%w%*%?%./_%-]", "") ..
    "; do [ -f \"$f\" ] && printf '%s\\n' \"$f\"; done 2>/dev/null")
  if p then
    for line in p:lines() do out[#out + 1] = line end
    p:close()
  end
  table.sort(out)
  return out
end

function M.corpus(o)
  o = o or {}
  local root = o.root or "."
  local include = o.include or { "README.md", "docs/*.md" }
  local seen, files = {}, {}
  for _, pat in ipairs(include) do
    for _, f in ipairs(glob(root, pat)) do
      if not seen[f] then seen[f] = true; files[#files + 1] = f end
    end
  end
  table.sort(files)
  local parts = {}
  for _, f in ipairs(files) do
    local h = io.open(root .. "/" .. f, "rb")
    if h then parts[#parts + 1] = h:read("*a"); h:close() end
  end
  local text = table.concat(parts, "\n\n")
  if #text < 64 then
    error(string.format("data.corpus: the files matching {%s} under %s hold %d bytes; too few to train on",
      table.concat(include, ", "), root, #text), 2)
  end
  local n = #text
  local toks = ffi.new("int32_t[?]", n)
  for i = 1, n do toks[i - 1] = text:byte(i) end
  local vf = o.val_fraction or 0.1
  local ntrain = n - math.floor(n * vf)
  local src = array_source(toks)
  return setmetatable({ tokens = toks, n = n, files = files, vocab_size = 256,
    splits = { train = { src, 0, ntrain }, val = { src, ntrain, n } } }, Dataset)
end

-- data.token_file{path = P, format = "auto" | "raw_u16" | "raw_u32", val_path = V, val_fraction = f,
--                 vocab_size = N}
--   Pre-tokenised token files (llm.c headers, nanoGPT's raw uint16; see
--   docs/TRAINING.md, "The data"), memory-mapped by the C reader (src/io/token_file.c):
--   nothing is read until a batch needs it, so a file of any size opens at
--   once. With vocab_size, every token of each file is checked once at open
--   (one vectorised pass over the mapping, memory speed): an id >=
--   vocab_size fails there, naming the file and the id's offset, not mid-run
--   in some batch. Without val_path the val split is the file's last
--   val_fraction.
local formats = { auto = C.FSDP_TOKENS_AUTO, raw_u16 = C.FSDP_TOKENS_RAW_U16, raw_u32 = C.FSDP_TOKENS_RAW_U32 }

local function open_tokens(path, format, what, vocab)
  local fmt = formats[format or "auto"]
  if not fmt then
    error(string.format("%s: format = '%s'; expected auto, raw_u16 or raw_u32", what, tostring(format)), 3)
  end
  local out = ffi.new("fsdp_token_file *[1]")
  if C.fsdp_token_file_open(path, fmt, out) < 0 then error(what .. ": " .. ffi.string(C.fsdp_last_error()), 3) end
  local f = ffi.gc(out[0], C.fsdp_token_file_close)
  if vocab and C.fsdp_token_file_check_ids(f, vocab) < 0 then error(what .. ": " .. ffi.string(C.fsdp_last_error()), 3) end
  return {
    file = f, count = tonumber(C.fsdp_token_file_count(f)),
    read = function(off, n, dst)
      if C.fsdp_token_file_read(f, off, n, dst) < 0 then error(what .. ": " .. ffi.string(C.fsdp_last_error()), 0) end
    end,
  }
end

function M.token_file(o)
  if type(o) ~= "table" or type(o.path) ~= "string" then error("data.token_file: expected {path = 'file.bin', ...}", 2) end
  local train = open_tokens(o.path, o.format, "data.token_file", o.vocab_size)
  local ds = setmetatable({ sources = { train }, files = { o.path } }, Dataset)
  if o.val_path then
    local val = open_tokens(o.val_path, o.format, "data.val_token_file", o.vocab_size)
    ds.sources[2], ds.files[2] = val, o.val_path
    ds.splits = { train = { train, 0, train.count }, val = { val, 0, val.count } }
  else
    local n = train.count
    local ntrain = n - math.floor(n * (o.val_fraction or 0))
    ds.splits = { train = { train, 0, ntrain }, val = { train, ntrain, n } }
  end
  return ds
end

-- unmaps now rather than at garbage collection
function Dataset:close()
  for _, s in ipairs(self.sources or {}) do
    if s.file then C.fsdp_token_file_close(ffi.gc(s.file, nil)); s.file = nil end
  end
end

-- A dataset over an int32 token array (tests, token files)
function M.from_tokens(toks, n, vocab, val_fraction)
  local ntrain = n - math.floor(n * (val_fraction or 0.1))
  local src = array_source(toks)
  return setmetatable({ tokens = toks, n = n, vocab_size = vocab, splits = { train = { src, 0, ntrain }, val = { src, ntrain, n } } }, Dataset)
end

-- a deterministic permutation of 0..n-1 for (seed, epoch): Fisher-Yates
-- driven by a 32-bit xorshift
local function permutation(n, seed, epoch)
  local s = bit.bxor(seed * 2654435761 % 4294967296, (epoch + 1) * 40503) % 4294967296
  if s == 0 then s = 1 end
  local function rnd()
    s = bit.bxor(s, bit.lshift(s, 13)); s = bit.bxor(s, bit.rshift(s, 17)); s = bit.bxor(s, bit.lshift(s, 5))
    return (s % 4294967296 + 4294967296) % 4294967296
  end
  local p = {}
  for i = 0, n - 1 do p[i] = i end
  for i = n - 1, 1, -1 do
    local j = rnd() % (i + 1)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

function Dataset:loader(o)
  local split = o.split or "train"
  local range = self.splits[split]
  if not range then error("data: split '" .. tostring(split) .. "' (expected train or val)", 2) end
  local B, T, W, r = o.batch, o.seq, o.world or 1, o.rank or 0
  local nwin = self:windows(split, T)
  if nwin < 1 then
    error(string.format("data: the %s split has %d tokens, fewer than one window of seq + 1 = %d", split, range[3] - range[2], T + 1), 2)
  end
  if r < 0 or r >= W then error(string.format("data: rank %d outside a world of %d", r, W), 2) end
  return setmetatable({ ds = self, split = split, src = range[1], start = range[2], B = B, T = T, W = W, r = r, seed = o.seed or 0,
    nwin = nwin, consumed = o.state and o.state.consumed or 0, shuffle = split == "train" }, Loader)
end

-- windows of seq + 1 tokens (one every seq tokens) in a split: an epoch
function Dataset:windows(split, seq)
  local range = self.splits[split]
  return math.floor((range[3] - range[2] - 1) / seq)
end

function Loader:window(g) -- the window at global position g
  local epoch, i = math.floor(g / self.nwin), g % self.nwin
  if self.shuffle then
    if self.perm_epoch ~= epoch then self.perm, self.perm_epoch = permutation(self.nwin, self.seed, epoch), epoch end
    i = self.perm[i]
  end
  return self.start + i * self.T
end

function Loader:next()
  local B, T, W = self.B, self.T, self.W
  local x, y = tensor.new({ B, T }, "int32"), tensor.new({ B, T }, "int32")
  local xp, yp = x:ptr(), y:ptr()
  self.buf = self.buf or ffi.new("int32_t[?]", T + 1)
  for b = 0, B - 1 do
    self.src.read(self:window(self.consumed + b * W + self.r), T + 1, self.buf)
    ffi.copy(xp + b * T, self.buf, T * 4)
    ffi.copy(yp + b * T, self.buf + 1, T * 4)
  end
  self.consumed = self.consumed + B * W
  return x, y
end

function Loader:state() return { consumed = self.consumed } end
function Loader:reset() self.consumed = 0 end

-- Where a resumed run's training data goes on. saved: a checkpoint's
-- record {consumed = windows taken by the whole group, seq, micro_batch,
-- windows = the training split's windows per epoch}; now: this run's {seq,
-- micro_batch, windows}. Returns the windows consumed in this run's
-- windows and a note for the log (or nil); raises when the position does
-- not map exactly. The micro-batch and the world size never matter: the
-- group takes consecutive positions of one shuffled order. Another seq
-- cuts other windows in another order, so only whole epochs carry over.
function M.resume_position(saved, now, what)
  local consumed = saved.consumed or 0
  if not saved.seq then
    return consumed, string.format("%s records no data geometry (saved before fsdp recorded it): its %d windows consumed " ..
      "are taken as windows of data.seq = %d tokens, this run's", what, consumed, now.seq)
  end
  if saved.seq == now.seq then
    local notes = {}
    if saved.micro_batch ~= now.micro_batch then
      notes[#notes + 1] = string.format("data.micro_batch %d -> %d: the data goes on at window %d, as it would have",
        saved.micro_batch, now.micro_batch, consumed)
    end
    if saved.windows and saved.windows ~= now.windows then
      notes[#notes + 1] = string.format("the training split has %d windows of %d tokens and had %d when %s was saved: " ..
        "is this the data it was trained on?", now.windows, now.seq, saved.windows, what)
    end
    return consumed, #notes > 0 and table.concat(notes, "; ") or nil
  end
  local per = saved.windows
  if per and per > 0 and consumed % per == 0 then
    local epochs = consumed / per
    return epochs * now.windows, string.format("data.seq %d -> %d: %s holds %d whole epoch%s of the data (%d windows of %d " ..
      "tokens); this run goes on at the start of epoch %d (%d windows of %d tokens each)", saved.seq, now.seq, what, epochs,
      epochs == 1 and "" or "s", consumed, saved.seq, epochs, now.windows, now.seq)
  end
  error(string.format("%s was trained with data.seq = %d and this run has data.seq = %d: its data position (%d windows of %d " ..
    "tokens, %s) cannot be mapped onto windows of %d tokens. Resume with data.seq = %d, or from a checkpoint saved at the " ..
    "end of an epoch", what, saved.seq, now.seq, consumed, saved.seq,
    per and string.format("%d into epoch %d of %d windows", consumed % per, math.floor(consumed / per), per) or "epochs unknown",
    now.seq, saved.seq), 0)
end

return M
