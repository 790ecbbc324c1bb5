-- ledger.lua: a region's share ledger of one global counter, as one Redis
-- hash: how it is read, pruned and written back. fixed.lua and sliding.lua
-- and bucket.lua hold each kind's arithmetic and ops.lua the operations; the files are
-- concatenated, in that order, after arith.lua (fdiv, cdiv, ifmt; package
-- luaarith), into the one script every call runs.
--
-- Lua numbers are IEEE doubles: every value here is an integer below 2^53
-- (the Go side refuses limits and clamps costs and keeps above 2^52), where
-- +, - and * are exact and arith.lua's fdiv makes division exact.
--
-- The hash (its key: the counter's name, ":region:" and the region, so it
-- shares the counter's Cluster hash tag):
--   lim        "<kind>:<units>:<window µs>", the limit it was made with
--   S          the region's static share, as when it was made
--   p          no give before this time (a Retry-After the region sent)
--   u          units admitted over the trailing window (sliding window)
--   k, s       tokens × W, as of time s (bucket)
--   n:<j>      units charged in the body of window j (fixed window)
--   b:<j>      units charged in the band of boundary j, per slot: 2 ×
--              FW_SLOTS counts joined by ':' (fixed window; fixed.lua)
--   o:<id>     a loan given:    "<to>:<units>:<first>:<last>:<given at>"
--   i:<id>     a loan received: "<from>:<units>:<first>:<last>:<received at>"
--              either followed by ":v" when the loan is void: made under
--              another limit than lim (rg_relimit)
-- <id> is "<epoch>/<seq>" in decimal; the script never reads it as a number
-- (an epoch does not fit a double).

-- rg_load reads the hash into a table: lim (false when the counter is
-- new), promise, n (window -> units in its body), b (boundary -> units per
-- slot of its band, an array), outs and ins (id -> record).
local function rg_load(key)
  local raw = redis.call('HGETALL', key)
  local st = { lim = false, static = 0, promise = 0, used = 0, tok = false, ts = false, n = {}, b = {}, outs = {}, ins = {},
    raw = {} }
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    st.raw[f] = v
    if f == 'lim' then
      st.lim = v
    elseif f == 'S' then
      st.static = tonumber(v)
    elseif f == 'p' then
      st.promise = tonumber(v)
    elseif f == 'u' then
      st.used = tonumber(v)
    elseif f == 'k' then
      st.tok = tonumber(v)
    elseif f == 's' then
      st.ts = tonumber(v)
    else
      local t, rest = string.sub(f, 1, 2), string.sub(f, 3)
      if t == 'n:' then
        st.n[tonumber(rest)] = tonumber(v)
      elseif t == 'b:' then
        local b = {}
        for c in string.gmatch(v, '(%-?%d+)') do
          b[#b + 1] = tonumber(c)
        end
        st.b[tonumber(rest)] = b
      elseif t == 'o:' or t == 'i:' then
        local who, u, a, b, at, void = string.match(v, '^([^:]+):(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+)(:?v?)$')
        local rec = { who = who, units = tonumber(u), first = tonumber(a), last = tonumber(b), at = tonumber(at),
          void = void == ':v' }
        if t == 'o:' then
          st.outs[rest] = rec
        else
          st.ins[rest] = rec
        end
      end
    end
  end
  return st
end

-- rg_band is a band's field: its slots' counts joined by ':'.
local function rg_band(b)
  local out = {}
  for q = 1, #b do
    out[q] = ifmt(b[q])
  end
  return table.concat(out, ':')
end

local function rg_rec(r)
  local v = r.who .. ':' .. ifmt(r.units) .. ':' .. ifmt(r.first) .. ':' .. ifmt(r.last) .. ':' .. ifmt(r.at)
  if r.void then
    v = v .. ':v'
  end
  return v
end

-- rg_relimit carries the ledger over to the limit l of other units (the
-- same kind and window), static share S (regions.Ledger's relimit): what
-- it counted stays, and every loan made under the old limit becomes void.
-- A void loan received counts nothing from now on and is never applied
-- again; a void loan given keeps its units out until they come back, and
-- is never extended, raised or reported.
local function rg_relimit(st, l, S)
  st.lim, st.static = l, S
  for _, o in pairs(st.outs) do
    o.void = true
  end
  for _, r in pairs(st.ins) do
    r.units, r.void = 0, true
  end
end

-- rg_save writes back the fields that changed since rg_load (st.raw),
-- deletes those that are gone, and sets the hash's expiry, and that of the
-- key other (if not nil): margin ms after the last moment anything in it
-- can still count (needed(st)); the limit is forgotten with the rest.
local function rg_save(key, other, st, now, margin, needed)
  local args = { 'lim', st.lim, 'S', ifmt(st.static) }
  if st.promise > 0 then
    args[#args + 1] = 'p'
    args[#args + 1] = ifmt(st.promise)
  end
  if st.used ~= 0 then
    args[#args + 1] = 'u'
    args[#args + 1] = ifmt(st.used)
  end
  if st.tok then
    args[#args + 1] = 'k'
    args[#args + 1] = ifmt(st.tok)
    args[#args + 1] = 's'
    args[#args + 1] = ifmt(st.ts)
  end
  for j, c in pairs(st.n) do
    args[#args + 1] = 'n:' .. ifmt(j)
    args[#args + 1] = ifmt(c)
  end
  for j, b in pairs(st.b) do
    args[#args + 1] = 'b:' .. ifmt(j)
    args[#args + 1] = rg_band(b)
  end
  for id, r in pairs(st.outs) do
    args[#args + 1] = 'o:' .. id
    args[#args + 1] = rg_rec(r)
  end
  for id, r in pairs(st.ins) do
    args[#args + 1] = 'i:' .. id
    args[#args + 1] = rg_rec(r)
  end
  local set, keep = {}, {}
  for i = 1, #args, 2 do
    local f, v = args[i], args[i + 1]
    keep[f] = true
    if st.raw[f] ~= v then
      set[#set + 1] = f
      set[#set + 1] = v
    end
  end
  local del = {}
  for f in pairs(st.raw) do
    if not keep[f] then
      del[#del + 1] = f
    end
  end
  if #del > 0 then
    redis.call('HDEL', key, unpack(del))
  end
  if #set > 0 then
    redis.call('HSET', key, unpack(set))
  end
  local left = needed(st) - now
  if left < 0 then
    left = 0
  end
  local ttl = cdiv(left, 1000) + margin
  redis.call('PEXPIRE', key, ttl)
  if other then
    redis.call('PEXPIRE', other, ttl)
  end
end
