-- fixed_window.lua: at most L units per window of W µs, windows aligned to
-- multiples of W since the Unix epoch (in Redis time). Admits up to 2L across
-- a window boundary: prefer token_bucket unless that is acceptable.
--
-- Counter fields (ARGV per counter): a = L, b = W.
-- State, a hash: w = the window's start (µs), c = units counted in it. The
-- window start lives in the value, so the key name never depends on time.
-- Refund token: "<window start>:<units>".
--
-- fw_parts() returns the parts (see decide.lua's header for the
-- interface), on the state as plain values: x = the units n counted in the
-- current window, y = its start ws.

local function fw_parts()
  local function read(key, now, g, L, W)
    local v = redis.call('HMGET', key, 'w', 'c')
    local ws = fdiv(now, W) * W
    if tonumber(v[1]) == ws then
      return tonumber(v[2]) or 0, ws
    end
    return 0, ws
  end

  local function fits(n, ws, cost, L)
    return n + cost <= L
  end

  local function room(n, ws, L)
    return L - n
  end

  -- the units after charging cost (capped: at most two limits, for
  -- report), and the refund token.
  local function charge(n, ws, cost, capped, now, g, L)
    n = n + cost
    if capped and n > 2 * L then
      n = 2 * L
    end
    return n, ifmt(ws) .. ':' .. ifmt(cost)
  end

  local function sub(n, ws, k)
    n = n - k
    if n < 0 then
      return 0
    end
    return n
  end

  -- a charge of an earlier window is not given back: that window is over.
  local function refund(n, ws, token, lim)
    local w, k = string.match(token, '^(%-?%d+):(%d+)$')
    if w and tonumber(w) == ws then
      k = tonumber(k)
      if lim > 0 and lim < k then
        k = lim
      end
      return sub(n, ws, k)
    end
    return n
  end

  local function write(key, g, n, ws, now, margin, L, W)
    if n <= 0 then
      redis.call('DEL', key)
      return
    end
    redis.call('HSET', key, 'w', ifmt(ws), 'c', ifmt(n))
    redis.call('PEXPIRE', key, ms(ws + W - now) + margin)
  end

  -- remaining, reset after, next after, retry after (for cost).
  local function figures(n, ws, now, cost, L, W)
    local wait = ws + W - now
    local reset, retry = 0, 0
    if n > 0 then
      reset = wait
    end
    if n + cost > L then
      retry = wait
    end
    return L - n, reset, reset, retry
  end

  return read, fits, room, charge, sub, refund, write, figures
end
