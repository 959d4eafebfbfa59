-- fsdp.binding: how a module reaches its weights, the one protocol every
-- binder follows. A module's ops read
--   m.bound[name]    its parameter `name` (a float * on CPU ranks, the
--                    compute dtype's void * on a GPU),
--   m.grad[name]     where that parameter's gradient accumulates (backward),
--   m.act_dtype      the dtype its activations are made in on a GPU,
-- and m.flush lists what must be added elsewhere once its backward is done
-- (fp32 staging of bf16 grads on CPU ranks). m.shares names the module
-- whose weights it computes with (a tied head): it is bound as that one.
-- Who binds: fully_shard's hooks (views into a unit's full buffers,
-- fsdp.unit_hooks), the planner's dry run (nothing: meta tensors, no op
-- reads a pointer, fsdp.dry_run), and a model held whole for generation
-- (fsdp.inference). A tensor-parallel slice binds the same fields.
local M = {}

-- m's weights: params {name = pointer}, grads {name = pointer} or nil (no
-- backward), the activations' dtype, flush (a list, or nil)
function M.bind(m, params, grads, act_dtype, flush)
  m.bound, m.grad, m.act_dtype, m.flush = params, grads or {}, act_dtype, flush
end

-- a module computing with another's weights (m.shares) reads that one's
function M.share(m)
  local o = m.shares
  m.bound, m.grad, m.act_dtype = o.bound, o.grad, o.act_dtype
end

-- one parameter bound (a binder that places them one at a time)
function M.bind_one(m, name, pointer, act_dtype)
  m.bound = m.bound or {}
  m.bound[name] = pointer
  m.act_dtype = act_dtype
end

-- What m holds now, and putting it back (a dry run binds nothing for a
-- while and leaves the modules as it found them)
function M.save(m) return { bound = m.bound, grad = m.grad, act_dtype = m.act_dtype, flush = m.flush } end
function M.restore(m, was) m.bound, m.grad, m.act_dtype, m.flush = was.bound, was.grad, was.act_dtype, was.flush end

-- the module's owner of weights (itself, or the one it shares with)
function M.owner(m) return m.shares or m end

return M
