-- fsdp.cp_ring: attention over a cp group as a ring (train.cp_attention =
-- "ring"; docs/SHARDING.md, "Parallelism"), the other way from fsdp.cp's
-- all-gather of the whole sequence's keys and values.
--
-- Rank r holds chunks r and 2P-1-r of the sequence (fsdp.cp.chunk) and
-- its keys and values of them. In P steps each rank's block of keys and
-- values travels once round the ring (comm:shift to the next rank, from
-- the one before), so that at step s rank r holds rank (r - s) mod P's.
-- The queries attend to each block as it passes, with the block's
-- visibility as query positions (fsdp.cp.block_positions: the causal load
-- balance makes it causal, a first chunk seen by all, or a block seen by
-- the second chunk alone). Each step's output and log-sum-exp merge into the running ones
-- (ops.attention_merge). The backward sends the blocks round again; with
-- the whole output and log-sum-exp each step's gradients are exact
-- shares, and a block's key and value gradients travel with it, summed on
-- the way, until one last shift brings them home.
--
-- Next to the all-gather it keeps only this rank's keys and values for the
-- backward (the all-gather keeps the whole sequence's: P times as much per
-- layer), and each step's shift runs while the step's attention computes
-- (the comm's worker thread on CPU ranks, its stream on a GPU); it sends
-- as much forward and about twice as much backward (the gradients go round
-- too). bench/parallel_layouts.sh measures the two side by side.
local tensor = require "fsdp.tensor"
local autograd = require "fsdp.autograd"
local ops = require "fsdp.ops"
local tpm = require "fsdp.tp"
local cp = require "fsdp.cp"

local M = {}

local function counting() return tensor.is_counting() end

-- whose block step s holds: rank (r - s)'s (s = 0: its own)
local function source(l, s) return (l.g.rank - s) % l.g.size end

-- Starts a shift of x to the next rank; returns what arrives from the one
-- before (read it after finish). In flight with whatever the caller
-- computes meanwhile.
local function shift(g, x)
  local y = tensor.new(x.shape, x.dtype, x.device)
  cp.sent.shift = cp.sent.shift + x:numel() * x.esize
  if not counting() then g.comm:shift(y, x, 1) end
  return y
end

-- Before shifts: what they send is ready (GPU: the comm's stream waits
-- for the compute stream). After: what they brought is (CPU: the comm's
-- worker is waited for; GPU: the compute stream waits for the comm's).
local function begin(g, device) if not counting() then tpm.start(g, device) end end
local function finish(g, device) if not counting() then tpm.done(g, device) end end

-- The block of keys and values step s holds, sent on to the next rank
-- (but at the last step): what arrives from the one before
local function pass_on(g, dev, s, ck, cv)
  if s == g.size - 1 then return nil, nil end
  begin(g, dev)
  return shift(g, ck), shift(g, cv)
end

-- out {B, Tl, nh * hd}, lse {B, nh, Tl} of queries q {B, Tl, nh * hd}
-- against the whole sequence's keys and values, of which this rank holds
-- k, v {B, Tl, nkv * hd} (its chunks, at their positions); l: the cp
-- layout (fsdp.cp.layout with ring positions)
function M.forward(l, q, k, v, B, Tl, nh, nkv, hd)
  local g, dev = l.g, q.device
  local P = g.size
  local out, lse = ops.like(q, { B, Tl, nh * hd }), tensor.new({ B, nh, Tl }, "fp32", dev)
  local po, pl = ops.like(out), tensor.new(lse.shape, "fp32", dev)
  local ck, cv = k, v -- the block held at this step (s = 0: the caller's own)
  for s = 0, P - 1 do
    local nk, nv = pass_on(g, dev, s, ck, cv)
    if not counting() then cp.attend_block(l, source(l, s), s == 0, out, lse, po, pl, q, ck, cv, B, Tl, nh, nkv, hd) end
    if nk then finish(g, dev) end -- (the next block is here; this one was sent)
    if s > 0 then
      autograd.consume(ck)
      autograd.consume(cv)
    end
    ck, cv = nk, nv
  end
  autograd.consume(po)
  autograd.consume(pl)
  return out, lse
end

-- dq {B, Tl, nh * hd} and this rank's dk, dv {B, Tl, nkv * hd} from dout
-- and what forward took and gave
function M.backward(l, dout, q, k, v, out, lse, B, Tl, nh, nkv, hd)
  local g, dev = l.g, q.device
  local P = g.size
  local dq = ops.like(q)
  local dqs, dks, dvs = ops.like(q), ops.like(k), ops.like(v)
  local ck, cv = k, v -- the block held at this step
  local ak, av        -- its gradients so far: (s = 0) this rank's, else arrived with it
  local sk, sv        -- the gradients the last shift sent on (read until the next finish)
  for s = 0, P - 1 do
    local nk, nv = pass_on(g, dev, s, ck, cv)
    if s == 0 then ak, av = ops.like(k), ops.like(v) end
    if not counting() then -- (s = 0: straight into this block's gradients so far)
      local dkb, dvb = s == 0 and ak or dks, s == 0 and av or dvs
      cp.attend_block_backward(l, source(l, s), s == 0, dq, dqs, dkb, dvb, dout, q, ck, cv, out, lse, B, Tl, nh, nkv, hd)
    end
    finish(g, dev) -- (the next block and this one's gradients so far are here)
    if sk then
      autograd.consume(sk)
      autograd.consume(sv)
    end
    if s > 0 then
      if not counting() then
        ops.add(ak, ak, dks)
        ops.add(av, av, dvs)
      end
      autograd.consume(ck)
      autograd.consume(cv)
    end
    -- the gradients go on with their block (after the last step: home)
    begin(g, dev)
    sk, sv = ak, av
    ak, av = shift(g, sk), shift(g, sv)
    ck, cv = nk, nv
  end
  finish(g, dev)
  autograd.consume(sk)
  autograd.consume(sv)
  autograd.consume(dqs)
  autograd.consume(dks)
  autograd.consume(dvs)
  return dq, ak, av
end

return M
