-- Argo CD health check for inferencepools.kvfleet.io (InferencePool).
-- Install it under resource.customizations.health.kvfleet.io_InferencePool in argocd-cm.
-- It reads the kstatus-style status the operator writes: observedGeneration and the
-- Ready / Progressing / Degraded / ScalingLimited conditions, and status.rollout during a
-- canary or blue-green rollout (Ready stays True then, so the rollout is checked first).
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

-- "canary step 2/3, 25% of new requests to revision abcdef0123", from status.rollout.
local function rollout_text()
  local r = obj.status.rollout
  if type(r) ~= "table" then
    return nil
  end
  local parts = {}
  if type(r.step) == "number" and r.step > 0 then
    local step = (r.strategy or "rollout") .. " step " .. r.step
    if type(r.numSteps) == "number" and r.numSteps > 0 then
      step = step .. "/" .. r.numSteps
    end
    table.insert(parts, step)
  end
  if type(r.weight) == "number" then
    local to = "the new revision"
    if type(r.canaryRevision) == "string" and r.canaryRevision ~= "" then
      to = "revision " .. r.canaryRevision
    end
    table.insert(parts, r.weight .. "% of new requests to " .. to)
  end
  if #parts == 0 then
    return nil
  end
  return table.concat(parts, ", ")
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
-- A canary or blue-green rollout under way (the stable revision keeps Ready True): Argo's
-- convention is Progressing, and Suspended for a paused rollout.
if progressing ~= nil and progressing.status == "True" and
    (progressing.reason == "RolloutInProgress" or progressing.reason == "RolloutPaused") then
  if progressing.reason == "RolloutPaused" then
    hs.status = "Suspended"
  else
    hs.status = "Progressing"
  end
  local where = rollout_text()
  hs.message = say(progressing)
  if where ~= nil then
    hs.message = where .. " (" .. hs.message .. ")"
  end
  return hs
end
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
