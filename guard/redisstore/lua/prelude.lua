-- prelude.lua: what every algorithm shares after arith.lua's exact
-- integer arithmetic (fdiv, cdiv, ifmt; package luaarith): milliseconds
-- for PEXPIRE and the lease sizing of every algorithm's check.
--
-- ms(us):     whole milliseconds, rounded up, for PEXPIRE.
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

local function ms(us)
  return cdiv(us, 1000)
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
