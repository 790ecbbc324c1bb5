-- ops.lua: the operations of a region's share ledger (regions.Store and
-- Ledger.Admit) on one counter, each one atomic EVALSHA. Appended to
-- ledger.lua, fixed.lua, sliding.lua and bucket.lua to form the script.
-- Kinds: 1 fixed window, 2 sliding window, 3 bucket (token bucket, GCRA).
--
-- Time: every operation takes the caller's clock (ARGV[2]), in Unix µs, as
-- regions.Ledger takes it; the script never reads Redis TIME. Production
-- callers pass the region's one clock (the one its gateways admit by).
--
-- KEYS[1]  the counter's ledger hash (ledger.lua)
-- KEYS[2]  the counter's admissions over the trailing window (sliding
--          windows; sliding.lua), same hash tag
-- ARGV[1]  op: admit, give, receive, state, inspect, active
-- ARGV[2]  now, Unix µs
-- ARGV[3]  expiry margin, ms, added to the keys' expiry
-- ARGV[4]  the limit, "<kind>:<units>:<window µs>"; inspect and active
--          read the one stored instead
-- ARGV[5]  the region's static share of the limit, kept when the counter
--          is made (the one kept is used after)
-- ARGV[6]  the skew bound K, µs
-- ARGV[7]  the period P, µs (the slots of sliding windows' and buckets'
--          loans)
-- then per op:
--   admit    ARGV[8] cost
--            -> {'ok', allowed 1/0, remaining, retry after µs}
--   give     ARGV[8] loan id, [9] to, [10] units asked, [11] first slot,
--            [12] last slot, [13] extend 1/0, [14] keep (units over a
--            window), [15] keep prorated to what is left of now's window
--            (fixed windows)
--            -> {'ok', units given (0: none), first, last, refusal reason}
--   receive  ARGV[8] loan id, [9] from, [10] units, [11] first, [12] last
--            -> {'ok', applied 1/0, refusal reason}
--   state    -> {'ok', share, used, then per loan given and still held:
--               id, to, units, first, last}
--   inspect  nothing written
--            -> {'none'} for a counter it does not hold, else {'ok', limit,
--               then, fixed window, per window counted at now: window,
--               share, used; otherwise the share}
--   active   -> {'ok', holds loans 1/0, limit ('' for no counter)}
-- Errors are replies too: {'mismatch', stored limit} when the counter
-- holds another limit (nothing changed), {'invalid', message} for a loan
-- that contradicts the one recorded under its id. An admit under a limit
-- of other units (the same kind and window), or a give under one to a
-- counter holding no loans, carries the counter over to it instead, as
-- the gateways' script does (rg_relimit): the loans made under the old
-- limit become void, and a give or a receive of a void loan is refused
-- with the reason 'limit'.
-- Every op but inspect and active creates the counter with ARGV[4] when
-- it is new (as the Ledger does), and prunes what can no longer count.

local op = ARGV[1]
local key, log = KEYS[1], KEYS[2]
local now = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])
local lim = ARGV[4]
local S = tonumber(ARGV[5])
local K = tonumber(ARGV[6])
local P = tonumber(ARGV[7])

local function parse_limit(l)
  local k, u, w = string.match(l, '^(%d+):(%d+):(%d+)$')
  return tonumber(k), tonumber(u), tonumber(w)
end

local st = rg_load(key)

-- The kind's pruning and expiry, for the limit l.
local kind, W
local function setup(l, static)
  local _
  kind, _, W = parse_limit(l)
  sw.S, sw.W, sw.P, sw.K = static, W, P, K
  sw.R, sw.F = 0, 0
  if kind == 2 then
    sw.R, sw.F = W, W + K
  end
end
local function prune()
  if kind == 1 then
    return fw_prune(st, W, K, now)
  elseif kind == 3 then
    return bk_prune(st, now)
  end
  return sw_prune(st, log, now)
end
local function save()
  if kind == 1 then
    rg_save(key, nil, st, now, margin, fw_needed(W, K))
  elseif kind == 3 then
    rg_save(key, nil, st, now, margin, bk_needed)
  else
    rg_save(key, log, st, now, margin, sw_needed(log))
  end
end

