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
--   loader:next() also returns a table {doc_start = int32 {B, T} or nil,
--   count = the targets y holds} when the data has documents or a mask
--   (below); nil otherwise.
--
-- Documents, masks and packing (`fsdp prepare` writes them beside its
-- token files: X.idx, the documents' token offsets, raw little-endian
-- uint64, documents + 1 of them; X.mask, `--chat`'s loss mask, one byte a
-- token, 1 where the token is a target):
--   ds:pack{seq = T, split_long = true, max_piece = P}: the loaders cut no windows but
--   pack whole documents into rows of T (fsdp.packing, best fit; a longer
--   one in pieces): a row's documents never see each other (doc_start),
--   positions restart at each, padding and each document's last token
--   have no target (y = -100); no piece is longer than P (the model's
--   max_position_embeddings: rows may be longer than that). The rows take the windows' place: the same
--   shuffled order, rank split and resume position.
--   A mask sets y = -100 where the token is no target, packed or not.
local base = require "fsdp.ffi"
local tensor = require "fsdp.tensor"
local ffi, C = base.ffi, base.C

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
local formats = { auto = C.FSDP_TOKENS_AUTO, raw_u16 = C.FSDP_TOKENS_RAW_U16, raw_u32 = C.FSDP_TOKENS_RAW_U32,
  raw_u8 = C.FSDP_TOKENS_RAW_U8 } -- (raw_u8: masks, read here, not offered as data.format)

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

