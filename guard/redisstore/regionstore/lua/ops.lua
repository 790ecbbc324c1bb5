-- ops.lua: the operations of a region's share ledger (regions.Store and
-- Ledger.Admit) on one counter, each one atomic EVALSHA. Appended to
-- ledger.lua and fixed.lua to form the script. Only fixed windows so far.
--
-- Time: every operation takes the caller's clock (ARGV[2]), in Unix µs, as
-- regions.Ledger takes it; the script never reads Redis TIME. Production
-- callers pass the region's one clock (the one its gateways admit by).
--
-- KEYS[1]  the counter's ledger hash (ledger.lua)
-- ARGV[1]  op: admit, give, receive, state, inspect, active
-- ARGV[2]  now, Unix µs
-- ARGV[3]  expiry margin, ms, added to the hash's expiry
-- ARGV[4]  the limit, "<kind>:<units>:<window µs>" (kind 1: fixed window);
--          inspect and active read the one stored instead
-- ARGV[5]  the region's static share of the limit
-- ARGV[6]  the skew bound K, µs
-- then per op:
--   admit    ARGV[7] cost
--            -> {'ok', allowed 1/0, remaining, retry after µs}
--   give     ARGV[7] loan id, [8] to, [9] units asked, [10] first window,
--            [11] last window, [12] extend 1/0, [13] keep (units over a
--            window), [14] keep prorated to what is left of now's window
--            -> {'ok', units given (0: none), first, last, refusal reason}
--   receive  ARGV[7] loan id, [8] from, [9] units, [10] first, [11] last
--            -> {'ok', applied 1/0, refusal reason}
--   state    -> {'ok', share, used, then per loan given and still held:
--               id, to, units, first, last}
--   inspect  nothing written, static share not added (ARGV[5] unused)
--            -> {'none'} for a counter it does not hold, else {'ok', limit,
--               then per window counted at now: window, share less the
--               static share, used}
--   active   -> {'ok', holds loans 1/0, limit ('' for no counter)}
-- Errors are replies too: {'mismatch', stored limit} when the counter
-- holds another limit (nothing changed), {'invalid', message} for a loan
-- that contradicts the one recorded under its id.
-- Every op but inspect and active creates the counter with ARGV[4] when
-- it is new (as the Ledger does), and prunes what can no longer count.

local op = ARGV[1]
local key = KEYS[1]
local now = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])
local lim = ARGV[4]
local S = tonumber(ARGV[5])
local K = tonumber(ARGV[6])

local function window_of(l)
  local _, _, w = string.match(l, '^(%d+):(%d+):(%d+)$')
  return tonumber(w)
end

local st = rg_load(key)

