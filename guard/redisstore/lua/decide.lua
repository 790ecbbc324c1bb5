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
--              4 sliding_window_counter, 5 sliding_window_log),
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
-- cost, so leases shrink to nothing as a counter nears its limit (SPEC §2
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

-- A lease takes at most this fraction (1/LEASE_SHARE) of the units free
-- after the request's cost.
local LEASE_SHARE = 4

-- The algorithms, created on first use in this call (see make_bucket).
local made = {}
local function algorithm(code)
  local alg = made[code]
  if alg then
    return alg
  end
  if code == 1 or code == 2 then
    local b = make_bucket()
    made[1], made[2] = b[1], b[2]
  elseif code == 3 then
    made[3] = make_fixed_window()
  elseif code == 4 then
    made[4] = make_sliding_window_counter()
  elseif code == 5 then
    made[5] = make_sliding_window_log()
  end
  return made[code]
end

local op = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local margin = tonumber(ARGV[3])

local cs = {}
for i = 1, #KEYS do
  local b = 4 + 10 * (i - 1)
  cs[i] = {
    key = KEYS[i], alg = algorithm(tonumber(ARGV[b])), cost = tonumber(ARGV[b + 1]),
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
    redis.call('DEL', cs[i].key)
  end
end
for i = 1, #cs do
  cs[i].alg.load(cs[i], now)
end
if op == 1 or op == 8 then
  for i = 1, #cs do
    local c = cs[i]
    if c.ret > 0 and c.token ~= '' then
      c.alg.refund(c, c.token, c.ret)
      c.returned = true
    end
  end
end

if op == 1 or op == 2 then
  for i = 1, #cs do
    local c = cs[i]
    c.allowed = c.alg.fits(c, c.cost)
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
          local g = fdiv(c.alg.free(c) - c.cost, LEASE_SHARE)
          if g > c.lease then
            g = c.lease
          end
          if g > 0 then
            c.leased = g
            n = n + g
          end
        end
        c.tok = c.alg.add(c, n, false, now)
        c.charged = op == 1
      end
    end
  end
elseif op == 3 then
  for i = 1, #cs do
    local c = cs[i]
    c.allowed = true
    c.tok = c.alg.add(c, c.cost, true, now)
    c.charged = true
  end
elseif op == 5 then
  for i = 1, #cs do
    cs[i].allowed = true
    cs[i].alg.sub(cs[i], cs[i].cost)
    cs[i].charged = true
  end
elseif op == 6 then
  for i = 1, #cs do
    cs[i].allowed = true
    cs[i].alg.refund(cs[i], cs[i].token, 0)
    cs[i].charged = true
  end
elseif op == 8 then
  for i = 1, #cs do
    cs[i].allowed = true
    cs[i].charged = true
  end
elseif op == 7 then
  for i = 1, #cs do
    cs[i].allowed = cs[i].alg.fits(cs[i], cs[i].cost)
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
    c.alg.save(c, now, margin)
  end
  local rem, reset, nxt, retry = c.alg.stats(c, now, c.cost)
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
