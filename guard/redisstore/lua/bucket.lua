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
--   value (SPEC §8: at most 88 bytes), it cannot rescale its debt when its
--   limit or rate changes: the debt *time* carries over, i.e. the fraction
--   of the burst consumed, not the units (token_bucket carries units).
-- A missing key is a full bucket; a bucket that refills completely is deleted.
--
-- make_bucket() returns the token_bucket and gcra implementations (tables
-- of load, save, fits, add, sub, refund, stats, free). Lua creates a function
-- value every time a script runs its definition, so a call creates the
-- algorithms only when one of its counters uses them (measured: ~10 % more
-- calls/s for one token-bucket counter, docs/benchmarks.md).

local function make_bucket()
  local function tb_load(c, now)
    local v = redis.call('HMGET', c.key, 'd', 't', 's')
    local z, ts, s = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    local A, B, k = c.b, c.c, c.d
    if not z or not ts then
      z, ts = 0, now
    else
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
    end
    c.z, c.ts = z, ts
  end

  local function tb_save(c, now, margin)
    if c.z <= 0 then
      redis.call('DEL', c.key)
      return
    end
    redis.call('HSET', c.key, 'd', ifmt(c.z), 't', ifmt(c.ts), 's', ifmt(c.b))
    local full = c.ts + cdiv(c.z, c.c) * c.d - now
    redis.call('PEXPIRE', c.key, ms(full) + margin)
  end

  local function gcra_load(c, now)
    local tat = tonumber(redis.call('GET', c.key) or '0') or 0
    local z = 0
    if tat > now then
      z = cdiv(tat - now, c.d) * c.c
    end
    c.z, c.ts = z, now
  end

  local function gcra_save(c, now, margin)
    if c.z <= 0 then
      redis.call('DEL', c.key)
      return
    end
    local rel = cdiv(c.z, c.c) * c.d
    redis.call('SET', c.key, ifmt(now + rel), 'PX', ms(rel) + margin)
  end

  local function bucket_fits(c, cost)
    return c.z + cost * c.b <= c.a * c.b
  end

  local function bucket_add(c, cost, capped)
    c.z = c.z + cost * c.b
    if capped and c.z > 2 * c.a * c.b then
      c.z = 2 * c.a * c.b
    end
    return tostring(cost)
  end

  local function bucket_sub(c, n)
    c.z = c.z - n * c.b
    if c.z < 0 then
      c.z = 0
    end
  end

  -- refund: give back the units of the charge named by token (the units
  -- charged), at most lim of them when lim > 0.
  local function bucket_refund(c, token, lim)
    local n = tonumber(token)
    if n and lim > 0 and lim < n then
      n = lim
    end
    if n and n > 0 then
      bucket_sub(c, n)
    end
  end

  -- gcra keeps its debt on the tick grid (a whole number of ticks of debt
  -- time, rounded up), as stored, so its figures match what is read back.
  local function gcra_round(c)
    c.z = cdiv(c.z, c.c) * c.c
  end

  local function gcra_add(c, cost, capped)
    local tok = bucket_add(c, cost, capped)
    gcra_round(c)
    return tok
  end

  local function gcra_sub(c, n)
    bucket_sub(c, n)
    gcra_round(c)
  end

  local function gcra_refund(c, token, lim)
    bucket_refund(c, token, lim)
    gcra_round(c)
  end

  -- time (µs from now) until the debt is at most target*A.
  local function bucket_until(c, now, target)
    local need = c.z - target * c.b
    if need <= 0 then
      return 0
    end
    local t = c.ts + cdiv(need, c.c) * c.d - now
    if t < 0 then
      return 0
    end
    return t
  end

  -- whole units available now.
  local function bucket_free(c)
    return fdiv(c.a * c.b - c.z, c.b)
  end

  -- remaining, reset after, next after, retry after (for cost).
  local function bucket_stats(c, now, cost)
    local L = c.a
    local rem = fdiv(L * c.b - c.z, c.b)
    local nxt = 0
    if rem < L then
      nxt = bucket_until(c, now, L - rem - 1)
    end
    return rem, bucket_until(c, now, 0), nxt, bucket_until(c, now, L - cost)
  end

  return {
    { load = tb_load, save = tb_save, fits = bucket_fits, add = bucket_add,
      sub = bucket_sub, refund = bucket_refund, stats = bucket_stats, free = bucket_free },
    { load = gcra_load, save = gcra_save, fits = bucket_fits, add = gcra_add,
      sub = gcra_sub, refund = gcra_refund, stats = bucket_stats, free = bucket_free },
  }
end
