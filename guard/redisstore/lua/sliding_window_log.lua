-- sliding_window_log.lua: at most L units in any window (now - W, now].
--
-- Counter fields (ARGV per counter): a = L, b = W (µs).
-- State, a sorted set: one member per charge, score = its time (µs), member =
-- "<time>:<seq>:<units>". seq makes members unique when charges share a
-- microsecond (seq = 1 + the largest seq at that time). Refund token: the
-- member. Memory grows with the number of charges in a window: use it for
-- small limits.
--
-- Entries are kept in Redis order: by score, then member bytes.
--
-- make_sliding_window_log() returns the implementation table (see
-- make_bucket).

local function make_sliding_window_log()
  local function swl_parse(m)
    local ts, seq, n = string.match(m, '^(%-?%d+):(%d+):(%d+)$')
    return tonumber(ts), tonumber(seq), tonumber(n)
  end

  local function swl_load(c, now)
    local v = redis.call('ZRANGEBYSCORE', c.key, '(' .. ifmt(now - c.b), '+inf')
    local es, u = {}, 0
    for i = 1, #v do
      local ts, seq, n = swl_parse(v[i])
      es[#es + 1] = { m = v[i], ts = ts, seq = seq, n = n }
      u = u + n
    end
    c.es, c.u, c.adds, c.dels = es, u, {}, {}
  end

  local function swl_nextseq(c, ts)
    local s = 0
    for i = 1, #c.es do
      local e = c.es[i]
      if e.ts == ts and e.seq > s then
        s = e.seq
      end
    end
    return s + 1
  end

  local function swl_insert(c, ts, n)
    local m = ifmt(ts) .. ':' .. ifmt(swl_nextseq(c, ts)) .. ':' .. ifmt(n)
    local e = { m = m, ts = ts, n = n, seq = 0 }
    e.seq = select(2, swl_parse(m))
    -- keep Redis order: by score, then member bytes
    local pos = #c.es + 1
    for i = 1, #c.es do
      local o = c.es[i]
      if o.ts > ts or (o.ts == ts and o.m > m) then
        pos = i
        break
      end
    end
    table.insert(c.es, pos, e)
    c.adds[#c.adds + 1] = e
    c.u = c.u + n
    return m
  end

  local function swl_remove(c, i)
    local e = table.remove(c.es, i)
    c.dels[#c.dels + 1] = e.m
    c.u = c.u - e.n
    return e
  end

  local function swl_fits(c, cost)
    return c.u + cost <= c.a
  end

  local function swl_add(c, cost, capped, now)
    if capped and c.u + cost > 2 * c.a then
      cost = 2 * c.a - c.u
    end
    if cost <= 0 then
      return ''
    end
    return swl_insert(c, now, cost)
  end

  local function swl_sub(c, n)
    while n > 0 and #c.es > 0 do
      local e = c.es[1]
      if e.n <= n then
        swl_remove(c, 1)
        n = n - e.n
      else
        swl_remove(c, 1)
        swl_insert(c, e.ts, e.n - n)
        n = 0
      end
    end
  end

  -- a member is refunded whole: leases, which return part of a charge,
  -- are never granted on a log (free is 0).
  local function swl_refund(c, token, lim)
    for i = 1, #c.es do
      if c.es[i].m == token then
        swl_remove(c, i)
        return
      end
    end
  end

  local function swl_save(c, now, margin)
    redis.call('ZREMRANGEBYSCORE', c.key, '-inf', ifmt(now - c.b))
    for i = 1, #c.dels do
      redis.call('ZREM', c.key, c.dels[i])
    end
    for i = 1, #c.adds do
      local e = c.adds[i]
      redis.call('ZADD', c.key, ifmt(e.ts), e.m)
    end
    if #c.es == 0 then
      redis.call('DEL', c.key)
      return
    end
    redis.call('PEXPIRE', c.key, ms(c.es[#c.es].ts + c.b - now) + margin)
  end

  -- time until the units in the window are at most target.
  local function swl_until(c, now, target)
    local acc = c.u
    if acc <= target then
      return 0
    end
    for i = 1, #c.es do
      local e = c.es[i]
      acc = acc - e.n
      if acc <= target then
        local t = e.ts + c.b - now
        if t < 0 then
          return 0
        end
        return t
      end
    end
    return 0
  end

  local function swl_stats(c, now, cost)
    local L = c.a
    local rem = L - c.u
    local nxt = 0
    if rem < L then
      nxt = swl_until(c, now, L - rem - 1)
    end
    return rem, swl_until(c, now, 0), nxt, swl_until(c, now, L - cost)
  end

  local function swl_free(c)
    return 0
  end

  return { load = swl_load, save = swl_save, fits = swl_fits, add = swl_add,
    sub = swl_sub, refund = swl_refund, stats = swl_stats, free = swl_free }
end
