-- fixed.lua: the fixed-window arithmetic of regions.Ledger, on a table
-- loaded by rg_load, for a limit of W µs windows (aligned to the Unix
-- epoch), static share S and skew bound K (µs). Every function answers
-- exactly what the Ledger's function of the same name answers.
--
-- fw_share(st, S, j)        the share of window j: S, less the loans given
--                           that cover j, plus the loans received that do
-- fw_charged(W, K, now)     the windows an admission at now counts in: its
--                           own, then the one before if its start is less
--                           than K ago, then the next if it starts within K
-- fw_prune(st, W, K, now)   drops loans and windows that can no longer
--                           count; true when it dropped something
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

local function fw_charged(W, K, now)
  local j = rg_fdiv(now, W)
  local ws = { j }
  if now - j * W < K then
    ws[#ws + 1] = j - 1
  end
  if (j + 1) * W - now <= K then
    ws[#ws + 1] = j + 1
  end
  return ws
end

local function fw_prune(st, W, K, now)
  local dropped = false
  for id, o in pairs(st.outs) do
    if now >= (o.last + 1) * W + K then
      st.outs[id] = nil
      dropped = true
    end
  end
  for id, r in pairs(st.ins) do
    if now >= (r.last + 1) * W + K then
      st.ins[id] = nil
      dropped = true
    end
  end
  local cur = rg_fdiv(now - K, W)
  for j in pairs(st.n) do
    if j < cur then
      st.n[j] = nil
      dropped = true
    end
  end
  return dropped
end

local function fw_needed(W, K)
  return function(st)
    local t = st.promise
    for _, o in pairs(st.outs) do
      t = math.max(t, (o.last + 1) * W + K)
    end
    for _, r in pairs(st.ins) do
      t = math.max(t, (r.last + 1) * W + K)
    end
    for j in pairs(st.n) do
      t = math.max(t, (j + 1) * W + K)
    end
    return t
  end
end

-- fw_each_break calls visit with each window where the share or the
-- count can change: each counted window and the one after it, each
-- loan's first window and the one after its last.
local function fw_each_break(st, visit)
  for m in pairs(st.n) do
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
  local j = rg_fdiv(now, W)
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
    if t < (m + 1) * W - K and fw_share(st, S, m) - (st.n[m] or 0) >= cost then
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
      local r = fw_share(st, S, j) - (st.n[j] or 0) - fw_keep(j, cur, keep, kcur)
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
