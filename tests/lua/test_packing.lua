-- test_packing.lua (fsdprun -n W, W = 1, 2 and 4): documents packed into
-- rows, masked targets, and the loss over all of them.
-- 1. fsdp.packing: rows of at most T tokens; every next-token target of
--    every document (pieces of a long one overlap by one token) in exactly
--    one piece; the rows' fills those of a naive best fit (a scan of every
--    row per piece); split_long = false refuses a long document by index.
-- 2. A packed row computes what each of its documents computes alone: the
--    Llama's logits of rows of 1, 3 and 7 documents (and of a long
--    document's pieces) equal the documents run alone, within 1e-5
--    relative + 1e-6 absolute (fp32: other GEMM shapes, not other math).
-- 3. The loss over masked and packed targets is the mean over every target
--    of the step, whatever the ranks and micro-batches: a step on W ranks
--    with 1, 2 and 4 micro-batches (counts that differ from micro-batch to
--    micro-batch, one with none) equals one unsharded micro-batch holding
--    the whole global batch: the loss within 1e-6 relative and the update
--    (SGD, lr 1) within 1e-6 of its largest element; the loss also equals
--    a float64 cross-entropy of the unsharded logits over the targets
--    (within 1e-6 relative).
-- 4. The data loader packs `fsdp prepare`-style files (X.bin, X.idx,
--    X.mask): rows hold the documents' tokens, targets only inside a
--    document and where the mask says so, doc_start at each document's
--    start; damaged index and mask files are refused, naming them.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local packing = require "fsdp.packing"
local data = require "fsdp.data"
local ffi = require "ffi"

local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_packing rank %d/%d", R, W))
local check = T.check

local lcg = T.lcg

