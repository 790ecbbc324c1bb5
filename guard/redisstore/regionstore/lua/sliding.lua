-- sliding.lua: the sliding-window arithmetic of regions.Ledger (kind 2),
-- for a window of W µs, loans counted in periods of P µs, static share S
-- and skew bound K. Loans and the promise live in the ledger hash
-- (ledger.lua); the admissions over the trailing window live in a list
-- (KEYS[2]), oldest first, one "<time>:<cost>" entry per admission, and
-- their sum in the hash's field u (st.used).
--
-- sw_regain(o)        when the giver counts a lent loan's units again:
--                     the end of its last period + K (+ W: sw.R)
-- sw_validity(r)      when a received loan counts: from max(received,
--                     start of its first period + K) to the end of its
--                     last period − K
-- sw_forget(r)        when the receiver may drop a loan's record
-- sw_own(st, now)     the static share less the loans given at or before
--                     now that are not back yet
-- sw_share(st, now, t) the share at t >= now as far as the region is sure
--                     of it at now: its own share at now and the received
--                     loans that count from now through t (Ledger.sureShare;
--                     at t = now, the share now)
-- sw_loans_end(st, t) the later of t and the last moment a loan of the
--                     counter still counts for giver or receiver
-- sw_prune(st, log, now) drops loans that no longer count and admissions
--                     that slid out (from the list); true when it did
-- sw_retry(st, log, cost, now) the wait until enough has slid out for cost
--                     to fit the share the region is sure of
-- sw_needed(st)       the last moment anything of the counter can count
--
-- Every function reads the limit's figures from the table sw (set by
-- ops.lua): sw.S, sw.W, sw.P, sw.K, and sw.R and sw.F, what a sliding
-- window adds to the giver's regain (W) and to the receiver's forgetting
-- (W + K); buckets (bucket.lua) share the loan functions with both 0.

local sw = {}

local function sw_regain(o)
  return (o.last + 1) * sw.P + sw.K + sw.R
end

local function sw_validity(r)
  return math.max(r.at, r.first * sw.P + sw.K), (r.last + 1) * sw.P - sw.K
end

local function sw_forget(r)
  return (r.last + 1) * sw.P + sw.K + sw.F
end

local function sw_own(st, now)
  local s = sw.S
  for _, o in pairs(st.outs) do
    if o.at <= now and now < sw_regain(o) then
      s = s - o.units
    end
  end
  return s
end

local function sw_share(st, now, t)
  local s = sw_own(st, now)
  for _, r in pairs(st.ins) do
    local from, to = sw_validity(r)
    if from <= now and t < to then
      s = s + r.units
    end
  end
  return s
end

local function sw_entry(v)
  local t, c = string.match(v, '^(%-?%d+):(%d+)$')
  return tonumber(t), tonumber(c)
end

-- sw_prune_loans drops the loans given that the giver has regained and
-- the loans received that can no longer count (sliding windows and
-- buckets alike); it reports whether it dropped any.
local function sw_prune_loans(st, now)
  local dropped = false
  for id, o in pairs(st.outs) do
    if now >= sw_regain(o) then
      st.outs[id] = nil
      dropped = true
    end
  end
  for id, r in pairs(st.ins) do
    if now >= sw_forget(r) then
      st.ins[id] = nil
      dropped = true
    end
  end
  return dropped
end

local function sw_prune(st, log, now)
  local dropped = sw_prune_loans(st, now)
  while true do
    local v = redis.call('LINDEX', log, 0)
    if not v then
      break
    end
    local t, c = sw_entry(v)
    if t > now - sw.W then
      break
    end
    redis.call('LPOP', log)
    st.used = st.used - c
    dropped = true
  end
  return dropped
end

-- Admissions at one time slide out together: the wait is to the moment
-- the last of them slides out.
local function sw_retry(st, log, cost, now)
  local entries = redis.call('LRANGE', log, 0, -1)
  local u = st.used
  for i = 1, #entries do
    local t, c = sw_entry(entries[i])
    u = u - c
    local same = false
    if i < #entries then
      local t2 = sw_entry(entries[i + 1])
      same = t2 == t
    end
    if not same then
      local at = t + sw.W
      if sw_share(st, now, at) - u >= cost then
        return at - now
      end
    end
  end
  return sw.W
end

local function sw_loans_end(st, t)
  for _, o in pairs(st.outs) do
    t = math.max(t, sw_regain(o))
  end
  for _, r in pairs(st.ins) do
    t = math.max(t, sw_forget(r))
  end
  return t
end

local function sw_needed(log)
  return function(st)
    local t = sw_loans_end(st, st.promise)
    local v = redis.call('LINDEX', log, -1)
    if v then
      local at = sw_entry(v)
      t = math.max(t, at + sw.W)
    end
    return t
  end
end
