-- fixed.lua: the fixed-window arithmetic of regions.Ledger, on a table
-- loaded by rg_load, for a limit of W µs windows (aligned to the Unix
-- epoch), static share S and skew bound K (µs). Every function answers
-- exactly what the Ledger's function of the same name answers.
--
-- A window's count (regions.Ledger, band.go): the time within K of
-- boundary j, [jW-K, jW+K), is the band of boundary j, counted in 2 ×
-- FW_SLOTS slots (st.b[j], slot q at index q+1); the rest of window j,
-- [jW+K, (j+1)W-K), is its body (st.n[j]). Window j holds what the most
-- of its intervals [jW+d, (j+1)W+d), |d| <= K, holds: its body, band j's
-- slots from the one holding jW+d, band j+1's up to the one holding
-- (j+1)W+d (a slot covered in part counts whole).
--
-- fw_share(st, S, j)        the share of window j: S, less the loans given
--                           that cover j, plus the loans received that do
-- fw_cell(W, K, now)        the cell an admission at now counts in: j and
--                           q, slot q of band j, or q = -1, the body of j
-- fw_charged(W, K, now)     the windows an admission at now counts in: its
--                           own, then the neighbour across the band's
--                           boundary when now is in a band
-- fw_used(st, j)            what window j holds
-- fw_room(st, S, W, K, now) what an admission at now may take: the least,
--                           over now's windows, of the share less what
--                           the intervals covering now's cell hold
-- fw_count(st, j, q, n)     adds n (may be < 0; never below 0) to a cell;
--                           answers its field and value
-- fw_prune(st, W, K, now)   drops loans and windows that can no longer
--                           count; true when it dropped something
--                           (both walk what st holds: fw_each_held)
-- fw_needed(W, K)           a function of st: the last moment anything in
--                           st can count (for the key's expiry)
-- fw_retry(st, S, W, K, cost, now)  the wait until a window the region is
--                           sure of has room for cost (Ledger.retryFixed)
-- fw_keep(j, cur, keep, kcur)  what is kept of window j for the region's
--                           own demand (Ledger.keepFixed; kcur is the keep
--                           prorated to what is left of window cur, which
--                           the caller computes exactly)

local function fw_share(st, S, j)
  local s = S
  for _, o in pairs(st.outs) do
    if o.first <= j and j <= o.last then
      s = s - o.units
    end
  end
  for _, r in pairs(st.ins) do
    if r.first <= j and j <= r.last then
      s = s + r.units
    end
  end
  return s
end

local FW_SLOTS = 4
local FW_BAND = 2 * FW_SLOTS

local function fw_cell(W, K, now)
  local j = fdiv(now, W)
  local off = now - j * W
  if K > 0 and off < K then
    return j, fdiv((off + K) * FW_SLOTS, K)
  elseif K > 0 and off >= W - K then
    return j + 1, fdiv((off - (W - K)) * FW_SLOTS, K)
  end
  return j, -1
end

local function fw_charged(W, K, now)
  local cj, q = fw_cell(W, K, now)
  if q < 0 then
    return { cj }
  elseif now < cj * W then
    return { cj - 1, cj }
  end
  return { cj, cj - 1 }
end

-- fw_use: the most window j's intervals starting in band j's slots lo to
-- hi hold.
local function fw_use(st, j, lo, hi)
  local n = st.n[j] or 0
  local head, tail = st.b[j], st.b[j + 1]
  if not head and not tail then
    return n
  end
  local suf = { [FW_BAND] = 0 }
  for q = FW_BAND - 1, 0, -1 do
    suf[q] = suf[q + 1] + (head and head[q + 1] or 0)
  end
  local most, run = 0, 0
  for q = 0, FW_BAND - 1 do
    run = run + (tail and tail[q + 1] or 0)
    if q >= lo and q <= hi and suf[q] + n + run > most then
      most = suf[q] + n + run
    end
  end
  return most
end

local function fw_used(st, j)
  return fw_use(st, j, 0, FW_BAND - 1)
end

local function fw_room(st, S, W, K, now)
  local cj, q = fw_cell(W, K, now)
  local r = math.huge
  for _, j in ipairs(fw_charged(W, K, now)) do
    local u
    if q < 0 then
      u = fw_used(st, j)
    elseif cj == j then
      u = fw_use(st, j, 0, q)
    else
      u = fw_use(st, j, q, FW_BAND - 1)
    end
    if fw_share(st, S, j) - u < r then
      r = fw_share(st, S, j) - u
    end
  end
  return r
end

local function fw_count(st, j, q, n)
  if q < 0 then
    st.n[j] = math.max((st.n[j] or 0) + n, 0)
    return 'n:' .. ifmt(j), ifmt(st.n[j])
  end
  local b = st.b[j]
  if not b then
    b = {}
    st.b[j] = b
  end
  for i = 1, FW_BAND do
    b[i] = b[i] or 0
  end
  b[q + 1] = math.max(b[q + 1] + n, 0)
  return 'b:' .. ifmt(j), rg_band(b)
end

-- fw_each_held calls visit(j, t, id) for each window st holds something
-- in: each loan's last window (t: st.outs or st.ins, id: the loan's) and
-- each window or band with a count (t: st.n or st.b, id = j). All of it
-- counts until (j + 1)W + K.
local function fw_each_held(st, visit)
  for id, o in pairs(st.outs) do
    visit(o.last, st.outs, id)
  end
  for id, r in pairs(st.ins) do
    visit(r.last, st.ins, id)
  end
  for j in pairs(st.n) do
    visit(j, st.n, j)
  end
  for j in pairs(st.b) do
    visit(j, st.b, j)
  end
