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
-- make_sliding_window_counter() returns the implementation table (see
-- make_bucket).

local function make_sliding_window_counter()
  local function swc_load(c, now)
    local s, P = c.b, c.c
    local t = fdiv(now, c.d)
    local i = fdiv(t, s)
    local v = redis.call('HGETALL', c.key)
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
  end

  -- estimate * s at time t (q units) >= the current sub-window i.
  local function swc_est(c, t)
    local s, P = c.b, c.c
    local k = fdiv(t, s)
    local sum = 0
    for j = k - P + 1, k do
      sum = sum + (c.cnt[j] or 0)
    end
    return sum * s + ((k + 1) * s - t) * (c.cnt[k - P] or 0)
  end

  local function swc_fits(c, cost)
    return swc_est(c, c.t) + cost * c.b <= c.a * c.b
  end

  local function swc_bump(c, j, n)
    c.cnt[j] = (c.cnt[j] or 0) + n
    c.dirty[#c.dirty + 1] = j
  end

  local function swc_add(c, cost, capped)
    if capped then
      local room = fdiv(2 * c.a * c.b - swc_est(c, c.t), c.b)
      if cost > room then
        cost = room
      end
    end
    if cost <= 0 then
      return ''
    end
    swc_bump(c, c.i, cost)
    return ifmt(c.i) .. ':' .. ifmt(cost)
  end

  local function swc_sub(c, n)
    for j = c.i, c.i - c.c, -1 do
      if n <= 0 then
        return
      end
      local have = c.cnt[j] or 0
      if have > 0 then
        local take = have
        if take > n then
          take = n
        end
        swc_bump(c, j, -take)
        n = n - take
      end
    end
  end

  local function swc_refund(c, token, lim)
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
        swc_bump(c, j, -n)
      end
    end
  end

  -- the last sub-window holding units, or nil.
  local function swc_last(c)
    for j = c.i, c.i - c.c, -1 do
      if (c.cnt[j] or 0) > 0 then
        return j
      end
    end
    return nil
  end

  local function swc_save(c, now, margin)
    if #c.stale > 0 then
      redis.call('HDEL', c.key, unpack(c.stale))
    end
    local last = swc_last(c)
    if not last then
      redis.call('DEL', c.key)
      return
    end
    for x = 1, #c.dirty do
      local j = c.dirty[x]
      local n = c.cnt[j] or 0
      if n > 0 then
        redis.call('HSET', c.key, ifmt(j), ifmt(n))
      else
        redis.call('HDEL', c.key, ifmt(j))
      end
    end
    redis.call('PEXPIRE', c.key, ms((last + c.c + 1) * c.b * c.d - now) + margin)
  end

  -- time (µs from now) until estimate <= target.
  local function swc_until(c, now, target)
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

  local function swc_free(c)
    return fdiv(c.a * c.b - swc_est(c, c.t), c.b)
  end

  local function swc_stats(c, now, cost)
    local L, s = c.a, c.b
    local rem = fdiv(L * s - swc_est(c, c.t), s)
    local reset = 0
    local last = swc_last(c)
    if last then
      reset = (last + c.c + 1) * s * c.d - now
      if reset < 0 then
        reset = 0
      end
    end
    local nxt = 0
    if rem < L then
      nxt = swc_until(c, now, L - rem - 1)
    end
    return rem, reset, nxt, swc_until(c, now, L - cost)
  end

  return { load = swc_load, save = swc_save, fits = swc_fits, add = swc_add,
    sub = swc_sub, refund = swc_refund, stats = swc_stats, free = swc_free }
end
