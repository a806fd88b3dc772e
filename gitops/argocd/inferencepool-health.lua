-- Argo CD health check for inferencepools.kvfleet.io (InferencePool).
-- Install it under resource.customizations.health.kvfleet.io_InferencePool in argocd-cm.
-- It reads the kstatus-style status the operator writes: observedGeneration and the
-- Ready / Progressing / Degraded / ScalingLimited conditions.
local hs = {}

local function condition(name)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == name then
      return c
    end
  end
  return nil
end

local function say(c)
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local generation = (obj.metadata and obj.metadata.generation) or 0
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the kvfleet operator to report status"
  return hs
end
local observed = obj.status.observedGeneration or 0
if observed < generation then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. generation ..
    " (status is for " .. observed .. ")"
  return hs
end

local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = say(degraded)
  return hs
end

local ready = condition("Ready")
local progressing = condition("Progressing")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = say(ready)
  local limited = condition("ScalingLimited")
  if limited ~= nil and limited.status == "True" then
    hs.message = hs.message .. " (scaling limited: " .. say(limited) .. ")"
  end
  return hs
end
if ready == nil or (progressing ~= nil and progressing.status == "True") then
  hs.status = "Progressing"
  hs.message = (ready ~= nil and say(ready)) or "waiting for the Ready condition"
  return hs
end
-- Not ready and no longer making progress: stalled.
hs.status = "Degraded"
hs.message = "stalled: " .. say(ready)
return hs