-- X.idx and X.mask beside token file X.bin (or X)
local function beside(path, ext) return (path:gsub("%.bin$", "")) .. ext end
local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- A document index (X.idx): offsets[0] = 0 <= ... <= offsets[n] = count.
-- Returns {n = documents, starts = int64[n], lengths = int32[n]}.
local function open_index(path, count, what)
  local f, err = io.open(path, "rb")
  if not f then error(what .. ": " .. tostring(err), 3) end
  local raw = f:read("*a")
  f:close()
  if #raw % 8 ~= 0 or #raw < 16 then
    error(string.format("%s: %s has %d bytes; a document index is 8-byte offsets, at least 2 (`fsdp prepare` writes it)",
      what, path, #raw), 3)
  end
  local n = #raw / 8 - 1
  local off = ffi.cast("const uint64_t *", raw)
  local starts, lengths = ffi.new("int64_t[?]", n), ffi.new("int32_t[?]", n)
  if off[0] ~= 0 then error(string.format("%s: %s starts at offset %.0f, expected 0", what, path, tonumber(off[0])), 3) end
  for i = 0, n - 1 do
    local a, b = tonumber(off[i]), tonumber(off[i + 1])
    if b < a or b > count or b - a > 2147483647 then
      error(string.format("%s: %s: document %d spans tokens %.0f to %.0f; expected a span inside the %d tokens of its " ..
        "token file, after the one before (a damaged or mismatched index: prepare the data again)", what, path, i,
        a, b, count), 3)
    end
    starts[i], lengths[i] = a, b - a
  end
  if tonumber(off[n]) ~= count then
    error(string.format("%s: %s ends at token %.0f but its token file has %d tokens (a mismatched index: prepare the " ..
      "data again)", what, path, tonumber(off[n]), count), 3)
  end
  return { n = n, starts = starts, lengths = lengths, path = path }
end

-- a loss mask (X.mask): one byte a token, 0 or 1, as many as the tokens
local function open_mask(path, count, what)
  local m = open_tokens(path, "raw_u8", what)
  if m.count ~= count then
    error(string.format("%s: %s has %d entries but its token file has %d tokens (a mismatched mask: prepare the data " ..
      "again)", what, path, m.count, count), 3)
  end
  if C.fsdp_token_file_check_ids(m.file, 2) < 0 then error(what .. ": " .. ffi.string(C.fsdp_last_error()), 3) end
  return m
end

-- the documents of the tokens [lo, hi) of an index: those that start there
local function docs_in(idx, lo, hi)
  local k0, k1 = 0, idx.n
  while k0 < idx.n and idx.starts[k0] < lo do k0 = k0 + 1 end
  k1 = k0
  while k1 < idx.n and idx.starts[k1] < hi do k1 = k1 + 1 end
  local n = k1 - k0
  local starts, lengths = ffi.new("int64_t[?]", math.max(n, 1)), ffi.new("int32_t[?]", math.max(n, 1))
  for i = 0, n - 1 do
    local st = tonumber(idx.starts[k0 + i])
    starts[i], lengths[i] = st, math.min(idx.lengths[k0 + i], hi - st)
  end
  return { n = n, starts = starts, lengths = lengths }
end

-- whether `fsdp prepare --chat` wrote a loss mask beside token file path
function M.has_mask(path) return exists(beside(path, ".mask")) end

function M.token_file(o)
  if type(o) ~= "table" or type(o.path) ~= "string" then error("data.token_file: expected {path = 'file.bin', ...}", 2) end
  local train = open_tokens(o.path, o.format, "data.token_file", o.vocab_size)
  local ds = setmetatable({ sources = { train }, files = { o.path } }, Dataset)
  -- documents and masks beside the token files, when `fsdp prepare` wrote them
  local function extras(src, path, what)
    if exists(beside(path, ".idx")) then src.index = open_index(beside(path, ".idx"), src.count, what) end
    if exists(beside(path, ".mask")) then
      src.mask = open_mask(beside(path, ".mask"), src.count, what)
      ds.sources[#ds.sources + 1] = src.mask
    end
  end
  extras(train, o.path, "data.token_file")
  if o.val_path then
    local val = open_tokens(o.val_path, o.format, "data.val_token_file", o.vocab_size)
    ds.sources[#ds.sources + 1], ds.files[2] = val, o.val_path
    extras(val, o.val_path, "data.val_token_file")
    ds.splits = { train = { train, 0, train.count }, val = { val, 0, val.count } }
  else
    local n = train.count
    local ntrain = n - math.floor(n * (o.val_fraction or 0))
    if train.index and ntrain < n then -- the split falls between documents: the last ones validate
      local idx, k = train.index, train.index.n
      while k > 1 and idx.starts[k - 1] >= ntrain do k = k - 1 end
      ntrain = tonumber(idx.starts[k - 1]) > 0 and tonumber(idx.starts[k - 1]) or ntrain
    end
    ds.splits = { train = { train, 0, ntrain }, val = { train, ntrain, n } }
  end
  ds.masked = train.mask ~= nil
  ds.documents = train.index ~= nil
  return ds
end

-- Packing (see the top): every later loader packs each split's documents
-- into rows of o.seq tokens; a split whose file has no index is refused.
function Dataset:pack(o)
  local packing = require "fsdp.packing"
  self.packed = {}
  for split, range in pairs(self.splits) do
    local src = range[1]
    if not src.index then
      error(string.format("data.pack: the %s split's token file has no document index (X.idx beside X.bin, which " ..
        "`fsdp prepare` writes): prepare the data again, or set data.pack = false", split), 2)
    end
    local d = docs_in(src.index, range[2], range[3])
    self.packed[split] = packing.pack({ starts = d.starts, lengths = d.lengths, n = d.n, seq = o.seq, seed = 0,
      split_long = o.split_long, max_piece = o.max_piece, what = "data (" .. split .. " split)" })
  end
  self.pack_seq = o.seq
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

-- a deterministic permutation of 0..n-1 for (seed, epoch)
local permutation = require("fsdp.packing").permutation

function Dataset:loader(o)
  local split = o.split or "train"
  local range = self.splits[split]
  if not range then error("data: split '" .. tostring(split) .. "' (expected train or val)", 2) end
  local B, T, W, r = o.batch, o.seq, o.world or 1, o.rank or 0
  local nwin = self:windows(split, T)
  if nwin < 1 then
    if self.packed then error(string.format("data: the %s split has no document of 2 tokens or more to pack", split), 2) end
    error(string.format("data: the %s split has %d tokens, fewer than one window of seq + 1 = %d", split, range[3] - range[2], T + 1), 2)
  end
  if r < 0 or r >= W then error(string.format("data: rank %d outside a world of %d", r, W), 2) end
  return setmetatable({ ds = self, split = split, src = range[1], start = range[2], B = B, T = T, W = W, r = r, seed = o.seed or 0,
    nwin = nwin, consumed = o.state and o.state.consumed or 0, shuffle = split == "train",
    packing = self.packed and self.packed[split], mask = range[1].mask }, Loader)
end

-- windows of seq + 1 tokens (one every seq tokens) in a split: an epoch;
-- packed, its rows
function Dataset:windows(split, seq)
  if self.packed then
    if seq ~= self.pack_seq then error(string.format("data: packed into rows of %d, asked for %d", self.pack_seq, seq), 2) end
    return self.packed[split].rows
  end
  local range = self.splits[split]
  return math.floor((range[3] - range[2] - 1) / seq)
end

function Loader:index(g) -- the window (or packed row) at global position g
  local epoch, i = math.floor(g / self.nwin), g % self.nwin
  if self.shuffle then
    if self.perm_epoch ~= epoch then self.perm, self.perm_epoch = permutation(self.nwin, self.seed, epoch), epoch end
    i = self.perm[i]
  end
  return i
end
function Loader:window(g) return self.start + self:index(g) * self.T end

local IGNORE = -100 -- the loss's ignore_index: no target here

-- packed row r into row b of x, y, doc_start: its pieces one after
-- another, then padding (id 0, documents of their own, no targets); returns
-- the targets it holds
local function pack_row(self, r, b, xp, yp, dp)
  local pk, T, src, mask = self.packing, self.T, self.src, self.mask
  local i0, i1 = pk:row(r)
  local t, count, mbuf = 0, 0, self.mbuf
  for i = i0, i1 - 1 do
    local st, len = tonumber(pk.start[i]), pk.len[i]
    local x = xp + b * T + t
    src.read(st, len, x)
    if mask then mask.read(st, len, mbuf) end
    for j = 0, len - 1 do dp[b * T + t + j] = t end
    for j = 0, len - 2 do
      if mask and mbuf[j + 1] == 0 then yp[b * T + t + j] = IGNORE
      else yp[b * T + t + j] = x[j + 1]; count = count + 1 end
    end
    yp[b * T + t + len - 1] = IGNORE
    t = t + len
  end
  -- (padding: documents of at most the longest piece, so no position passes the model's)
  local P = pk.max_piece
  for j = t, T - 1 do xp[b * T + j], yp[b * T + j], dp[b * T + j] = 0, IGNORE, t + math.floor((j - t) / P) * P end
  return count
end

function Loader:next()
  local B, T, W = self.B, self.T, self.W
  local x, y = tensor.new({ B, T }, "int32"), tensor.new({ B, T }, "int32")
  local xp, yp = x:ptr(), y:ptr()
  self.buf = self.buf or ffi.new("int32_t[?]", T + 1)
  if self.mask then self.mbuf = self.mbuf or ffi.new("int32_t[?]", T + 1) end
  local extra
  if self.packing then
    local ds = tensor.new({ B, T }, "int32")
    extra = { doc_start = ds, count = 0 }
    for b = 0, B - 1 do
      extra.count = extra.count + pack_row(self, self:index(self.consumed + b * W + self.r), b, xp, yp, ds:ptr())
    end
  else
    if self.mask then extra = { count = 0 } end
    for b = 0, B - 1 do
      local at = self:window(self.consumed + b * W + self.r)
      self.src.read(at, T + 1, self.buf)
      ffi.copy(xp + b * T, self.buf, T * 4)
      ffi.copy(yp + b * T, self.buf + 1, T * 4)
      if self.mask then -- no target where the mask says so
        self.mask.read(at + 1, T, self.mbuf)
        for j = 0, T - 1 do
          if self.mbuf[j] == 0 then yp[b * T + j] = IGNORE else extra.count = extra.count + 1 end
        end
      end
    end
  end
  self.consumed = self.consumed + B * W
  return x, y, extra
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
