-- bucket.lua: token_bucket and gcra, the refilling algorithms.
--
-- Both keep the counter's debt z: the units consumed and not yet refilled,
-- scaled by A (one unit = A), refilled by B per tick of k microseconds.
-- Capacity L holds L*A. The Go side derives A, B, k from the rule's limit L
-- and full-refill time F = FullNum/FullDen µs so that 2*L*A < 2^53:
--   A = F's numerator in ticks, B = L * F's denominator in ticks.
--
-- Counter fields (ARGV per counter): a = L, b = A, c = B, d = k.
--
-- token_bucket state, a hash:  d = z, t = time of the last refill (µs),
--   s = the A the debt was scaled with (so a changed rate or capacity
--   rescales the debt: consumed units carry over).
-- gcra state, one integer string: the theoretical arrival time (TAT, µs),
--   i.e. the time the bucket is full again; the debt is
--   ceil((TAT - now) / k) * B. Debt is rounded up to a whole tick, so a gcra
--   counter never admits more than the equivalent token bucket (it is the
--   same when the emission interval is a whole number of ticks). Holding one
--   value (at most 88 bytes), it cannot rescale its debt when its
--   limit or rate changes: the debt *time* carries over, i.e. the fraction
--   of the burst consumed, not the units (token_bucket carries units).
-- A missing key is a full bucket; a bucket that refills completely is deleted.
--
-- bucket_parts() returns the algorithms' parts (see decide.lua's header
-- for the interface): read, fits, room, charge, sub, refund, write,
-- figures, on the state as plain values: x = the debt z, y = its time ts;
-- g is true for gcra. Lua creates a function value every time a script
-- runs its definition, so a call creates them only when one of its
-- counters uses them.

local function bucket_parts()
  -- the debt z and its time ts, refilled up to now.
  local function read(key, now, gcra, L, A, B, k)
    if gcra then
      local tat = tonumber(redis.call('GET', key) or '0') or 0
      if tat > now then
        return cdiv(tat - now, k) * B, now
      end
      return 0, now
    end
    local v = redis.call('HMGET', key, 'd', 't', 's')
    local z, ts, s = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    if not z or not ts then
      return 0, now
    end
    if s and s ~= A and s > 0 then
      z = cdiv(z * A, s)
    end
    if now > ts then
      local e = fdiv(now - ts, k)
      if e > 0 then
        if e >= cdiv(z, B) then
          z = 0
        else
          z = z - e * B
        end
        ts = ts + e * k
      end
    end
    return z, ts
  end

  local function fits(z, ts, cost, L, A)
    return z + cost * A <= L * A
  end

  -- whole units available now.
  local function room(z, ts, L, A)
    return fdiv(L * A - z, A)
  end

  -- the debt after charging n units (capped: at most two full limits, for
  -- report), and the refund token (the units). gcra keeps its debt on the
  -- tick grid (a whole number of ticks of debt time, rounded up), as
  -- stored, so its figures match what is read back.
  local function charge(z, ts, n, capped, now, gcra, L, A, B)
    z = z + n * A
    if capped and z > 2 * L * A then
      z = 2 * L * A
    end
    if gcra then
      z = cdiv(z, B) * B
    end
    return z, tostring(n)
  end

  -- the debt after giving n units back.
  local function sub(z, ts, n, gcra, L, A, B)
    z = z - n * A
    if z < 0 then
      z = 0
    end
    if gcra then
      z = cdiv(z, B) * B
    end
    return z
  end

  -- the debt after giving back the units of the charge named by token
  -- (the units charged), at most lim of them when lim > 0.
  local function refund(z, ts, token, lim, gcra, L, A, B)
    local n = tonumber(token)
    if n and lim > 0 and lim < n then
      n = lim
    end
    if n and n > 0 then
      return sub(z, ts, n, gcra, L, A, B)
    end
    return z
  end

  local function write(key, gcra, z, ts, now, margin, L, A, B, k)
    if z <= 0 then
      redis.call('DEL', key)
    elseif gcra then
      local rel = cdiv(z, B) * k
      redis.call('SET', key, ifmt(now + rel), 'PX', ms(rel) + margin)
    else
      redis.call('HSET', key, 'd', ifmt(z), 't', ifmt(ts), 's', ifmt(A))
      redis.call('PEXPIRE', key, ms(ts + cdiv(z, B) * k - now) + margin)
    end
  end

  -- time (µs from now) until the debt is at most target*A.
  local function untl(z, ts, now, target, A, B, k)
    local need = z - target * A
    if need <= 0 then
      return 0
    end
    local t = ts + cdiv(need, B) * k - now
    if t < 0 then
      return 0
    end
    return t
  end

  -- remaining, reset after, next after, retry after (for cost).
  local function figures(z, ts, now, cost, L, A, B, k)
    local rem = fdiv(L * A - z, A)
    local nxt = 0
    if rem < L then
      nxt = untl(z, ts, now, L - rem - 1, A, B, k)
    end
    return rem, untl(z, ts, now, 0, A, B, k), nxt, untl(z, ts, now, L - cost, A, B, k)
  end

  return read, fits, room, charge, sub, refund, write, figures
end
