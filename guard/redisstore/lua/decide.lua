-- decide.lua: decides one request's counters atomically (one EVALSHA).
-- It is appended to prelude.lua and the algorithm files to form the script.
--
-- KEYS[i]  the i-th counter's key. All keys share one Cluster hash tag.
-- ARGV[1]  op: 1 check, 2 peek, 3 report, 4 reset, 5 add quota, 6 refund,
--          7 state, 8 return
-- ARGV[2]  now in Unix µs, or 0 to use redis TIME (always 0 in production;
--          an explicit time exists only so tests can drive a clock)
-- ARGV[3]  TTL margin in ms added to every key's expiry
-- then 10 values per counter i, starting at ARGV[4 + 10*(i-1)]:
--   algorithm (1 token_bucket, 2 gcra, 3 fixed_window,
--              4 sliding_window_counter, 5 sliding_window_log; 6 a global
--              rule's share ledger, only in the region script: gate.lua,
--              whose calls end with two more values after the counters),
--   cost (units; add quota: units to give back),
--   shadow (1 = shadow counter),
--   token: the charge to refund (op 6) or the lease to give units of back
--          (ops 1 and 8); "" otherwise,
--   a, b, c, d: the algorithm's parameters (see its file),
--   lease: units wanted beyond the cost for a local lease (op 1),
--   return: units of the token's lease to give back (ops 1 and 8)
--
-- check: units of an earlier lease are given back first (return, token);
-- then the request is admitted when every non-shadow counter can take its
-- cost; then all of them are charged, otherwise none is. A shadow counter
-- is charged only when the request is admitted and it would have admitted it.
-- An admitted enforced counter that asks for a lease is charged up to
-- `lease` more units, at most a LEASE_SHARE-th of what is free after the
-- cost, so leases shrink to nothing as a counter nears its limit (the
-- local fast path); the units leased are part of the charge's token.
-- peek: as check, nothing written. report: charge unconditionally, debt down
-- to one full limit below zero. reset: delete. add quota: give units back,
-- never above full. refund: undo the charge named by the token. state:
-- whether each counter could take its cost, figures before any charge.
-- return: give back `return` units of the lease named by the token (none
-- when its window has passed).
--
-- Reply: { now, admitted (1/0), then 8 values per counter:
--   allowed (1/0), charged (1/0), remaining (floor, may be negative),
--   reset after (µs until full), next after (µs until one more unit;
--   0 when full), retry after (µs until the cost is admitted; 0 when it is),
--   token (string, "" when nothing was charged), leased (units of the charge
--   beyond the cost: the lease granted) }

