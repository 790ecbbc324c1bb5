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
-- swl_parts() returns the parts (see decide.lua's header for the
-- interface): x is a table holding the counter's key and parameters
-- (a = L, b = W) and its state: es (the entries in the window, in Redis
-- order: m, ts, seq, n), u (their units), adds and dels (entries to write
-- and members to remove); y is unused.

local function swl_parts()
  local function parse(m)
    local ts, seq, n = string.match(m, '^(%-?%d+):(%d+):(%d+)$')
    return tonumber(ts), tonumber(seq), tonumber(n)
  end

  local function read(key, now, g, L, W)
    local c = { key = key, a = L, b = W }
    local v = redis.call('ZRANGEBYSCORE', key, '(' .. ifmt(now - W), '+inf')
    local es, u = {}, 0
    for i = 1, #v do
      local ts, seq, n = parse(v[i])
      es[#es + 1] = { m = v[i], ts = ts, seq = seq, n = n }
      u = u + n
    end
    c.es, c.u, c.adds, c.dels = es, u, {}, {}
    return c, 0
  end

  local function nextseq(c, ts)
    local s = 0
    for i = 1, #c.es do
      local e = c.es[i]
      if e.ts == ts and e.seq > s then
        s = e.seq
      end
    end
    return s + 1
  end

  local function insert(c, ts, n)
    local m = ifmt(ts) .. ':' .. ifmt(nextseq(c, ts)) .. ':' .. ifmt(n)
    local e = { m = m, ts = ts, n = n, seq = 0 }
    e.seq = select(2, parse(m))
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

  local function remove(c, i)
    local e = table.remove(c.es, i)
    c.dels[#c.dels + 1] = e.m
    c.u = c.u - e.n
    return e
  end

  local function fits(c, _, cost)
    return c.u + cost <= c.a
  end

  local function charge(c, _, cost, capped, now)
    if capped and c.u + cost > 2 * c.a then
      cost = 2 * c.a - c.u
    end
    if cost <= 0 then
      return c, ''
    end
    return c, insert(c, now, cost)
  end

  local function sub(c, _, n)
    while n > 0 and #c.es > 0 do
      local e = c.es[1]
      if e.n <= n then
        remove(c, 1)
        n = n - e.n
      else
        remove(c, 1)
        insert(c, e.ts, e.n - n)
        n = 0
      end
    end
    return c
  end

  -- a member is refunded whole: leases, which return part of a charge,
  -- are never granted on a log (room is 0).
  local function refund(c, _, token)
    for i = 1, #c.es do
      if c.es[i].m == token then
        remove(c, i)
        return c
      end
    end
    return c
  end

  local function write(key, g, c, _, now, margin)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', ifmt(now - c.b))
    for i = 1, #c.dels do
      redis.call('ZREM', key, c.dels[i])
    end
    for i = 1, #c.adds do
      local e = c.adds[i]
      redis.call('ZADD', key, ifmt(e.ts), e.m)
    end
    if #c.es == 0 then
      redis.call('DEL', key)
      return
    end
    redis.call('PEXPIRE', key, ms(c.es[#c.es].ts + c.b - now) + margin)
  end

  -- time until the units in the window are at most target.
  local function untl(c, now, target)
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

  local function room()
    return 0
  end

  local function figures(c, _, now, cost)
    local L = c.a
    local rem = L - c.u
    local nxt = 0
    if rem < L then
      nxt = untl(c, now, L - rem - 1)
    end
    return rem, untl(c, now, 0), nxt, untl(c, now, L - cost)
  end

  return read, fits, room, charge, sub, refund, write, figures
end
