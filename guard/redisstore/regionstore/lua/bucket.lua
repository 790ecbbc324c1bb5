-- bucket.lua: the bucket arithmetic of regions.Ledger (kind 3: token
-- bucket and GCRA), for a capacity share S refilling in W µs (a share of s
-- units refills at s/W per µs), loans counted in periods, sharing
-- sliding.lua's loan functions (sw_own, sw_validity, sw_share, sw_loans_end
-- with sw.R = sw.F = 0). The hash holds the tokens × W in field k
-- (st.tok) as of the time in field s (st.ts); a new counter starts full.
--
-- bk_settle(st, now)  brings the tokens to now: refilled at the share's
--                     rate, never above its capacity, through every change
--                     of the share since the last settle (Ledger.settle)
-- bk_retry(st, cost, now)  the wait until the tokens reach cost at the
--                     rate the region is sure of (Ledger.retryBucket)
-- bk_prune(st, now)   settles, then drops loans that no longer count
-- bk_needed(st)       the last moment the counter may differ from a new one
-- rg_tdiv(x, y)       x / y truncated toward zero (Go's integer division)

local function rg_tdiv(x, y)
  if x >= 0 then
    return fdiv(x, y)
  end
  return -fdiv(-x, y)
end

-- bk_eff is the capacity at t: the share, or 0 while loans made under
-- another limit hold more of the region's units than its share.
local function bk_eff(st, t)
  return math.max(sw_share(st, t, t), 0)
end

-- the times in (from, to) at which the share may change by itself.
local function bk_breaks(st, from, to)
  local ts, seen = {}, {}
  local function add(t)
    if from < t and t < to and not seen[t] then
      seen[t] = true
      ts[#ts + 1] = t
    end
  end
  for _, o in pairs(st.outs) do
    add(o.at)
    add(sw_regain(o))
  end
  for _, r in pairs(st.ins) do
    local a, b = sw_validity(r)
    add(a)
    add(b)
  end
  table.sort(ts)
  return ts
end

local function bk_settle(st, now)
  if now <= st.ts then
    -- the tokens above the capacity go (it fell at this instant: a
    -- limit cut)
    st.tok = math.min(st.tok, bk_eff(st, now) * sw.W)
    return false
  end
  local W = sw.W
  local t = st.ts
  local bs = bk_breaks(st, st.ts, now)
  bs[#bs + 1] = now
  for _, b in ipairs(bs) do
    local e = bk_eff(st, t)
    st.tok = math.min(st.tok, e * W)
    if b - t >= W then
      st.tok = e * W
    else
      st.tok = math.min(st.tok + e * (b - t), e * W)
    end
    t = b
  end
  st.tok = math.min(st.tok, bk_eff(st, now) * W)
  st.ts = now
  return true
end

local function bk_retry(st, cost, now)
  local W = sw.W
  local need = cost * W
  local tok, t = st.tok, now
  local ends = {}
  for _, r in pairs(st.ins) do
    local _, to = sw_validity(r)
    if to > now then
      ends[#ends + 1] = to
    end
  end
  table.sort(ends)
  ends[#ends + 1] = math.huge
  for _, b in ipairs(ends) do
    local e = sw_share(st, now, t)
    local capa = e * W
    tok = math.min(tok, capa)
    if capa < need or e == 0 then
      if b == math.huge then
        break
      end
    else
      local dt = rg_tdiv(need - tok + e - 1, e)
      if t + dt < b then
        return t + dt - now
      end
      tok = math.min(tok + e * (b - t), capa)
      t = b
    end
  end
  return W
end

local function bk_prune(st, now)
  local settled = bk_settle(st, now)
  local dropped = sw_prune_loans(st, now)
  return settled or dropped
end

-- A bucket is as a new one once every loan is gone and a whole W has
-- passed since the last change of its share and its last settle: then it
-- is full at its static share.
local function bk_needed(st)
  return math.max(st.promise, sw_loans_end(st, st.ts) + sw.W)
end
