-- prelude.lua: shared integer arithmetic for every algorithm, and the
-- lease sizing every algorithm's check shares.
--
-- Lua numbers are IEEE doubles. All counter state is kept in integers below
-- 2^53, where +, - and * are exact; these helpers make division exact too,
-- so the scripts agree bit for bit with the Go reference model (memstore).
--
-- fdiv(x, y): floor(x / y) for integers x, y with y > 0.
-- cdiv(x, y): ceil(x / y) for integers x, y with y > 0.
-- ms(us):     whole milliseconds, rounded up, for PEXPIRE.
-- ifmt(x):    x in decimal, every digit (Lua's own number format keeps 14).
-- lease_units(free, cost, want): the units a check charging cost to a
--   counter with free units left grants as a lease when it asks for want
--   (0 when it asks none): at most want and at most a LEASE_SHARE-th of
--   what is free after the cost, so leases shrink to nothing as a counter
--   nears its limit (the local fast path).
--
-- Every local function defined at the top of the script is a new closure
-- on every call (Redis runs the whole chunk per EVALSHA): the algorithm
-- files define theirs inside their *_parts function, which a call runs only
-- for the algorithms it uses.

local floor = math.floor

local function fdiv(x, y)
  local q = floor(x / y)
  if q * y > x then
    q = q - 1
  elseif (q + 1) * y <= x then
    q = q + 1
  end
  return q
end

local function cdiv(x, y)
  return -fdiv(-x, y)
end

local function ms(us)
  return cdiv(us, 1000)
end

local function ifmt(x)
  return string.format('%d', x)
end

local LEASE_SHARE = 4

local function lease_units(free, cost, want)
  if want <= 0 then
    return 0
  end
  local g = fdiv(free - cost, LEASE_SHARE)
  if g > want then
    return want
  end
  if g < 0 then
    return 0
  end
  return g
end