-- Each algorithm's file defines a function returning its parts, which
-- decide.lua drives (bucket_parts for token_bucket and gcra, fw_parts,
-- swc_parts, swl_parts). They work on a counter's state as values, x and
-- y (numbers for the buckets and the fixed window, a table for the
-- sliding windows), with the counter's parameters a, b, c, d and g (true
-- for gcra), and return, in this order:
--   read(key, now, g, a, b, c, d) -> x, y: the state at now
--   fits(x, y, cost, a, b, c, d) -> whether cost units fit now
--   room(x, y, a, b, c, d) -> whole units a lease may be sized on
--   charge(x, y, n, capped, now, g, a, b, c, d) -> x, refund token
--     (capped: report, at most two limits' worth)
--   sub(x, y, n, g, a, b, c, d) -> x, n units given back
--   refund(x, y, token, lim, g, a, b, c, d) -> x, the charge named by
--     token given back, at most lim units of it when lim > 0
--   write(key, g, x, y, now, margin, a, b, c, d): store the state
--   figures(x, y, now, cost, a, b, c, d) -> remaining, reset after,
--     next after, retry after
--   clear(key, now, a, b, c, d), optional: what a reset does instead of
--     deleting the key (gate.lua keeps a ledger's loans)
--
-- Slim paths: a check (op 1) of one enforced counter that gives no lease
-- units back — the common call — is decided on plain locals; a check of
-- several counters none of which gives lease units back, on the locals of
-- one step per counter. Neither builds the generic loop's table per
-- counter, and both answer exactly as the generic loop answers the same
-- call. They come first: what the chunk defines after them is not created
-- on a call that returns there (Lua creates a closure each time a script
-- runs its definition).

-- the parts of the algorithm with this code (ARGV, above).
local function algorithm(code)
  if code == 1 or code == 2 then
    return bucket_parts()
  elseif code == 3 then
    return fw_parts()
  elseif code == 4 then
    return swc_parts()
  elseif code == 5 then
    return swl_parts()
  elseif code == 6 then
    -- only in the region script (gate.lua)
    return gate_parts()
  end
  error('unknown algorithm code ' .. tostring(code))
end

local op = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local margin = tonumber(ARGV[3])

if op == 1 and #KEYS == 1 and ARGV[6] ~= '1' and not (tonumber(ARGV[13]) > 0 and ARGV[7] ~= '') then
  local code = tonumber(ARGV[4])
  local read, fits, room, charge, _, _, write, figures = algorithm(code)
  local key, g = KEYS[1], code == 2
  local cost, want = tonumber(ARGV[5]), tonumber(ARGV[12])
  local a, b, c, d = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local x, y = read(key, now, g, a, b, c, d)
  local ok = fits(x, y, cost, a, b, c, d)
  local tok, leased = '', 0
  if ok then
    if want > 0 then
      leased = lease_units(room(x, y, a, b, c, d), cost, want)
    end
    x, tok = charge(x, y, cost + leased, false, now, g, a, b, c, d)
    write(key, g, x, y, now, margin, a, b, c, d)
  end
  local rem, reset, nxt, retry = figures(x, y, now, cost, a, b, c, d)
  local r = ok and 1 or 0
  return { now, r, r, r, rem, reset, nxt, retry, tok, leased }
end

-- Slim path for a check of several counters, none giving lease units back,
-- no key named twice (a key rule and a tenant rule): each counter's state
-- lives in the locals of its own step, which reads it, lets the steps
-- after it decide, and charges it only if every enforced counter fits.
if op == 1 then
  local slim = true
  for i = 1, #KEYS do
    local b = 4 + 10 * (i - 1)
    if tonumber(ARGV[b + 9]) > 0 and ARGV[b + 3] ~= '' then
      slim = false
    end
    for j = 1, i - 1 do
      if KEYS[j] == KEYS[i] then
        slim = false
      end
    end
  end
  if slim then
    local out = { now, 0 }
    local function step(i, admitted)
      if i > #KEYS then
        return admitted
      end
      local b = 4 + 10 * (i - 1)
      local code = tonumber(ARGV[b])
      local read, fits, room, charge, _, _, write, figures = algorithm(code)
      local key, g = KEYS[i], code == 2
      local cost, shadow, want = tonumber(ARGV[b + 1]), ARGV[b + 2] == '1', tonumber(ARGV[b + 8])
      local a, pb, pc, pd = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
      local x, y = read(key, now, g, a, pb, pc, pd)
      local ok = fits(x, y, cost, a, pb, pc, pd)
      admitted = step(i + 1, admitted and (ok or shadow))
      local charged, tok, leased = 0, '', 0
      if admitted and ok then
        if want > 0 and not shadow then
          leased = lease_units(room(x, y, a, pb, pc, pd), cost, want)
        end
        x, tok = charge(x, y, cost + leased, false, now, g, a, pb, pc, pd)
        write(key, g, x, y, now, margin, a, pb, pc, pd)
        charged = 1
      end
      local o = 2 + 8 * (i - 1)
      out[o + 1], out[o + 2] = ok and 1 or 0, charged
      out[o + 3], out[o + 4], out[o + 5], out[o + 6] = figures(x, y, now, cost, a, pb, pc, pd)
      out[o + 7], out[o + 8] = tok, leased
      return admitted
    end
    out[2] = step(1, true) and 1 or 0
    return out
  end
end

-- The generic loop. Each algorithm's parts, made on first use in this
-- call, as a table.
local made = {}
local function parts(code)
  local p = made[code]
  if p then
    return p
  end
  local read, fits, room, charge, sub, refund, write, figures, clear = algorithm(code)
  p = { read = read, fits = fits, room = room, charge = charge, sub = sub,
    refund = refund, write = write, figures = figures, clear = clear }
  if code == 1 or code == 2 then
    made[1], made[2] = p, p
  end
  made[code] = p
  return p
end

local cs = {}
for i = 1, #KEYS do
  local b = 4 + 10 * (i - 1)
  local code = tonumber(ARGV[b])
  cs[i] = {
    key = KEYS[i], p = parts(code), g = code == 2, cost = tonumber(ARGV[b + 1]),
    shadow = ARGV[b + 2] == '1', token = ARGV[b + 3],
    a = tonumber(ARGV[b + 4]), b = tonumber(ARGV[b + 5]),
    c = tonumber(ARGV[b + 6]), d = tonumber(ARGV[b + 7]),
    lease = tonumber(ARGV[b + 8]), ret = tonumber(ARGV[b + 9]),
    allowed = false, charged = false, returned = false, tok = '', leased = 0,
  }
end

local admitted = true
if op == 4 then
  for i = 1, #cs do
    local c = cs[i]
    if c.p.clear then
      c.p.clear(c.key, now, c.a, c.b, c.c, c.d)
    else
      redis.call('DEL', c.key)
    end
  end
end
for i = 1, #cs do
  local c = cs[i]
  c.x, c.y = c.p.read(c.key, now, c.g, c.a, c.b, c.c, c.d)
end
if op == 1 or op == 8 then
  for i = 1, #cs do
    local c = cs[i]
    if c.ret > 0 and c.token ~= '' then
      c.x = c.p.refund(c.x, c.y, c.token, c.ret, c.g, c.a, c.b, c.c, c.d)
      c.returned = true
    end
  end
end

if op == 1 or op == 2 then
  for i = 1, #cs do
    local c = cs[i]
    c.allowed = c.p.fits(c.x, c.y, c.cost, c.a, c.b, c.c, c.d)
    if not c.shadow and not c.allowed then
      admitted = false
    end
  end
  if admitted then
    for i = 1, #cs do
      local c = cs[i]
      if c.allowed then
        local n = c.cost
        if op == 1 and c.lease > 0 and not c.shadow then
          c.leased = lease_units(c.p.room(c.x, c.y, c.a, c.b, c.c, c.d), c.cost, c.lease)
          n = n + c.leased
        end
        c.x, c.tok = c.p.charge(c.x, c.y, n, false, now, c.g, c.a, c.b, c.c, c.d)
        c.charged = op == 1
      end
    end
  end
elseif op == 3 or op == 5 or op == 6 or op == 8 then
  -- report, add quota, refund and return: every counter is admitted and
  -- charged (a return's units went back above).
  for i = 1, #cs do
    local c = cs[i]
    if op == 3 then
      c.x, c.tok = c.p.charge(c.x, c.y, c.cost, true, now, c.g, c.a, c.b, c.c, c.d)
    elseif op == 5 then
      c.x = c.p.sub(c.x, c.y, c.cost, c.g, c.a, c.b, c.c, c.d)
    elseif op == 6 then
      c.x = c.p.refund(c.x, c.y, c.token, 0, c.g, c.a, c.b, c.c, c.d)
    end
    c.allowed = true
    c.charged = true
  end
elseif op == 7 then
  for i = 1, #cs do
    local c = cs[i]
    c.allowed = c.p.fits(c.x, c.y, c.cost, c.a, c.b, c.c, c.d)
  end
elseif op == 4 then
  for i = 1, #cs do
    cs[i].allowed = true
  end
end

local out = { now, admitted and 1 or 0 }
for i = 1, #cs do
  local c = cs[i]
  if c.charged or c.returned then
    c.p.write(c.key, c.g, c.x, c.y, now, margin, c.a, c.b, c.c, c.d)
  end
  local rem, reset, nxt, retry = c.p.figures(c.x, c.y, now, c.cost, c.a, c.b, c.c, c.d)
  if not c.charged then
    c.tok = ''
  end
  local n = #out
  out[n + 1] = c.allowed and 1 or 0
  out[n + 2] = c.charged and 1 or 0
  out[n + 3] = rem
  out[n + 4] = reset
  out[n + 5] = nxt
  out[n + 6] = retry
  out[n + 7] = c.tok
  out[n + 8] = c.leased
end
return out
