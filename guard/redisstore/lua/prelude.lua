-- prelude.lua: shared integer arithmetic for every algorithm.
--
-- Lua numbers are IEEE doubles. All counter state is kept in integers below
-- 2^53, where +, - and * are exact; these helpers make division exact too,
-- so the scripts agree bit for bit with the Go reference model (memstore).
--
-- fdiv(x, y): floor(x / y) for integers x, y with y > 0.
-- cdiv(x, y): ceil(x / y) for integers x, y with y > 0.
-- ms(us):     whole milliseconds, rounded up, for PEXPIRE.

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