if op == 'inspect' then
  if not st.lim then
    return { 'none' }
  end
  setup(st.lim, st.static)
  local out = { 'ok', st.lim }
  if kind == 1 then
    for _, j in ipairs(fw_charged(W, K, now)) do
      out[#out + 1] = j
      out[#out + 1] = fw_share(st, st.static, j)
      out[#out + 1] = fw_used(st, j)
    end
  else
    out[#out + 1] = sw_share(st, now, now)
  end
  return out
end

if op == 'active' then
  if not st.lim then
    return { 'ok', 0, '' }
  end
  setup(st.lim, st.static)
  if prune() then
    save()
  end
  local holds = 0
  if next(st.outs) or next(st.ins) then
    holds = 1
  end
  return { 'ok', holds, st.lim }
end

-- holds_loans: whether a loan given or received still counts, or its
-- record is still needed (what prune keeps), without changing anything.
local function holds_loans()
  for _, o in pairs(st.outs) do
    if kind == 1 and now < (o.last + 1) * W + K or kind ~= 1 and now < sw_regain(o) then
      return true
    end
  end
  for _, r in pairs(st.ins) do
    if kind == 1 and now < (r.last + 1) * W + K or kind ~= 1 and now < sw_forget(r) then
      return true
    end
  end
  return false
end

-- An admission under a limit of other units (an override, a penalty,
-- the rule's limit changed) carries the ledger over to it, as the
-- gateways' script does; so does a give, when the ledger holds no loans
-- (a region whose gateways have not decided the counter since the
-- change). Every other op answers a mismatch.
local relimited = false
if (op == 'admit' or op == 'give') and st.lim and st.lim ~= lim then
  local k0, _, w0 = parse_limit(st.lim)
  local k1, _, w1 = parse_limit(lim)
  if k0 == k1 and w0 == w1 then
    setup(st.lim, st.static)
    if op == 'admit' or not holds_loans() then
      if k0 == 3 then
        -- the tokens up to now under the old limit: the new one counts
        -- from now on
        bk_settle(st, now)
      end
      rg_relimit(st, lim, S)
      relimited = true
    end
  end
end
if st.lim and st.lim ~= lim then
  return { 'mismatch', st.lim }
end
if not st.lim then
  st.static = S
end
S = st.static
setup(lim, S)
local dirty = relimited
if not st.lim then
  st.lim = lim
  if kind == 3 then
    st.tok, st.ts = S * W, now
  end
  dirty = true
end
if prune() then
  dirty = true
end
local function done(reply)
  if dirty then
    save()
  end
  return reply
end

-- eff is a sliding window's share at now.
local function eff()
  return sw_share(st, now, now)
end

local cur = fdiv(now, W)

if op == 'admit' then
  local cost = tonumber(ARGV[8])
  local room, allowed, retry = math.huge, 0, 0
  if kind == 1 then
    room = fw_room(st, S, W, K, now)
  elseif kind == 3 then
    -- tokens, scaled by W
    if st.tok >= cost * W then
      allowed = 1
      st.tok = st.tok - cost * W
      dirty = true
    else
      retry = bk_retry(st, cost, now)
      if now + retry > st.promise then
        st.promise = now + retry
        dirty = true
      end
    end
    return done({ 'ok', allowed, math.max(rg_tdiv(st.tok, W), 0), retry })
  else
    room = eff() - st.used
  end
  if room >= cost then
    allowed = 1
    if kind == 1 then
      if cost > 0 then
        local cj, q = fw_cell(W, K, now)
        fw_count(st, cj, q, cost)
      end
    else
      redis.call('RPUSH', log, ifmt(now) .. ':' .. ifmt(cost))
      st.used = st.used + cost
    end
    dirty = true
    room = room - cost
  else
    if kind == 1 then
      retry = fw_retry(st, S, W, K, cost, now)
    else
      retry = sw_retry(st, log, cost, now)
    end
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
  local id, to = ARGV[8], ARGV[9]
  local units, first, last = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  local extend = ARGV[13] == '1'
  local keep, kcur = tonumber(ARGV[14]), tonumber(ARGV[15])
  local rec = st.outs[id]
  if rec then
    if rec.void then
      return done({ 'ok', rec.units, rec.first, rec.last, 'limit' })
    end
    if rec.who ~= to then
      return done({ 'invalid', 'loan ' .. id .. ' went to "' .. rec.who .. '", not "' .. to .. '"' })
    end
    local reason = ''
    if last <= rec.last and units <= rec.units then
      reason = ''
    elseif now < st.promise then
      reason = 'promised'
    elseif kind == 1 then
      -- A fixed window's loan never grows in units: it only extends to
      -- windows that can spare all of them.
      if last > rec.last then
        local lo = math.max(rec.last + 1, fdiv(now - K, W))
        if fw_minroom(st, S, lo, last, cur, keep, kcur) < rec.units then
          reason = 'nothing'
        else
          rec.last = last
          dirty = true
        end
      end
    elseif now >= sw_regain(rec) then
      reason = 'past'
    else
      if last > rec.last then
        if sw_own(st, now) < keep then
          reason = 'nothing'
        else
          rec.last = last
          dirty = true
        end
      end
      if units > rec.units then
        local add
        if kind == 3 then
          add = math.min(units - rec.units, sw_own(st, now) - keep)
        else
          add = math.min(units - rec.units, sw_own(st, now), eff() - math.max(st.used, keep))
        end
        if add > 0 then
          rec.units = rec.units + add
          dirty = true
        else
          reason = 'nothing'
        end
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
  local spare
  if kind == 1 then
    local f = math.max(first, fdiv(now - K, W))
    if f > last then
      return done({ 'ok', 0, first, last, 'past' })
    end
    first = f
    spare = fw_minroom(st, S, f, last, cur, keep, kcur)
  else
    if now >= (last + 1) * P - K then
      return done({ 'ok', 0, first, last, 'past' })
    end
    if kind == 3 then
      spare = sw_own(st, now) - keep
    else
      spare = math.min(sw_own(st, now), eff() - math.max(st.used, keep))
    end
  end
  if spare < units then
    units = spare
  end
  if units <= 0 then
    return done({ 'ok', 0, first, last, 'nothing' })
  end
  st.outs[id] = { who = to, units = units, first = first, last = last, at = now }
  dirty = true
  return done({ 'ok', units, first, last, '' })
end

if op == 'receive' then
  local id, from = ARGV[8], ARGV[9]
  local units, first, last = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  if units == 0 then
    return done({ 'ok', 0, 'nothing' })
  end
  local rec = st.ins[id]
  if rec then
    if rec.void then
      return done({ 'ok', 0, 'limit' })
    end
    if rec.who ~= from or rec.first ~= first or kind == 1 and rec.units ~= units then
      return done({ 'invalid', 'loan ' .. id .. ' was ' .. ifmt(rec.units) .. ' units from "' .. rec.who ..
        '" from slot ' .. ifmt(rec.first) })
    end
    if kind ~= 1 then
      local _, to = sw_validity(rec)
      if now >= to then
        return done({ 'ok', 0, 'lapsed' })
      end
    end
    if last <= rec.last and units <= rec.units then
      return done({ 'ok', 0, '' })
    end
    -- Both only grow: a reordered older copy changes nothing.
    rec.last, rec.units = math.max(rec.last, last), math.max(rec.units, units)
    dirty = true
    return done({ 'ok', 1, '' })
  end
  if kind == 1 and now >= (last + 1) * W + K or kind ~= 1 and now >= (last + 1) * P - K then
    return done({ 'ok', 0, 'expired' })
  end
  st.ins[id] = { who = from, units = units, first = first, last = last, at = now }
  dirty = true
  return done({ 'ok', 1, '' })
end

if op == 'state' then
  local share, used
  if kind == 1 then
    share, used = fw_share(st, S, cur), fw_used(st, cur)
  elseif kind == 3 then
    share = eff()
    used = rg_tdiv(share * W - st.tok + W - 1, W)
  else
    share, used = eff(), st.used
  end
  if share < 0 then
    share = 0
  end
  if used < 0 then
    used = 0
  end
  local out = { 'ok', share, used }
  for id, o in pairs(st.outs) do
    if not o.void then
      out[#out + 1] = id
    out[#out + 1] = o.who
    out[#out + 1] = o.units
    out[#out + 1] = o.first
      out[#out + 1] = o.last
    end
  end
  return done(out)
end

return { 'invalid', 'unknown op ' .. tostring(op) }
