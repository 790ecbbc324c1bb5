-- arith.lua: exact integer arithmetic, the first part of every script
-- the store sends (the guard's and a region's share ledger's).
--
-- Lua numbers are IEEE doubles. All counter state is kept in integers below
-- 2^53, where +, - and * are exact; these helpers make division exact too,
-- so the scripts agree bit for bit with the Go reference models (memstore,
-- regions.Ledger).
--
-- fdiv(x, y): floor(x / y) for integers x, y with y > 0.
-- cdiv(x, y): ceil(x / y) for integers x, y with y > 0.
-- ifmt(x):    x in decimal, every digit (Lua's own number format keeps 14).

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

local function ifmt(x)
  return string.format('%d', x)
end
