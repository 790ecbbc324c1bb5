-- gate.lua: a `regions: global` rule's counter decided against the
-- region's share ledger, as the sixth algorithm of decide.lua (code 6).
-- Only the region script holds it: prelude.lua, the algorithm files, the
-- share ledger's files (regionstore/lua: ledger.lua, fixed.lua,
-- sliding.lua, bucket.lua), this file, then decide.lua.
--
-- This file and the share ledger's files are the body of the function
-- gate_parts (script.go wraps them), so that the ledger's functions are
-- made only by a call that decides a ledger counter: a call without one
-- pays nothing for them. gate_parts returns the parts.
--
-- An admission is regions.Ledger's Admit, exactly: the share plus the
-- loans received less the loans given, a fixed window's admission within
-- the skew bound of a boundary counted, in its slot of the boundary's band,
-- in both windows (fixed.lua), a rejection's
-- wait recorded in the ledger (its field p) so that no give runs before it
-- ends. A check charging cost plus a lease is an admission of both.
--
-- Counter fields (ARGV per counter): a = kind (1 fixed window, 2 sliding
-- window, 3 bucket), b = the rule's whole limit L (a bucket: its
-- capacity), c = W µs (the window, or a bucket's full-refill time), d = the
-- region's static share S (kept when the ledger is made; the one kept is
-- used after). KEYS[i] is the ledger hash (the counter's name, ":region:"
-- and the region); a sliding window's admissions are the list beside it
-- (the same key and ":log"). The call's last two ARGV are the skew bound K
-- and the period P of loans, µs, after every counter's ten values.
--
-- A ledger holding another limit keeps what it counted when only the
-- units changed (the rule's limit, an override, a penalty), at the new
-- limit's static share, as the guard's own scripts carry a counter over a
-- limit change, and voids the loans made under the old limit (what it
-- lent stays out until it comes back, what it borrowed no longer counts);
-- with another kind or window it is started afresh. Either is the
-- carve-out of a limit changed mid-window.
--
-- The state x is a table: st (the ledger as rg_load reads it, pruned to
-- now), lim, kind, log, add (units charged but not yet written: a peek
-- never writes them), charged (charge ran), dirty (st differs from Redis: pruned, made, or a
-- promise recorded). Refund tokens: fixed "<units>:<j>:<q>" (the cell the
-- admission counted in: fw_cell), sliding "<time>:<units>" (its
-- entry in the list), bucket "<units>".

local K = tonumber(ARGV[#ARGV - 1])
local P = tonumber(ARGV[#ARGV])

-- setup points the ledger's shared table at one counter's figures.
local function setup(x)
  sw.S, sw.W, sw.P, sw.K = x.st.static, x.W, P, K
  sw.R, sw.F = 0, 0
  if x.kind == 2 then
    sw.R, sw.F = x.W, x.W + K
  end
end

local function needed(x)
  if x.kind == 1 then
    return fw_needed(x.W, K)
  elseif x.kind == 3 then
    return bk_needed
  end
  return sw_needed(x.log)
end

local function save(x, now, margin)
  setup(x)
  local other = nil
  if x.kind == 2 then
    other = x.log
  end
  rg_save(x.key, other, x.st, now, margin, needed(x))
  x.dirty, x.slid = false, false
end

local function read(key, now, g, kind, L, W, S)
  local lim = ifmt(kind) .. ':' .. ifmt(L) .. ':' .. ifmt(W)
  local x = { key = key, log = key .. ':log', kind = kind, W = W, lim = lim, add = 0, dirty = false }
  local st = rg_load(key)
  if st.lim and st.lim ~= lim then
    local k0, _, w0 = string.match(st.lim, '^(%d+):(%d+):(%d+)$')
    if tonumber(k0) == kind and tonumber(w0) == W then
      -- Only the units changed (the rule's limit, an override, a
      -- penalty): what the region admitted stays, at the new limit's
      -- static share; the loans made under the old limit become void
      -- (rg_relimit: what it lent stays out, what it borrowed no longer
      -- counts). A bucket's tokens are first brought to now under the
      -- old limit: the new one counts from now on.
      if kind == 3 then
        sw.S, sw.W, sw.P, sw.K, sw.R, sw.F = st.static, W, P, K, 0, 0
        bk_settle(st, now)
      end
      rg_relimit(st, lim, S)
      x.dirty = true
    else
      redis.call('DEL', key, x.log)
      st = rg_load(key)
    end
  end
  x.st = st
  if not st.lim then
    st.lim, st.static = lim, S
    if kind == 3 then
      st.tok, st.ts = S * W, now
    end
    x.dirty = true
  end
  setup(x)
  -- What only the charge's own fields hold is not dirty: a bucket's
  -- settle (the same tokens whenever it is settled: the write stores it
  -- with the charge) and a sliding window's admissions sliding out of
  -- the list (u, written with the charge or by figures).
  local pruned
  if kind == 1 then
    pruned = fw_prune(st, W, K, now)
  elseif kind == 3 then
    bk_settle(st, now)
    pruned = sw_prune_loans(st, now)
  else
    pruned = sw_prune_loans(st, now)
    while true do
      local v = redis.call('LINDEX', x.log, 0)
      if not v then
        break
      end
      local t, c = sw_entry(v)
      if t > now - W then
        break
      end
      redis.call('LPOP', x.log)
      st.used = st.used - c
      x.slid = true
    end
  end
  x.dirty = x.dirty or pruned
  return x, now
end

-- room is what the region can still admit at t (now: the read's time).
local function free(x, t)
  setup(x)
  local st = x.st
  if x.kind == 1 then
    return fw_room(st, st.static, x.W, K, t) - x.add
  elseif x.kind == 3 then
    return rg_tdiv(st.tok - x.add * x.W, x.W)
  end
  return sw_share(st, t, t) - st.used - x.add
end

local function fits(x, now, cost)
  if x.kind == 3 then
    return x.st.tok - x.add * x.W >= cost * x.W
  end
  return free(x, now) >= cost
end

local function room(x, now)
  return free(x, now)
end

local function charge(x, now, n, capped)
  x.add, x.charged = x.add + n, true
  if x.kind == 1 then
    local j, q = fw_cell(x.W, K, now)
    return x, ifmt(n) .. ':' .. ifmt(j) .. ':' .. ifmt(q)
  elseif x.kind == 2 then
    return x, ifmt(now) .. ':' .. ifmt(n)
  end
  return x, ifmt(n)
end

-- take gives back up to n units charged in now's window (fixed), the
-- newest admissions (sliding), or tokens up to the share (bucket).
local function sub(x, now, n)
  setup(x)
  local st = x.st
  if n <= 0 then
    return x
  end
  if x.kind == 1 then
    -- From now's cell, then from the rest of now's window: its body, the
    -- band at its start, the band at its end.
    local j, q = fw_cell(x.W, K, now)
    local cur = fdiv(now, x.W)
    local cells = { { j, q }, { cur, -1 } }
    for _, bj in ipairs({ cur, cur + 1 }) do
      for k = FW_BAND - 1, 0, -1 do
        cells[#cells + 1] = { bj, k }
      end
    end
    for _, c in ipairs(cells) do
      local had
      if c[2] < 0 then
        had = st.n[c[1]] or 0
      else
        had = st.b[c[1]] and st.b[c[1]][c[2] + 1] or 0
      end
      if n > 0 and had > 0 then
        fw_count(st, c[1], c[2], -math.min(n, had))
        n = n - math.min(n, had)
      end
    end
  elseif x.kind == 3 then
    st.tok = math.min(st.tok + n * x.W, bk_eff(st, now) * x.W)
  else
    while n > 0 do
      local v = redis.call('RPOP', x.log)
      if not v then
        break
      end
      local t, c = sw_entry(v)
      local k = math.min(c, n)
      if c > k then
        redis.call('RPUSH', x.log, ifmt(t) .. ':' .. ifmt(c - k))
      end
      st.used, n = st.used - k, n - k
    end
  end
  x.dirty = true
  return x
end

local function refund(x, now, token, lim)
  setup(x)
  local st = x.st
  local function cut(k)
    k = tonumber(k)
    if lim > 0 and lim < k then
      return lim
    end
    return k
  end
  if x.kind == 1 then
    local k, j, q = string.match(token, '^(%d+):(%-?%d+):(%-?%d+)$')
    if k then
      j, q = tonumber(j), tonumber(q)
      if q < 0 and st.n[j] or q >= 0 and q < FW_BAND and st.b[j] then
        fw_count(st, j, q, -cut(k))
      end
    end
  elseif x.kind == 3 then
    local k = string.match(token, '^(%d+)$')
    if k then
      st.tok = math.min(st.tok + cut(k) * x.W, bk_eff(st, now) * x.W)
    end
  else
    local t, c = sw_entry(token)
    if t and t > now - x.W then
      local i = redis.call('LPOS', x.log, token, 'RANK', -1)
      if i then
        local k = cut(c)
        redis.call('LSET', x.log, i, ifmt(t) .. ':' .. ifmt(c - k))
        st.used = st.used - k
      end
    end
  end
  x.dirty = true
  return x
end

-- expire sets the keys' expiry as rg_save does, for writes that name
-- their fields themselves.
local function expire(x, now, margin)
  setup(x)
  local left = needed(x)(x.st) - now
  if left < 0 then
    left = 0
  end
  local ttl = -fdiv(-left, 1000) + margin
  redis.call('PEXPIRE', x.key, ttl)
  if x.kind == 2 then
    redis.call('PEXPIRE', x.log, ttl)
  end
end

-- write applies the charge. A ledger read as it is in Redis (nothing
-- pruned or made) gets only the fields the charge changed; otherwise it
-- is saved whole.
local function write(key, g, x, now, now2, margin)
  local st = x.st
  local set = {}
  if x.add ~= 0 or x.charged and x.kind == 2 then
    if x.kind == 1 then
      local j, q = fw_cell(x.W, K, now)
      set[1], set[2] = fw_count(st, j, q, x.add)
    elseif x.kind == 3 then
      st.tok = st.tok - x.add * x.W
      set[1], set[2], set[3], set[4] = 'k', ifmt(st.tok), 's', ifmt(st.ts)
    else
      redis.call('RPUSH', x.log, ifmt(now) .. ':' .. ifmt(x.add))
      st.used = st.used + x.add
      set[1], set[2] = 'u', ifmt(st.used)
    end
    x.add = 0
  end
  if x.dirty or #set == 0 or x.kind == 2 and st.used == 0 then
    save(x, now, margin)
    x.slid = false
    return
  end
  redis.call('HSET', x.key, unpack(set))
  x.slid = false
  expire(x, now, margin)
end

-- remaining, reset after, next after, retry after (for cost). A
-- rejection of a check or a peek records its wait: the region gives
-- nothing away before it ends.
local function figures(x, now, now2, cost)
  local st = x.st
  local margin = tonumber(ARGV[3])
  local rem = free(x, now)
  local retry = 0
  local pending = x.charged
  if not pending and not fits(x, now, cost) then
    setup(x)
    if x.kind == 1 then
      retry = fw_retry(st, st.static, x.W, K, cost, now)
    elseif x.kind == 3 then
      retry = bk_retry(st, cost, now)
    else
      retry = sw_retry(st, x.log, cost, now)
    end
    if (ARGV[1] == '1' or ARGV[1] == '2') and now + retry > st.promise then
      st.promise = now + retry
      if x.dirty then
        save(x, now, margin)
      else
        redis.call('HSET', x.key, 'p', ifmt(st.promise))
        expire(x, now, margin)
      end
    end
  end
  local reset, nxt = 0, 0
  if x.kind == 1 then
    local last = false
    for j, n in pairs(st.n) do
      if n > 0 and (not last or j > last) then
        last = j
      end
    end
    -- a band counts in the windows either side of its boundary
    for j, b in pairs(st.b) do
      for q = 1, #b do
        if b[q] > 0 and (not last or j > last) then
          last = j
        end
      end
    end
    if pending then
      for _, j in ipairs(fw_charged(x.W, K, now)) do
        if not last or j > last then
          last = j
        end
      end
    end
    if last then
      reset = math.max((last + 1) * x.W - now, 0)
    end
    nxt = reset
  elseif x.kind == 3 then
    setup(x)
    local e = bk_eff(st, now)
    local tok = st.tok - x.add * x.W
    if e > 0 and tok < e * x.W then
      reset = fdiv(e * x.W - tok + e - 1, e)
      nxt = fdiv((fdiv(tok, x.W) + 1) * x.W - tok + e - 1, e)
    end
  else
    if pending then
      reset = x.W
    else
      local v = redis.call('LINDEX', x.log, -1)
      if v then
        reset = math.max(sw_entry(v) + x.W - now, 0)
      end
    end
    local v = redis.call('LINDEX', x.log, 0)
    if v then
      nxt = math.max(sw_entry(v) + x.W - now, 0)
    else
      nxt = reset
    end
  end
  if x.dirty then
    save(x, now, margin)
  elseif x.slid then
    -- admissions slid out of the list: their sum goes with them
    if st.used ~= 0 then
      redis.call('HSET', x.key, 'u', ifmt(st.used))
    else
      redis.call('HDEL', x.key, 'u')
    end
  end
  x.slid = false
  if rem < 0 then
    rem = 0
  end
  return rem, reset, nxt, retry
end

-- clear empties the counter for a reset: its admissions go, its loans
-- and the wait it promised stay (the units it lent are not its own).
local function clear(key, now, kind, L, W, S)
  local x = read(key, now, false, kind, L, W, S)
  local st = x.st
  st.n, st.b, st.used = {}, {}, 0
  redis.call('DEL', x.log)
  if kind == 3 then
    setup(x)
    st.tok = bk_eff(st, now) * W
  end
  save(x, now, tonumber(ARGV[3]))
end

return read, fits, room, charge, sub, refund, write, figures, clear
