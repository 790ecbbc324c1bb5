-- sliding_window_counter.lua: the window W is split into P sub-windows of
-- length s = W / P. At time t (in units of q µs), with i = floor(t / s) and
-- f = t / s - i, the estimate is the units counted in sub-windows
-- i-P+1 .. i plus (1 - f) times those of sub-window i-P, unrounded; a cost is
-- admitted when estimate + cost <= L. Everything is computed multiplied by
-- s, in integers, so there is no rounding at all.
--
-- Counter fields (ARGV per counter): a = L, b = s (in q units), c = P,
-- d = q (µs per time unit; 1 unless L*s would leave exact arithmetic).
-- State, a hash: field = absolute sub-window index, value = units counted.
-- Fields older than i-P are deleted when the counter is next written.
-- Refund token: "<sub-window index>:<units>".
--
-- swc_parts() returns the parts (see decide.lua's header for the
-- interface): x is a table holding the counter's key and parameters
-- (a = L, b = s, c = P, d = q) and its state: t and i (now in q units and
-- its sub-window), cnt (index -> units), stale (fields to delete) and
-- dirty (indexes written); y is unused.

local function swc_parts()
  local function read(key, now, g, L, s, P, q)
    local c = { key = key, a = L, b = s, c = P, d = q }
    local t = fdiv(now, q)
    local i = fdiv(t, s)
    local v = redis.call('HGETALL', key)
    local cnt, stale = {}, {}
    for j = 1, #v, 2 do
      local idx, n = tonumber(v[j]), tonumber(v[j + 1])
      if idx and n then
        if idx < i - P then
          stale[#stale + 1] = v[j]
        elseif idx <= i then
          cnt[idx] = n
        end
      end
    end
    c.t, c.i, c.cnt, c.stale, c.dirty = t, i, cnt, stale, {}
    return c, 0
  end

  -- estimate * s at time t (q units) >= the current sub-window i.
  local function est(c, t)
    local s, P = c.b, c.c
    local k = fdiv(t, s)
    local sum = 0
    for j = k - P + 1, k do
      sum = sum + (c.cnt[j] or 0)
    end
    return sum * s + ((k + 1) * s - t) * (c.cnt[k - P] or 0)
  end

  local function fits(c, _, cost)
    return est(c, c.t) + cost * c.b <= c.a * c.b
  end

  local function bump(c, j, n)
    c.cnt[j] = (c.cnt[j] or 0) + n
    c.dirty[#c.dirty + 1] = j
  end

  local function charge(c, _, cost, capped)
    if capped then
      local room = fdiv(2 * c.a * c.b - est(c, c.t), c.b)
      if cost > room then
        cost = room
      end
    end
    if cost <= 0 then
      return c, ''
    end
    bump(c, c.i, cost)
    return c, ifmt(c.i) .. ':' .. ifmt(cost)
  end

  local function sub(c, _, n)
    for j = c.i, c.i - c.c, -1 do
      if n <= 0 then
        return c
      end
      local have = c.cnt[j] or 0
      if have > 0 then
        local take = have
        if take > n then
          take = n
        end
        bump(c, j, -take)
        n = n - take
      end
    end
    return c
  end

  local function refund(c, _, token, lim)
    local j, n = string.match(token, '^(%-?%d+):(%d+)$')
    j, n = tonumber(j), tonumber(n)
    if n and lim > 0 and lim < n then
      n = lim
    end
    if j and j >= c.i - c.c and j <= c.i then
      local have = c.cnt[j] or 0
      if n > have then
        n = have
      end
      if n > 0 then
        bump(c, j, -n)
      end
    end
    return c
  end

  -- the last sub-window holding units, or nil.
  local function last(c)
    for j = c.i, c.i - c.c, -1 do
      if (c.cnt[j] or 0) > 0 then
        return j
      end
    end
    return nil
  end

  local function write(key, g, c, _, now, margin)
    if #c.stale > 0 then
      redis.call('HDEL', key, unpack(c.stale))
    end
    local lst = last(c)
    if not lst then
      redis.call('DEL', key)
      return
    end
    for x = 1, #c.dirty do
      local j = c.dirty[x]
      local n = c.cnt[j] or 0
      if n > 0 then
        redis.call('HSET', key, ifmt(j), ifmt(n))
      else
        redis.call('HDEL', key, ifmt(j))
      end
    end
    redis.call('PEXPIRE', key, ms((lst + c.c + 1) * c.b * c.d - now) + margin)
  end

  -- time (µs from now) until estimate <= target.
  local function untl(c, now, target)
    local s, P = c.b, c.c
    local lim = target * s
    for k = c.i, c.i + P + 1 do
      local start = k * s
      if start < c.t then
        start = c.t
      end
      local sum = 0
      for j = k - P + 1, k do
        sum = sum + (c.cnt[j] or 0)
      end
      if sum * s <= lim then
        local prev = c.cnt[k - P] or 0
        local tau = start
        if prev > 0 then
          local x = (k + 1) * s - fdiv(lim - sum * s, prev)
          if x > tau then
            tau = x
          end
        end
        if tau < (k + 1) * s then
          local w = tau * c.d - now
          if w < 0 then
            return 0
          end
          return w
        end
      end
    end
    return 0
  end

  local function room(c)
    return fdiv(c.a * c.b - est(c, c.t), c.b)
  end

  local function figures(c, _, now, cost)
    local L, s = c.a, c.b
    local rem = fdiv(L * s - est(c, c.t), s)
    local reset = 0
    local lst = last(c)
    if lst then
      reset = (lst + c.c + 1) * s * c.d - now
      if reset < 0 then
        reset = 0
      end
    end
    local nxt = 0
    if rem < L then
      nxt = untl(c, now, L - rem - 1)
    end
    return rem, reset, nxt, untl(c, now, L - cost)
  end

  return read, fits, room, charge, sub, refund, write, figures
end
