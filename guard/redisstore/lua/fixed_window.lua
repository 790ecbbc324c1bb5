-- fixed_window.lua: at most L units per window of W µs, windows aligned to
-- multiples of W since the Unix epoch (in Redis time). Admits up to 2L across
-- a window boundary: prefer token_bucket unless that is acceptable.
--
-- Counter fields (ARGV per counter): a = L, b = W.
-- State, a hash: w = the window's start (µs), c = units counted in it. The
-- window start lives in the value, so the key name never depends on time.
-- Refund token: "<window start>:<units>".
--
-- make_fixed_window() returns the implementation table (see make_bucket).

local function make_fixed_window()
  local function fw_load(c, now)
    local v = redis.call('HMGET', c.key, 'w', 'c')
    local ws = fdiv(now, c.b) * c.b
    local n = 0
    if tonumber(v[1]) == ws then
      n = tonumber(v[2]) or 0
    end
    c.ws, c.n = ws, n
  end

  local function fw_save(c, now, margin)
    if c.n <= 0 then
      redis.call('DEL', c.key)
      return
    end
    redis.call('HSET', c.key, 'w', ifmt(c.ws), 'c', ifmt(c.n))
    redis.call('PEXPIRE', c.key, ms(c.ws + c.b - now) + margin)
  end

  local function fw_fits(c, cost)
    return c.n + cost <= c.a
  end

  local function fw_add(c, cost, capped)
    c.n = c.n + cost
    if capped and c.n > 2 * c.a then
      c.n = 2 * c.a
    end
    return ifmt(c.ws) .. ':' .. ifmt(cost)
  end

  local function fw_sub(c, n)
    c.n = c.n - n
    if c.n < 0 then
      c.n = 0
    end
  end

  local function fw_refund(c, token, lim)
    local w, n = string.match(token, '^(%-?%d+):(%d+)$')
    if w and tonumber(w) == c.ws then
      n = tonumber(n)
      if lim > 0 and lim < n then
        n = lim
      end
      fw_sub(c, n)
    end
  end

  local function fw_free(c)
    return c.a - c.n
  end

  local function fw_stats(c, now, cost)
    local rem = c.a - c.n
    local wait = c.ws + c.b - now
    local reset, nxt, retry = 0, 0, 0
    if c.n > 0 then
      reset, nxt = wait, wait
    end
    if c.n + cost > c.a then
      retry = wait
    end
    return rem, reset, nxt, retry
  end

  return { load = fw_load, save = fw_save, fits = fw_fits, add = fw_add,
    sub = fw_sub, refund = fw_refund, stats = fw_stats, free = fw_free }
end
