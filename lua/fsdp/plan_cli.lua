-- fsdp.plan_cli: the command line of `fsdp plan` (launcher/fsdp_main.c
-- calls cli), and the options it shares with `fsdp repl` (parse_args).
local recipe = require "fsdp.recipe"
local planner = require "fsdp.planner"
local plan_render = require "fsdp.plan_render"

local M = {}

-- `fsdp plan RECIPE.lua --world W [--mesh SPEC] [--json] [section.field=value ...]`
M.usage = [[usage: fsdp plan RECIPE.lua [--world W] [--mesh dp_outer=R,dp_shard=S,cp=C,tp=P] [--json] [section.field=value ...]
Builds the recipe's model (nothing is allocated, nothing launched), groups it into units by its policy and
prints, per rank: the resident bytes of params, main params, optimizer state and grads, the full-unit buffer
pools and how many buffers are live at once, the activations of a step (one micro-batch of the model run on a
counting device: shapes and bytes, no memory, no work), the peak, the
communication per step of each group (dp, cp, tp), a table of units and the elements each rank owns. --json
prints the same as JSON. --world defaults to 1; --mesh overrides the recipe's mesh (dimensions in the order
dp_outer, dp_shard, cp, tp; docs/SHARDING.md, "Parallelism").]]

-- The options `fsdp plan` and `fsdp repl` share: [RECIPE] --world W
-- --mesh SPEC [--json] section.field=value...; who names the command in
-- errors, usage follows them. Returns {path, world, mesh, json, over, help}.
function M.parse_args(args, who, allow_json, usage)
  usage = usage or M.usage
  local o = { world = 1, over = {} }
  local i = 1
  while i <= #args do
    local a = args[i]
    local key, val = a:match("^(%-%-[%w-]+)=(.*)$")
    key = key or a
    if key == "--world" or key == "--mesh" then
      if not val then i = i + 1; val = args[i] end
      if val == nil then error(string.format("fsdp %s: %s needs a value\n%s", who, key, usage), 0) end
      if key == "--world" then
        o.world = tonumber(val)
        if not o.world then error(string.format("fsdp %s: --world needs a number\n%s", who, usage), 0) end
      else
        o.mesh = val
      end
    elseif key == "--json" and allow_json then o.json = true
    elseif key == "-h" or key == "--help" then o.help = true
    elseif a:sub(1, 2) == "--" then error(string.format("fsdp %s: unknown option '%s'\n%s", who, a, usage), 0)
    elseif not o.path then o.path = a
    else o.over[#o.over + 1] = a end
    i = i + 1
  end
  return o
end

function M.cli(args)
  local o = M.parse_args(args, "plan", true)
  if o.help then print(M.usage) return 0 end
  if not o.path then error("fsdp plan: which recipe?\n" .. M.usage, 0) end
  local p = planner.plan(recipe.load(o.path, o.over), { world = o.world, mesh = o.mesh, where = o.path })
  print(o.json and plan_render.json(p) or plan_render.render(p))
  return 0
end

return M
