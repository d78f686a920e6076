-- Argo CD health check for longctx.dev/LongContextDeployment.
-- Register it in argocd-cm under the key
--   resource.customizations.health.longctx.dev_LongContextDeployment
-- (docs/gitops.md), or copy it to Argo CD's
--   resource_customizations/longctx.dev/LongContextDeployment/health.lua
--
-- Reads only what the operator writes to status: observedGeneration, phase and the
-- conditions CapacityPlanned, Accepted, PrefillReady, DecodeReady, RouterReady,
-- Degraded, Ready and Progressing.
--   Healthy      Ready=True for the current generation
--   Degraded     the spec was refused (phase Refused, CapacityPlanned=False or
--                Accepted=False) or Degraded=True (an engine is crash-looping)
--   Progressing  no status yet, status of an older generation, or rolling out
local hs = {}

local function conditionsByType(status)
  local byType = {}
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type ~= nil then
        byType[c.type] = c
      end
    end
  end
  return byType
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.message
  if text == nil or text == "" then
    text = fallback
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason .. ": " .. text
  end
  return text
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local function isFalse(c)
  return c ~= nil and c.status == "False"
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the longctx operator to report a status"
  return hs
end

local status = obj.status
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the longctx operator to observe generation " .. tostring(generation)
  return hs
end

local conds = conditionsByType(status)

-- A spec the operator refused: the last accepted children keep running, but the
-- desired state in Git is not what runs. Degraded, with the planner's explanation.
if status.phase == "Refused" or isFalse(conds["CapacityPlanned"]) or isFalse(conds["Accepted"]) then
  hs.status = "Degraded"
  local refusal = conds["CapacityPlanned"]
  if not isFalse(refusal) then
    refusal = conds["Accepted"]
  end
  if not isFalse(refusal) then
    refusal = conds["Ready"]
  end
  hs.message = describe(refusal, "The operator refused this spec")
  return hs
end

if isTrue(conds["Degraded"]) or status.phase == "Degraded" then
  hs.status = "Degraded"
  hs.message = describe(conds["Degraded"], "An engine is failing")
  return hs
end

if isTrue(conds["Ready"]) then
  hs.status = "Healthy"
  hs.message = describe(conds["Ready"], "Ready")
  return hs
end

hs.status = "Progressing"
if isTrue(conds["Progressing"]) then
  hs.message = describe(conds["Progressing"], "Rolling out")
else
  hs.message = describe(conds["Ready"], "Waiting for prefill, decode and router to become ready")
end
return hs