if op == 'inspect' then
  if not st.lim then
    return { 'none' }
  end
  local W = window_of(st.lim)
  local out = { 'ok', st.lim }
  for _, j in ipairs(fw_charged(W, K, now)) do
    out[#out + 1] = j
    out[#out + 1] = fw_share(st, 0, j)
    out[#out + 1] = st.n[j] or 0
  end
  return out
end

if op == 'active' then
  if not st.lim then
    return { 'ok', 0, '' }
  end
  local W = window_of(st.lim)
  if fw_prune(st, W, K, now) then
    rg_save(key, st, now, margin, fw_needed(W, K))
  end
  local holds = 0
  if next(st.outs) or next(st.ins) then
    holds = 1
  end
  return { 'ok', holds, st.lim }
end

if st.lim and st.lim ~= lim then
  return { 'mismatch', st.lim }
end
local W = window_of(lim)
local dirty = false
if not st.lim then
  st.lim = lim
  dirty = true
end
if fw_prune(st, W, K, now) then
  dirty = true
end
local function done(reply)
  if dirty then
    rg_save(key, st, now, margin, fw_needed(W, K))
  end
  return reply
end

local cur = rg_fdiv(now, W)

if op == 'admit' then
  local cost = tonumber(ARGV[7])
  local ws = fw_charged(W, K, now)
  local room = math.huge
  for _, j in ipairs(ws) do
    local r = fw_share(st, S, j) - (st.n[j] or 0)
    if r < room then
      room = r
    end
  end
  local allowed, retry = 0, 0
  if room >= cost then
    allowed = 1
    if cost > 0 then
      for _, j in ipairs(ws) do
        st.n[j] = (st.n[j] or 0) + cost
      end
      dirty = true
    end
    room = room - cost
  else
    retry = fw_retry(st, S, W, K, cost, now)
    if now + retry > st.promise then
      st.promise = now + retry
      dirty = true
    end
  end
  if room < 0 then
    room = 0
  end
  return done({ 'ok', allowed, room, retry })
end

if op == 'give' then
  local id, to = ARGV[7], ARGV[8]
  local units, first, last = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local extend = ARGV[12] == '1'
  local keep, kcur = tonumber(ARGV[13]), tonumber(ARGV[14])
  local rec = st.outs[id]
  if rec then
    if rec.who ~= to then
      return done({ 'invalid', 'loan ' .. id .. ' went to "' .. rec.who .. '", not "' .. to .. '"' })
    end
    local reason = ''
    if last <= rec.last and units <= rec.units then
      reason = ''
    elseif now < st.promise then
      reason = 'promised'
    elseif last > rec.last then
      local lo = math.max(rec.last + 1, rg_fdiv(now - K, W))
      if fw_minroom(st, S, lo, last, cur, keep, kcur) < rec.units then
        reason = 'nothing'
      else
        rec.last = last
        dirty = true
      end
    end
    return done({ 'ok', rec.units, rec.first, rec.last, reason })
  end
  if extend then
    return done({ 'ok', 0, first, last, 'unknown' })
  end
  if now < st.promise then
    return done({ 'ok', 0, first, last, 'promised' })
  end
  local f = math.max(first, rg_fdiv(now - K, W))
  if f > last then
    return done({ 'ok', 0, first, last, 'past' })
  end
  local spare = fw_minroom(st, S, f, last, cur, keep, kcur)
  if spare < units then
    units = spare
  end
  if units <= 0 then
    return done({ 'ok', 0, f, last, 'nothing' })
  end
  st.outs[id] = { who = to, units = units, first = f, last = last, at = now }
  dirty = true
  return done({ 'ok', units, f, last, '' })
end

if op == 'receive' then
  local id, from = ARGV[7], ARGV[8]
  local units, first, last = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  if units == 0 then
    return done({ 'ok', 0, 'nothing' })
  end
  local rec = st.ins[id]
  if rec then
    if rec.who ~= from or rec.first ~= first or rec.units ~= units then
      return done({ 'invalid', 'loan ' .. id .. ' was ' .. rg_fmt(rec.units) .. ' units from "' .. rec.who ..
        '" from slot ' .. rg_fmt(rec.first) })
    end
    if last <= rec.last then
      return done({ 'ok', 0, '' })
    end
    rec.last = last
    dirty = true
    return done({ 'ok', 1, '' })
  end
  if now >= (last + 1) * W + K then
    return done({ 'ok', 0, 'expired' })
  end
  st.ins[id] = { who = from, units = units, first = first, last = last, at = now }
  dirty = true
  return done({ 'ok', 1, '' })
end

if op == 'state' then
  local share, used = fw_share(st, S, cur), st.n[cur] or 0
  if share < 0 then
    share = 0
  end
  if used < 0 then
    used = 0
  end
  local out = { 'ok', share, used }
  for id, o in pairs(st.outs) do
    out[#out + 1] = id
    out[#out + 1] = o.who
    out[#out + 1] = o.units
    out[#out + 1] = o.first
    out[#out + 1] = o.last
  end
  return done(out)
end

return { 'invalid', 'unknown op ' .. tostring(op) }