---------------------------------------------------------------- 1. packing
do
  local rnd = lcg(17)
  local n, Tq = 300, 16
  local starts, lengths = ffi.new("int64_t[?]", n), ffi.new("int32_t[?]", n)
  local at = 0
  for d = 0, n - 1 do
    local len = rnd(10) == 0 and 17 + rnd(40) or rnd(15) -- a tenth longer than a row; some of 0 or 1 token
    starts[d], lengths[d] = at, len
    at = at + len
  end
  local p = packing.pack({ starts = starts, lengths = lengths, n = n, seq = Tq, seed = 0 })
  local covered, over, short = {}, 0, 0
  for r = 0, p.rows - 1 do
    local i0, i1 = p:row(r)
    local used = 0
    for i = i0, i1 - 1 do
      local s, l = tonumber(p.start[i]), p.len[i]
      used = used + l
      if l < 2 then short = short + 1 end
      for t = s + 1, s + l - 1 do covered[t] = (covered[t] or 0) + 1 end -- the targets this piece trains
    end
    if used > Tq then over = over + 1 end
  end
  check(over == 0 and short == 0, string.format("packing: rows within %d tokens (%d over), no piece without a target (%d)",
    Tq, over, short))
  local wrong = 0
  for d = 0, n - 1 do
    local s, l = tonumber(starts[d]), lengths[d]
    for t = s + 1, s + l - 1 do if covered[t] ~= 1 then wrong = wrong + 1 end end
    if l > 0 and covered[s] then wrong = wrong + 1 end -- a document's first token is no target
  end
  check(wrong == 0, "packing: every target of every document in exactly one piece (" .. wrong .. " not)")
  -- a naive best fit over the same pieces in the same order: the same fills
  local order = packing.permutation(n, 0, 0x9ac4)
  local free = {}
  local function place(len)
    local best
    for r = 1, #free do
      if free[r] >= len and (not best or free[r] < free[best]) then best = r end
    end
    if not best then best = #free + 1; free[best] = Tq end
    free[best] = free[best] - len
  end
  for k = 0, n - 1 do
    local len = lengths[order[k]]
    if len >= 2 and len <= Tq then place(len)
    elseif len > Tq then
      local s = 0
      while true do
        local l = math.min(Tq, len - s)
        place(l)
        if s + l >= len then break end
        s = s + Tq - 1
      end
    end
  end
  local mine = {}
  for r = 0, p.rows - 1 do
    local i0, i1 = p:row(r)
    local used = 0
    for i = i0, i1 - 1 do used = used + p.len[i] end
    mine[#mine + 1] = used
  end
  local naive = {}
  for r = 1, #free do naive[r] = Tq - free[r] end
  table.sort(mine); table.sort(naive)
  local same = #mine == #naive
  for i = 1, #mine do same = same and mine[i] == naive[i] end
  check(same, string.format("packing: the fills of a naive best fit (%d rows, naive %d)", #mine, #naive))
  local st = p:stats()
  check(st.fill > 0.9 and st.split > 0 and st.dropped > 0, string.format("packing: fill %.3f, %d split, %d dropped",
    st.fill, st.split, st.dropped))
  T.fails(function() packing.pack({ starts = starts, lengths = lengths, n = n, seq = Tq, split_long = false }) end,
    "tokens, more than data.seq = 16", "split_long = false refuses a long document")
  -- rows longer than the model's positions (data.max_tokens): no piece longer than max_piece
  local q = packing.pack({ starts = starts, lengths = lengths, n = n, seq = 64, max_piece = 12, seed = 0 })
  local longest, cover = 0, {}
  for i = 0, q.pieces - 1 do
    longest = math.max(longest, q.len[i])
    for t = tonumber(q.start[i]) + 1, tonumber(q.start[i]) + q.len[i] - 1 do cover[t] = (cover[t] or 0) + 1 end
  end
  local once = true
  for d = 0, n - 1 do
    for t = tonumber(starts[d]) + 1, tonumber(starts[d]) + lengths[d] - 1 do once = once and cover[t] == 1 end
  end
  check(longest == 12 and once and q:stats().fill > 0.9, string.format("max_piece 12 in rows of 64: pieces up to %d, " ..
    "every target once (%s), fill %.3f", longest, tostring(once), q:stats().fill))
  T.fails(function() packing.pack({ starts = starts, lengths = lengths, n = n, seq = 64, max_piece = 12, split_long = false }) end,
    "more than the model's max_position_embeddings = 12", "split_long = false names the positions' bound")
end

---------------------------------------------------------------- the model
local cfg = llama.config({ hidden_size = 16, intermediate_size = 24, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 23, max_position_embeddings = 64, rope_theta = 10000, rms_norm_eps = 1e-5 })
local V = cfg.vocab_size
local mesh = fsdp.mesh({ { "dp", W }, { "solo", 1 } })
local dp, solo = mesh:group("dp"), mesh:group("solo")

local function ids_tensor(list, shape) return T.int32(fsdp, list, shape) end

-- doc_start of rows of documents of these lengths
local function starts_of(rows, S)
  local out = {}
  for _, lens in ipairs(rows) do
    local t = 0
    for _, l in ipairs(lens) do
      for _ = 1, l do out[#out + 1] = t end
      t = t + l
    end
    for _ = t + 1, S do out[#out + 1] = t end -- (padding: one more document)
  end
  return out
end

-- the logits of a batch (every position), through evaluate's forward
local function logits_of(m, x, doc_start)
  local got = {}
  m:evaluate({ { x = x, y = ids_tensor({}, { 0 }), doc_start = doc_start } }, function(logits)
    for i = 0, logits:numel() - 1 do got[i + 1] = logits:get(i) end
    return 0
  end)
  return got
end

---------------------------------------------------------------- 2. packed rows
do
  local m = fsdp.fully_shard(llama.model(cfg), { shard = solo, zero = 0, seed = 5 })
  local S = 24
  local rows = { { 24 }, { 5, 1, 18 }, { 3, 4, 1, 2, 6, 5, 2 } } -- (the last row: 23 tokens and a padding position)
  local rnd, ids = lcg(3), {}
  for i = 1, #rows * S do ids[i] = rnd(V) end
  local packed = logits_of(m, ids_tensor(ids, { #rows, S }), ids_tensor(starts_of(rows, S), { #rows, S }))
  local bad, docs = 0, 0
  for r, lens in ipairs(rows) do
    local t = 0
    for _, l in ipairs(lens) do
      local alone_ids = {}
      for j = 1, l do alone_ids[j] = ids[(r - 1) * S + t + j] end
      local alone = logits_of(m, ids_tensor(alone_ids, { 1, l }))
      for j = 0, l - 1 do
        for c = 1, V do
          local a, p = alone[j * V + c], packed[((r - 1) * S + t + j) * V + c]
          if not (math.abs(a - p) <= 1e-5 * math.abs(a) + 1e-6) then bad = bad + 1 end
        end
      end
      docs, t = docs + 1, t + l
    end
  end
  check(bad == 0, string.format("a packed row's logits are its %d documents' alone (%d off)", docs, bad))
  -- a row longer than max_position_embeddings (64) of documents within it: each as it is alone
  do
    local long = { { 40, 60, 28 } }
    local L, lid = 128, {}
    for i = 1, L do lid[i] = rnd(V) end
    local got = logits_of(m, ids_tensor(lid, { 1, L }), ids_tensor(starts_of(long, L), { 1, L }))
    local off, t = 0, 0
    for _, l in ipairs(long[1]) do
      local a = {}
      for j = 1, l do a[j] = lid[t + j] end
      local alone = logits_of(m, ids_tensor(a, { 1, l }))
      for j = 0, l * V - 1 do
        if not (math.abs(alone[j + 1] - got[t * V + j + 1]) <= 1e-5 * math.abs(alone[j + 1]) + 1e-6) then off = off + 1 end
      end
      t = t + l
    end
    check(off == 0, "a packed row of 128 over 64 positions: each document as alone (" .. off .. " off)")
    T.fails(function() logits_of(m, ids_tensor(lid, { 1, L }), ids_tensor(starts_of({ { 40, 88 } }, L), { 1, L })) end,
      "a packed document of 88 tokens passes max_position_embeddings 64", "a packed document past the positions is refused")
  end
  local badds = ids_tensor(starts_of(rows, S), { #rows, S })
  badds:set(S + 7, 2) -- row 1, position 7: inside the document starting at 6
  T.fails(function() logits_of(m, ids_tensor(ids, { #rows, S }), badds) end, "row 1 position 7 holds 2",
    "a malformed doc_start is refused, naming row and position")
  m:free()
end

---------------------------------------------------------------- 3. the loss over all targets
do
  local G, S = 16, 12 -- global rows, each of S
  local rnd = lcg(99)
  local gx, gy, gds = {}, {}, {}
  for row = 0, G - 1 do
    -- documents of random lengths; targets masked at random, more in some rows than others
    local t, rate = 0, row % 4 == 3 and 1 or rnd(4) -- every 4th row: no target at all
    while t < S do
      local l = math.min(S - t, 1 + rnd(S))
      for j = 0, l - 1 do
        gx[row * S + t + j + 1] = rnd(V)
        gds[row * S + t + j + 1] = t
        local last = j == l - 1
        gy[row * S + t + j + 1] = (last or rnd(4) < rate) and -100 or rnd(V)
      end
      t = t + l
    end
  end
  local function batch(rows) -- rows: 0-based global row numbers
    local x, y, ds = {}, {}, {}
    local count = 0
    for _, row in ipairs(rows) do
      for j = 1, S do
        x[#x + 1], y[#y + 1], ds[#ds + 1] = gx[row * S + j], gy[row * S + j], gds[row * S + j]
        if gy[row * S + j] ~= -100 then count = count + 1 end
      end
    end
    local n = #rows
    return { x = ids_tensor(x, { n, S }), y = ids_tensor(y, { n, S }), doc_start = ids_tensor(ds, { n, S }), count = count }
  end
  local all = {}
  for g = 0, G - 1 do all[g + 1] = g end
  local opt = { optimizer = "sgd", lr = 1, momentum = 0, weight_decay = 0 }
  local loss_fn = function(logits, b, scale) return llama.loss(logits, b.y, scale) end
  -- the reference: one unsharded micro-batch of the whole global batch
  local ref = fsdp.fully_shard(llama.model(cfg), { shard = solo, zero = 0, seed = 5 })
  local names = {}
  for _, u in ipairs(ref.units) do for _, p in ipairs(u.params) do names[#names + 1] = p.name end end
  local before = T.params(ref)
  -- the float64 loss of its logits over the targets
  local whole = batch(all)
  local lg = logits_of(ref, whole.x, whole.doc_start)
  local sum, n = 0, 0
  for i = 0, G * S - 1 do
    local t = whole.y:get(i)
    if t ~= -100 then
      local mx = -math.huge
      for c = 1, V do mx = math.max(mx, lg[i * V + c]) end
      local z = 0
      for c = 1, V do z = z + math.exp(lg[i * V + c] - mx) end
      sum, n = sum + mx + math.log(z) - lg[i * V + t + 1], n + 1
    end
  end
  local ref_loss = ref:train_step({ whole }, { optimizer = "sgd", lr = 1, momentum = 0, weight_decay = 0, loss = loss_fn })
  check(math.abs(ref_loss - sum / n) <= 1e-6 * sum / n, string.format("the loss %.9g is the float64 mean over %d " ..
    "targets %.9g", ref_loss, n, sum / n))
  local ref_after = T.params(ref)
  ref:free()
  for _, K in ipairs({ 1, 2, 4 }) do
    for _, fused in ipairs({ false, true }) do
      local B = G / (W * K)
      local m = fsdp.fully_shard(llama.model(cfg), { shard = dp, units = llama.units, zero = 3, seed = 5 })
      local mb = {}
      for k = 1, K do -- rank R's rows: R, R + W, ... (as the loader deals them), K micro-batches of B
        local rows = {}
        for i = 1, B do rows[i] = ((k - 1) * B + i - 1) * W + R end
        mb[k] = batch(rows)
      end
      local o = {}
      for key, v in pairs(opt) do o[key] = v end
      if fused then o.forward_loss = llama.forward_loss(5 * V * 4) else o.loss = loss_fn end
      local loss = m:train_step(mb, o)
      local label = string.format("%d ranks x %d micro-batches%s", W, K, fused and " (fused head)" or "")
      check(math.abs(loss - ref_loss) <= 1e-6 * ref_loss, string.format("%s: loss %.9g, unsharded %.9g", label, loss,
        ref_loss))
      local after, worst, big = T.params(m), 0, 0
      for _, name in ipairs(names) do
        local a, r0, r1 = after[name], before[name], ref_after[name]
        for i = 1, #r0 do
          big = math.max(big, math.abs(r1[i] - r0[i]))
          worst = math.max(worst, math.abs((a[i] - r0[i]) - (r1[i] - r0[i])))
        end
      end
      check(worst <= 1e-6 * big, string.format("%s: the update within 1e-6 of its largest element (%.2e of %.2e)", label,
        worst, big))
      m:free()
    end
  end
end

---------------------------------------------------------------- 4. the loader
do
  local dir = R == 0 and T.workdir("packing") or nil
  if R == 0 then
    -- three documents in a raw uint16 token file, their index and a mask
    local docs = { { 5, 6, 7, 8 }, { 9, 10, 11 }, { 12, 13, 14, 15, 16, 17, 18 } }
    local masks = { { 0, 0, 1, 1 }, { 0, 1, 1 }, { 0, 0, 0, 1, 1, 0, 1 } }
    local toks, mk, idx = {}, {}, { 0 }
    for d, doc in ipairs(docs) do
      for j, v in ipairs(doc) do toks[#toks + 1] = string.char(v % 256, 0); mk[#mk + 1] = string.char(masks[d][j]) end
      idx[#idx + 1] = idx[#idx] + #doc
    end
    local function u64(v) local s = {} for i = 0, 7 do s[#s + 1] = string.char(math.floor(v / 2 ^ (8 * i)) % 256) end return table.concat(s) end
    local ib = {}
    for _, v in ipairs(idx) do ib[#ib + 1] = u64(v) end
    T.write(dir .. "/d.bin", table.concat(toks))
    T.write(dir .. "/d.idx", table.concat(ib))
    T.write(dir .. "/d.mask", table.concat(mk))
    local ds = data.token_file({ path = dir .. "/d.bin", format = "raw_u16", val_fraction = 0 })
    check(ds.masked and ds.documents, "the loader finds d.idx and d.mask beside d.bin")
    ds:pack({ seq = 8 })
    local l = ds:loader({ split = "train", batch = 1, seq = 8, seed = 1 })
    check(l.nwin == 2, "14 tokens of documents of 4, 3 and 7 pack into 2 rows of 8 (" .. l.nwin .. ")")
    local seen, bad = {}, 0
    for _ = 1, 2 do
      local x, y, e = l:next()
      local ds_ = e.doc_start
      local counted = 0
      for t = 0, 7 do
        local s = ds_:get(t)
        -- y is the next token of the same document where its mask is 1, else -100
        local nxt = t + 1 <= 7 and ds_:get(t + 1) == s and x:get(t + 1) or nil
        local m = nil
        if nxt then
          for d, doc in ipairs(docs) do for j, v in ipairs(doc) do if v == nxt then m = masks[d][j] end end end
        end
        local want = (nxt and m == 1) and nxt or -100
        if y:get(t) ~= want then bad = bad + 1 end
        if y:get(t) ~= -100 then counted = counted + 1 end
        if s == t and x:get(t) ~= 0 then seen[x:get(t)] = true end
      end
      if counted ~= e.count then bad = bad + 1 end
    end
    check(bad == 0, "packed rows: targets inside documents where the mask allows, counted (" .. bad .. " off)")
    check(seen[5] and seen[9] and seen[12], "each document starts a run of doc_start")
    ds:close()
    -- damaged files: named
    T.write(dir .. "/d.idx", table.concat(ib, "", 1, 3))
    T.fails(function() data.token_file({ path = dir .. "/d.bin", format = "raw_u16" }) end,
      "d.idx ends at token 7 but its token file has 14 tokens", "a cut index is refused")
    T.write(dir .. "/d.idx", table.concat(ib) .. "xyz")
    T.fails(function() data.token_file({ path = dir .. "/d.bin", format = "raw_u16" }) end, "d.idx has 35 bytes",
      "an index of odd size is refused")
    T.write(dir .. "/d.idx", table.concat(ib))
    T.write(dir .. "/d.mask", table.concat(mk, "", 1, 13) .. string.char(2))
    T.fails(function() data.token_file({ path = dir .. "/d.bin", format = "raw_u16" }) end, "d.mask': token 13",
      "a mask byte other than 0 or 1 is refused")
    T.write(dir .. "/d.mask", table.concat(mk, "", 1, 12))
    T.fails(function() data.token_file({ path = dir .. "/d.bin", format = "raw_u16" }) end, "has 12 entries",
      "a short mask is refused")
    os.execute("rm -rf '" .. dir .. "'")
  end
end

T.finish()
