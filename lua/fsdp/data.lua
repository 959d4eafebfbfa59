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
local ffi, bit = base.ffi, require "bit"

local M = {}
local Dataset, Loader = {}, {}
Dataset.__index, Loader.__index = Dataset, Loader

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
  local ntrain = math.floor(n * (1 - vf))
  return setmetatable({ tokens = toks, n = n, files = files, vocab_size = 256,
    splits = { train = { 0, ntrain }, val = { ntrain, n } } }, Dataset)
end

-- Pre-tokenised binary token files (llm.c / nanoGPT formats) are not read
-- yet: say so instead of failing obscurely.
function M.token_file(o)
  error(string.format("data.token_file = '%s': reading pre-tokenised token files is not implemented yet; use " ..
    "data.corpus for now", tostring(o and o.path)), 2)
end

-- A dataset over an int32 token array (tests, token files)
function M.from_tokens(toks, n, vocab, val_fraction)
  local ntrain = math.floor(n * (1 - (val_fraction or 0.1)))
  return setmetatable({ tokens = toks, n = n, vocab_size = vocab, splits = { train = { 0, ntrain }, val = { ntrain, n } } }, Dataset)
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
  local nwin = math.floor((range[2] - range[1] - 1) / T)
  if nwin < 1 then
    error(string.format("data: the %s split has %d tokens, fewer than one window of seq + 1 = %d", split, range[2] - range[1], T + 1), 2)
  end
  if r < 0 or r >= W then error(string.format("data: rank %d outside a world of %d", r, W), 2) end
  return setmetatable({ ds = self, split = split, start = range[1], B = B, T = T, W = W, r = r, seed = o.seed or 0,
    nwin = nwin, consumed = o.state and o.state.consumed or 0, shuffle = split == "train" }, Loader)
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
  local xp, yp, toks = x:ptr(), y:ptr(), self.ds.tokens
  for b = 0, B - 1 do
    local off = self:window(self.consumed + b * W + self.r)
    ffi.copy(xp + b * T, toks + off, T * 4)
    ffi.copy(yp + b * T, toks + off + 1, T * 4)
  end
  self.consumed = self.consumed + B * W
  return x, y
end

function Loader:state() return { consumed = self.consumed } end
function Loader:reset() self.consumed = 0 end

return M
