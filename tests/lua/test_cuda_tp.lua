-- test_cuda_tp.lua (GPU ranks: fsdprun -n 2 or 4 --ranks-per-gpu N, as
-- tests/scripts/test_cuda_tp.sh runs it; exits 77 without a GPU): tensor
-- parallelism (fsdp.tp) and context parallelism (fsdp.cp) on GPU ranks
-- against one GPU rank, as tests/lua/test_tp.lua does on CPU ranks. At
-- W = 2 the meshes (dp_shard, tp) = (1, 2) and (dp_shard, cp) = (1, 2); at
-- W = 4 cp 2 x tp 2. Two models: a GQA Llama whose 2 kv heads split over
-- tp 2, and one with a single kv head (every tp rank holds k_proj and
-- v_proj whole: their gradients summed over the group on the device) and
-- tied embeddings. 10 AdamW steps at ZeRO 3 in fp32 equal the same model
-- trained on one GPU rank over the same batch: each step's loss and grad
-- norm within 1e-5 relative (other GEMM shapes, sums in other orders). On
-- the tp meshes also the whole-logits loss (the head's columns gathered,
-- train.loss_chunk_mb = 0), and in bf16 the losses within 3e-2 of one
-- bf16 rank's (bf16 has 8 bits; the tp collectives add in bf16). On
-- the cp meshes attention is an all-gather (fsdp.cp) and also a ring
-- (fsdp.cp_ring: NCCL's send/receive shifts), both through the merge
-- kernel and queries that see no key, fp32 and bf16; and with packed rows
-- (the pos_docs kernels: each query its document's keys alone), fp32.
-- Then generation (greedy tokens with and without KV caches, the last
-- logits) and the post-training engine's log-probs and GRPO steps on each
-- mesh, against one GPU rank.
-- What runs on the device: the vocab-parallel embedding, cross-entropy and
-- log-prob kernels (the gathered stats combined by a kernel), cp's reorders on the
-- compute stream and its positions' device copy, and every tp and cp
-- collective ordered against the compute stream by events.
local fsdp = require "fsdp"
local llama = require "fsdp.models.llama"
local tpm = require "fsdp.tp"
local C = fsdp.C

if C.fsdp_device_available(C.FSDP_CUDA) ~= 1 then
  print("test_cuda_tp: no CUDA device here; skipped")
  os.exit(77)
end
local info = fsdp.init()
local W, R = info.size, info.rank
local T = dofile((arg[0]:match("^(.*/)") or "./") .. "testkit.lua")(string.format("test_cuda_tp rank %d/%d", R, W))
local check = T.check
if W ~= 2 and W ~= 4 then
  print("test_cuda_tp: runs at 2 or 4 ranks (fsdprun -n 2|4 --ranks-per-gpu N)")
  os.exit(2)
end
fsdp.check(C.fsdp_device_set(C.FSDP_CUDA, info.local_rank % C.fsdp_device_count(C.FSDP_CUDA)), "device")

local gqa = { hidden_size = 64, intermediate_size = 96, num_attention_heads = 4, num_key_value_heads = 2,
  num_hidden_layers = 2, vocab_size = 128, max_position_embeddings = 64, rms_norm_eps = 1e-5 }
local shared_kv = {}
for k, v in pairs(gqa) do shared_kv[k] = v end
shared_kv.num_key_value_heads, shared_kv.tie_word_embeddings = 1, true

local SEQ, MB, STEPS = 16, 2, 10
local opt = { lr = 5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-6, weight_decay = 0.1, clip = 1.0 }

-- step k's batch, the same on every rank: ids and targets' device copies
-- on the GPU, the targets on the host too (counted and checked there).
-- packed: rows of documents of 1 to 6 tokens (doc_start on the host, no
-- target across a document's end, the count of targets)
local function batch(vocab, k, packed)
  local rnd = T.lcg(1000 + k)
  local ids, tg, ds, count = {}, {}, {}, 0
  for r = 0, MB - 1 do
    local row = {}
    for t = 0, SEQ do row[t] = math.floor(rnd(2147483648) / 65536) % vocab end
    count = count + T.append_row(ids, tg, ds, row, r, k, SEQ, packed)
  end
  local x, y = T.int32(fsdp, ids, { MB, SEQ }), T.int32(fsdp, tg, { MB * SEQ })
  local b = { x = fsdp.tensor({ MB, SEQ }, "int32", "cuda"):copy_from(x), y = y,
    y_dev = fsdp.tensor({ MB * SEQ }, "int32", "cuda"):copy_from(y) }
  if packed then b.doc_start, b.count = T.int32(fsdp, ds, { MB, SEQ }), count end
  x:free()
  return b
end
local function free(b)
  b.x:free(); b.y:free(); b.y_dev:free()
  if b.doc_start then b.doc_start:free() end
end

local chunked = llama.step_loss(1 * 2 ^ 20)
local whole = { loss = function(logits, b, scale) return llama.loss(logits, b.y, scale, nil, b.y_dev) end }

-- trains m for STEPS steps: {k = {loss, norm}}
local function train(m, cfg, loss, packed)
  local out = {}
  for k = 1, STEPS do
    local b = batch(cfg.vocab_size, k, packed)
    local o = { forward_loss = loss.forward_loss, loss = loss.loss }
    for key, v in pairs(opt) do o[key] = v end
    local l, n = m:train_step({ b }, o)
    out[k] = { l, n }
    free(b)
  end
  return out
end

-- one GPU rank alone (each rank its own), once per model and dtype
local solo_mesh = fsdp.mesh({ { "dp_outer", W }, { "dp_shard", 1 } }, { device = "cuda" })
local refs = {}
local function reference(name, cfg, dtype, loss, packed)
  local key = name .. dtype .. tostring(loss == whole) .. tostring(packed)
  if not refs[key] then
    local m = fsdp.fully_shard(llama.model(cfg), { shard = solo_mesh:group("dp_shard"), units = llama.units, zero = 3,
      seed = 7, mixed = { param_dtype = dtype } })
    refs[key] = train(m, cfg, loss, packed)
    m:free()
  end
  return refs[key]
end

local function rel(a, b) return math.abs(a - b) / math.max(math.abs(b), 1e-30) end

-- the model on mesh spec, as the trainer builds it (FSDP over dp_shard x cp)
local function run(label, name, cfg_t, spec, dtype, loss, cp_attention, packed)
  local cfg = llama.config(cfg_t)
  local want = reference(name, cfg, dtype, loss, packed)
  local mesh = fsdp.mesh(spec, { device = "cuda" })
  local dims = {}
  for _, d in ipairs(spec) do dims[d[1]] = d[2] end
  local tpc, cpc = dims.tp and mesh:group("tp"), dims.cp and mesh:group("cp")
  local m = fsdp.fully_shard(llama.model(cfg, { tp = tpc and tpm.group(tpc), cp = cpc and tpm.group(cpc),
    cp_attention = cp_attention }),
    { shard = mesh:group(cpc and "dp_shard,cp" or "dp_shard"), tp = tpc, units = llama.units, zero = 3, seed = 7,
      mixed = { param_dtype = dtype } })
  local got = train(m, cfg, loss, packed)
  local worst_l, worst_n = 0, 0
  for k = 1, STEPS do
    worst_l = math.max(worst_l, rel(got[k][1], want[k][1]))
    worst_n = math.max(worst_n, rel(got[k][2], want[k][2]))
  end
  local what = string.format("%s, %s, %s%s%s%s", label, name, dtype, loss == whole and ", whole logits" or "",
    cp_attention == "ring" and ", ring attention" or "", packed and ", packed rows" or "")
  if dtype == "fp32" then
    check(worst_l <= 1e-5 and worst_n <= 1e-5, string.format("%s: %d steps' losses and grad norms equal one GPU rank's " ..
      "(worst %.2g and %.2g relative; tolerance 1e-5)", what, STEPS, worst_l, worst_n))
  else
    check(worst_l <= 3e-2, string.format("%s: %d steps' losses within 3e-2 of one bf16 GPU rank's (worst %.2g; grad " ..
      "norms %.2g)", what, STEPS, worst_l, worst_n))
  end
  if R == 0 then print(string.format("  %s: worst loss %.2g, grad norm %.2g relative", what, worst_l, worst_n)) end
  check(got[STEPS][1] < got[1][1], string.format("%s: the loss falls (%.4f -> %.4f)", what, got[1][1], got[STEPS][1]))
  m:free()
  mesh:free()
end

local meshes = W == 2 and { { "tp2", { { "dp_shard", 1 }, { "tp", 2 } } }, { "cp2", { { "dp_shard", 1 }, { "cp", 2 } } } }
  or { { "cp2 x tp2", { { "dp_shard", 1 }, { "cp", 2 }, { "tp", 2 } } } }
for _, mm in ipairs(meshes) do
  local label, spec = mm[1], mm[2]
  local has_cp = label:find("cp") ~= nil
  run(label, "gqa", gqa, spec, "fp32", chunked)
  run(label, "one kv head, tied", shared_kv, spec, "fp32", chunked)
  if not has_cp then run(label, "gqa", gqa, spec, "fp32", whole) end -- (the whole logits: not built with cp)
  run(label, "gqa", gqa, spec, "bf16", chunked)
  if has_cp then -- (cp's attention as a ring too: comm:shift on NCCL, the merge kernel, queries at -1; packed rows)
    run(label, "gqa", gqa, spec, "fp32", chunked, "ring")
    run(label, "gqa", gqa, spec, "bf16", chunked, "ring")
    run(label, "gqa", gqa, spec, "fp32", chunked, nil, true)
    run(label, "gqa", gqa, spec, "fp32", chunked, "ring", true)
  end
end
-- The post-training engine on the same meshes (fp32): the log-probs and
-- entropies (the vocab-parallel kernels, fsdp_cuda_token_logprobs_vocab_*;
-- cp's tokens gathered) within 1e-5 absolute of one GPU rank's, 0 at the
-- ignored targets, and 3 GRPO steps' losses and grad norms within 1e-5
-- relative, as tests/lua/test_tp.lua holds them on CPU ranks.
local function engine_run(cfg, spec)
  local shard, mesh, tpc, cpc = solo_mesh:group("dp_shard"), nil, nil, nil
  if spec then
    mesh = fsdp.mesh(spec, { device = "cuda" })
    local dims = {}
    for _, d in ipairs(spec) do dims[d[1]] = d[2] end
    tpc, cpc = dims.tp and mesh:group("tp"), dims.cp and mesh:group("cp")
    shard = mesh:group(cpc and "dp_shard,cp" or "dp_shard")
  end
  local m = fsdp.fully_shard(llama.model(cfg, { tp = tpc and tpm.group(tpc), cp = cpc and tpm.group(cpc) }),
    { shard = shard, tp = tpc, units = llama.units, zero = 3, seed = 7 })
  local rnd = T.lcg(77)
  local b = { x = fsdp.tensor({ MB, SEQ }, "int32"), y = fsdp.tensor({ MB, SEQ }, "int32") }
  for i = 0, MB * SEQ - 1 do
    b.x:set(i, math.floor(rnd(2147483648) / 65536) % cfg.vocab_size)
    b.y:set(i, i % 7 == 3 and -100 or math.floor(rnd(2147483648) / 65536) % cfg.vocab_size)
  end
  local out = T.generate_then_grpo(fsdp, m, cfg, b, opt)
  if mesh then mesh:free() end
  return out
end
for _, mm in ipairs(meshes) do
  local cfg = llama.config(gqa)
  local got, want = engine_run(cfg, mm[2]), engine_run(cfg, nil)
  local said = T.engine_compare(got, want, MB * SEQ, "engine at " .. mm[1])
  local gsaid = T.generation_compare(got.gen, want.gen, cfg.vocab_size, "generation at " .. mm[1])
  if R == 0 then print("  " .. said .. "; " .. gsaid) end
end

local st = fsdp.memory_stats("cuda")
check(st.peak > 0, "the CUDA pool served the runs")
solo_mesh:free()
T.finish()