end

local function fw_prune(st, W, K, now)
  local cur = fdiv(now - K, W)
  local dropped = false
  fw_each_held(st, function(j, t, id)
    if j < cur then
      t[id] = nil
      dropped = true
    end
  end)
  return dropped
end

local function fw_needed(W, K)
  return function(st)
    local t = st.promise
    fw_each_held(st, function(j)
      t = math.max(t, (j + 1) * W + K)
    end)
    return t
  end
end

-- fw_each_break calls visit with each window where the share or the
-- count can change: each counted window and the one after it (a band
-- counts in the windows either side of its boundary), each loan's first
-- window and the one after its last.
local function fw_each_break(st, visit)
  for m in pairs(st.n) do
    visit(m)
    visit(m + 1)
  end
  for m in pairs(st.b) do
    visit(m - 1)
    visit(m)
    visit(m + 1)
  end
  for _, o in pairs(st.outs) do
    visit(o.first)
    visit(o.last + 1)
  end
  for _, r in pairs(st.ins) do
    visit(r.first)
    visit(r.last + 1)
  end
end

-- The Ledger tries every window from now's to the one after the last
-- loan; the share and the count only change at a loan's edges and at the
-- windows holding a count, so trying those (and now's window and the next)
-- finds the same first window without walking a far-off loan's gap.
local function fw_retry(st, S, W, K, cost, now)
  local j = fdiv(now, W)
  local last = j + 1
  for _, o in pairs(st.outs) do
    last = math.max(last, o.last + 1)
  end
  for _, r in pairs(st.ins) do
    last = math.max(last, r.last + 1)
  end
  local seen, cand = {}, {}
  local function add(m)
    if m >= j and m <= last and not seen[m] then
      seen[m] = true
      cand[#cand + 1] = m
    end
  end
  add(j)
  add(j + 1)
  fw_each_break(st, add)
  table.sort(cand)
  for _, m in ipairs(cand) do
    local t = math.max(now, m * W + K)
    if t < (m + 1) * W - K and fw_share(st, S, m) - fw_used(st, m) >= cost then
      return t - now
    end
  end
  return (last + 1) * W + K - now
end

local function fw_keep(j, cur, keep, kcur)
  if j == cur then
    return kcur
  elseif j > cur then
    return keep
  end
  return 0
end

-- fw_minroom(st, S, W, lo, hi, cur, keep, kcur): the least, over windows
-- lo..hi (lo >= cur - 1), of the share less the count less what is kept
-- (math.huge for an empty range). Like fw_retry it tries only the windows
-- where a term can change, which gives the Ledger's minimum over every
-- window however far off a loan names.
local function fw_minroom(st, S, lo, hi, cur, keep, kcur)
  local least = math.huge
  local seen = {}
  local function try(j)
    if j >= lo and j <= hi and not seen[j] then
      seen[j] = true
      local r = fw_share(st, S, j) - fw_used(st, j) - fw_keep(j, cur, keep, kcur)
      if r < least then
        least = r
      end
    end
  end
  try(lo)
  try(cur)
  try(cur + 1)
  fw_each_break(st, try)
  return least
end
