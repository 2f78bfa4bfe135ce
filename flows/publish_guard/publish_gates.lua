-- tokenlake publish guard: a lakeFS pre-merge hook (Lua 5.2, as lakeFS embeds it).
--
-- A merge into the guarded branch (main) passes only when it records, for exactly the commit
-- being merged, that every stage gate of the curate flow passed, and the stage reports at that
-- commit agree. The curate flow's publish writes this record in the merge commit's metadata
-- (flows/wap.py): lakeFS's Lua runtime cannot read another commit's metadata, so the merge
-- carries the gates read from the stage commits of the run it merges:
--
--   input_commit   the merged commit (lakeFS: action.source_ref)
--   gate           "passed": the flow's publish gates (min_documents, min_tokens, ...) held
--   gates          JSON {"<stage>": "passed" | "failed" | "disabled"}, each stage commit's `gate`
--
-- and each gated stage's reports/<stage>.json at the merged commit says its Great Expectations
-- suites passed (expectations.success). args.gated_stages names the stages that must pass.
local json = require("encoding/json")
local lakefs = require("lakefs")
local hook = require("hook")

local meta = action.commit.metadata or {}
local source = action.source_ref
local problems = {}

local function problem(text)
  problems[#problems + 1] = text
end

if meta.input_commit ~= source then
  problem("its metadata does not name the merged commit " .. source .. " as the one whose gates passed"
    .. " (input_commit is " .. tostring(meta.input_commit) .. ")")
end
if meta.gate ~= "passed" then
  problem("the curate flow's publish gates are not recorded as passed (gate is " .. tostring(meta.gate) .. ")")
end

local gates = {}
if meta.gates ~= nil then
  local ok, parsed = pcall(json.unmarshal, meta.gates)
  if ok and type(parsed) == "table" then
    gates = parsed
  else
    problem("its gates metadata is not a JSON object")
  end
end

for _, stage in ipairs(args.gated_stages or {}) do
  local state = gates[stage]
  if state ~= "passed" then
    problem("the " .. stage .. " gate is " .. (state or "not recorded"))
  else
    local path = "reports/" .. stage .. ".json"
    local code, body = lakefs.get_object(action.repository_id, source, path)
    if code ~= 200 then
      problem(path .. " is missing at the merged commit (HTTP " .. tostring(code) .. ")")
    else
      local ok, report = pcall(json.unmarshal, body)
      local expectations = ok and type(report) == "table" and report.expectations or nil
      if type(expectations) ~= "table" or expectations.success ~= true then
        problem(path .. " at the merged commit does not record passed expectations")
      end
    end
  end
end

if #problems > 0 then
  hook.fail("merge into " .. action.branch_id .. " refused by the tokenlake publish guard: "
    .. table.concat(problems, "; ")
    .. ". Only a curate run whose every gate passed publishes to " .. action.branch_id
    .. " (tokenlake curate).")
end
