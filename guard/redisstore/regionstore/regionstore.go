// Package regionstore keeps a region's shares of global limits in the
// region's Redis: regions.Store (give, receive, state, active) and the
// admission against the share (regions.Ledger's Admit), each one atomic
// Lua script call that answers exactly what regions.Ledger answers for the
// same calls at the same times, for every kind: fixed windows, sliding
// windows and buckets (token bucket and GCRA).
//
// A counter's ledger is one hash whose key is the counter's name followed
// by ":region:" and the region's name, so it shares the counter's Cluster
// hash tag (and slot) with the guard's own key for the counter. The
// counters that may hold loans are listed in one set per region
// (<prefix>:regions:<region>:active), which Give and Receive add to in the
// same round trip as their script and Active prunes. A sliding window's
// admissions over the trailing window are a list beside the hash (the
// hash's key followed by ":log").
package regionstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard/redisstore/internal/luaarith"
	"github.com/tollgate/tollgate/internal/regions"
)

// Errors. Calls wrap them with the operation; match with errors.Is. The
// regions package's sentinels (regions.ErrInvalid, ErrLimitMismatch,
// ErrNotMine) are returned for the same causes as regions.Ledger returns
// them.
var (
	// ErrReply: Redis answered something the store cannot read (a key
	// written by something else, or a script of another version).
	ErrReply = errors.New("regionstore: unreadable reply")
)

// MaxUnits is the largest limit the store holds: every count, share and
// keep stays below 2^53, where the scripts' arithmetic is exact.
const MaxUnits = 1 << 52

// MaxBucketUnitTime bounds a bucket's units × refill time (µs): its tokens
// are kept scaled by the refill time, and stay exact below 2^53 while the
// region's share is at most twice the limit (a share above the limit
// needs loans of more than the other regions hold). For instance a
// bucket refilling in an hour holds up to 625,000 units.
const MaxBucketUnitTime = 1 << 51

//go:embed lua/*.lua
var luaFiles embed.FS

// scriptParts are concatenated, in order, after the exact arithmetic
// (package luaarith), into the one script.
var scriptParts = []string{"lua/ledger.lua", "lua/fixed.lua", "lua/sliding.lua", "lua/bucket.lua", "lua/ops.lua"}

func loadScript() *redis.Script {
	var b strings.Builder
	b.WriteString(luaarith.Source)
	b.WriteByte('\n')
	for _, name := range scriptParts {
		src, err := luaFiles.ReadFile(name)
		if err != nil {
			// Embedded at build time: a missing file is a build defect,
			// caught by the package's tests.
			panic("regionstore: missing embedded " + name)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return redis.NewScript(b.String())
}

var script = loadScript()

// Store is one region's shares in its Redis. It is safe for concurrent
// use, but Give, Receive and Active assume one caller (the region's agent),
// as regions.Store says: Active may drop a counter from the active set
// that a concurrent Give is adding a loan to.
type Store struct {
	client redis.UniversalClient
	cfg    regions.Config
	fleet  regions.Fleet
	region string
	index  int
	active string
	margin int64 // ms
}

var _ regions.Store = (*Store)(nil)

// Option changes a Store's defaults.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithKeyPrefix sets the prefix of the active set's key (default "tg", the
// guard's default key prefix). Counter ledgers are named after their
// counters, which carry the guard's prefix already.
func WithKeyPrefix(p string) Option {
	return optionFunc(func(s *Store) { s.active = p + ":regions:" + s.region + ":active" })
}

// WithExpiryMargin sets how long a counter's ledger is kept after the last
// moment anything in it can count (default 1 minute). After that the
// counter is forgotten, limit included: a call with another limit then
// starts afresh where regions.Ledger would refuse it with
// ErrLimitMismatch for ever.
func WithExpiryMargin(d time.Duration) Option {
	return optionFunc(func(s *Store) { s.margin = max(d.Milliseconds(), 1) })
}

// New is the Store of region in fleet, in client's Redis.
func New(client redis.UniversalClient, cfg regions.Config, fleet regions.Fleet, region string, opts ...Option) (*Store, error) {
	cfg, i, err := regions.Place(cfg, fleet, region)
	if err != nil {
		return nil, fmt.Errorf("regionstore: new: %w", err)
	}
	s := &Store{client: client, cfg: cfg, fleet: fleet, region: region, index: i, margin: 60_000}
	WithKeyPrefix("tg").apply(s)
	for _, o := range opts {
		o.apply(s)
	}
	return s, nil
}

// keys are a counter's ledger hash and its list of admissions (sliding
// windows).
func (s *Store) keys(counter string) []string {
	k := counter + ":region:" + s.region
	return []string{k, k + ":log"}
}

// check refuses what the store cannot hold.
func (s *Store) check(lim regions.Limit) error {
	if err := lim.Validate(s.cfg); err != nil {
		return err
	}
	if lim.Units > MaxUnits {
		return fmt.Errorf("%w: limit of %d units above %d", regions.ErrInvalid, lim.Units, int64(MaxUnits))
	}
	if lim.Kind == regions.Bucket && lim.Units > MaxBucketUnitTime/lim.Window {
		return fmt.Errorf("%w: bucket of %d units refilling in %dµs: units × refill time above %d", regions.ErrInvalid, lim.Units, lim.Window, int64(MaxBucketUnitTime))
	}
	return nil
}

// args are the arguments every op starts with.
func (s *Store) args(op string, lim regions.Limit, now int64) []any {
	return []any{op, now, s.margin, formatLimit(lim), s.fleet.Static(lim.Units)[s.index], s.cfg.Skew, s.cfg.Period}
}

// run runs the script on a counter; with track it also adds the counter to
// the active set, in the same round trip.
func (s *Store) run(ctx context.Context, counter string, track bool, args []any) ([]any, error) {
	keys := s.keys(counter)
	var res any
	var err error
	if track {
		res, err = s.runTracked(ctx, counter, keys, args)
	} else {
		res, err = script.Run(ctx, s.client, keys, args...).Result()
	}
	if err != nil {
		return nil, err
	}
	r, ok := res.([]any)
	if !ok || len(r) == 0 {
		return nil, fmt.Errorf("%w: %T", ErrReply, res)
	}
	status, _ := r[0].(string)
	switch status {
	case "ok", "none":
		return r, nil
	case "mismatch":
		stored := ""
		if len(r) > 1 {
			stored, _ = r[1].(string)
		}
		held, err := parseLimit(stored)
		ls, _ := args[3].(string)
		asked, _ := parseLimit(ls)
		if err != nil {
			return nil, fmt.Errorf("%w: counter %q holds %s", regions.ErrLimitMismatch, counter, stored)
		}
		return nil, &regions.LimitMismatchError{Counter: counter, Held: held, Asked: asked}
	case "invalid":
		msg := ""
		if len(r) > 1 {
			msg, _ = r[1].(string)
		}
		return nil, fmt.Errorf("%w: %s", regions.ErrInvalid, msg)
	}
	return nil, fmt.Errorf("%w: status %q", ErrReply, status)
}

// runTracked pipelines SADD to the active set and the script: one round
// trip (two on the first call after Redis lost its script cache).
func (s *Store) runTracked(ctx context.Context, counter string, keys []string, args []any) (any, error) {
	for attempt := 0; ; attempt++ {
		pipe := s.client.Pipeline()
		add := pipe.SAdd(ctx, s.active, counter)
		var cmd *redis.Cmd
		if attempt == 0 {
			cmd = script.EvalSha(ctx, pipe, keys, args...)
		} else {
			cmd = script.Eval(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx)
		res, err := cmd.Result()
		if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			continue
		}
		if err == nil && add.Err() != nil {
			// The script ran but the counter may be missing from the
			// active set: an error, so the caller asks again (a give and
			// a receive answer the same when asked again by id).
			err = fmt.Errorf("active set: %w", add.Err())
		}
		return res, err
	}
}

// Admit decides an admission of cost against the region's share at now
// and charges it when admitted, as regions.Ledger.Admit does.
func (s *Store) Admit(ctx context.Context, counter string, lim regions.Limit, cost, now int64) (regions.Admission, error) {
	if cost < 0 {
		return regions.Admission{}, fmt.Errorf("regionstore: admit: %w: cost %d", regions.ErrInvalid, cost)
	}
	if err := s.check(lim); err != nil {
		return regions.Admission{}, fmt.Errorf("regionstore: admit: %w", err)
	}
	// No share reaches 2^53 (a bucket's 2^52 tokens × refill time): a
	// larger cost is refused as a smaller one above every share is.
	most := int64(1 << 53)
	if lim.Kind == regions.Bucket {
		most = (1 << 52) / lim.Window
	}
	r, err := s.run(ctx, counter, false, append(s.args("admit", lim, now), min(cost, most)))
	if err != nil {
		return regions.Admission{}, fmt.Errorf("regionstore: admit: %w", err)
	}
	v, err := ints(r, 1, 3)
	if err != nil {
		return regions.Admission{}, fmt.Errorf("regionstore: admit: %w", err)
	}
	return regions.Admission{Allowed: v[0] == 1, Remaining: v[1], RetryAfter: v[2]}, nil
}

// Give implements regions.Store.
func (s *Store) Give(ctx context.Context, o *regions.Order, keep int64, now int64) (regions.Loan, string, error) {
	if err := o.Validate(s.cfg); err != nil {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w", err)
	}
	if o.Loan.From != s.region {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w: loan from %q", regions.ErrNotMine, o.Loan.From)
	}
	if s.fleet.Index(o.Loan.To) < 0 {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w: loan to %q, not in the fleet", regions.ErrInvalid, o.Loan.To)
	}
	lim := o.Loan.Limit
	if err := s.check(lim); err != nil {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w", err)
	}
	// keep over a whole window, prorated for what is left of now's window
	// (regions.Ledger's keepFixed), computed here where it is exact.
	keep = min(max(keep, 0), 1<<53)
	w := lim.Window
	kcur := mulDiv(keep, (fdiv(now, w)+1)*w-now, w)
	extend := 0
	if o.Extend {
		extend = 1
	}
	args := append(s.args("give", lim, now), o.Loan.ID.String(), o.Loan.To, o.Loan.Units, o.Loan.First, o.Loan.Last, extend, keep, kcur)
	r, err := s.run(ctx, o.Loan.Counter, true, args)
	if err != nil {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w", err)
	}
	v, err := ints(r, 1, 3)
	if err != nil {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w", err)
	}
	reason, err := str(r, 4)
	if err != nil {
		return regions.Loan{}, "", fmt.Errorf("regionstore: give: %w", err)
	}
	loan := o.Loan
	loan.Units, loan.First, loan.Last = v[0], v[1], v[2]
	return loan, reason, nil
}

// Receive implements regions.Store.
func (s *Store) Receive(ctx context.Context, t *regions.Transfer, now int64) (bool, string, error) {
	if err := t.Validate(s.cfg); err != nil {
		return false, "", fmt.Errorf("regionstore: receive: %w", err)
	}
	loan := t.Loan
	if loan.To != s.region {
		return false, "", fmt.Errorf("regionstore: receive: %w: loan to %q", regions.ErrNotMine, loan.To)
	}
	if s.fleet.Index(loan.From) < 0 {
		return false, "", fmt.Errorf("regionstore: receive: %w: loan from %q, not in the fleet", regions.ErrInvalid, loan.From)
	}
	if err := s.check(loan.Limit); err != nil {
		return false, "", fmt.Errorf("regionstore: receive: %w", err)
	}
	args := append(s.args("receive", loan.Limit, now), loan.ID.String(), loan.From, loan.Units, loan.First, loan.Last)
	r, err := s.run(ctx, loan.Counter, true, args)
	if err != nil {
		return false, "", fmt.Errorf("regionstore: receive: %w", err)
	}
	v, err := ints(r, 1, 1)
	if err != nil {
		return false, "", fmt.Errorf("regionstore: receive: %w", err)
	}
	reason, err := str(r, 2)
	if err != nil {
		return false, "", fmt.Errorf("regionstore: receive: %w", err)
	}
	return v[0] == 1, reason, nil
}

// State implements regions.Store.
func (s *Store) State(ctx context.Context, counter string, lim regions.Limit, now int64) (regions.CounterState, error) {
	if err := s.check(lim); err != nil {
		return regions.CounterState{}, fmt.Errorf("regionstore: state: %w", err)
	}
	r, err := s.run(ctx, counter, false, s.args("state", lim, now))
	if err != nil {
		return regions.CounterState{}, fmt.Errorf("regionstore: state: %w", err)
	}
	st, err := decodeState(r)
	if err != nil {
		return regions.CounterState{}, fmt.Errorf("regionstore: state: %w", err)
	}
	return st, nil
}

// decodeState reads a state reply: 'ok', share, used, then five values per
// loan given.
func decodeState(r []any) (regions.CounterState, error) {
	var st regions.CounterState
	v, err := ints(r, 1, 2)
	if err != nil {
		return st, err
	}
	st.Share, st.Used = v[0], v[1]
	if (len(r)-3)%5 != 0 {
		return st, fmt.Errorf("%w: state of %d values", ErrReply, len(r))
	}
	for i := 3; i < len(r); i += 5 {
		ids, err := str(r, i)
		if err != nil {
			return st, err
		}
		id, err := parseLoanID(ids)
		if err != nil {
			return st, err
		}
		to, err := str(r, i+1)
		if err != nil {
			return st, err
		}
		n, err := ints(r, i+2, 3)
		if err != nil {
			return st, err
		}
		st.Out = append(st.Out, regions.LoanState{ID: id, To: to, Units: n[0], First: n[1], Last: n[2]})
	}
	slices.SortFunc(st.Out, func(a, b regions.LoanState) int { return a.ID.Compare(b.ID) })
	return st, nil
}

// Active implements regions.Store. It reads the active set, asks every
// counter in it (one pipelined round trip) whether it still holds loans,
// and drops those that do not: three round trips in all.
func (s *Store) Active(ctx context.Context, now int64) ([]regions.Named, error) {
	names, err := s.client.SMembers(ctx, s.active).Result()
	if err != nil {
		return nil, fmt.Errorf("regionstore: active: %w", err)
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	// Load the script first so the pipeline's EVALSHAs find it.
	if err := script.Load(ctx, s.client).Err(); err != nil {
		return nil, fmt.Errorf("regionstore: active: %w", err)
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.Cmd, len(names))
	for i, name := range names {
		cmds[i] = script.EvalSha(ctx, pipe, s.keys(name), "active", now, s.margin, "", 0, s.cfg.Skew, s.cfg.Period)
	}
	_, _ = pipe.Exec(ctx)
	var out []regions.Named
	var gone []any
	for i, name := range names {
		res, err := cmds[i].Result()
		if err != nil {
			return nil, fmt.Errorf("regionstore: active: counter %q: %w", name, err)
		}
		r, ok := res.([]any)
		if !ok {
			return nil, fmt.Errorf("regionstore: active: %w: %T", ErrReply, res)
		}
		v, err := ints(r, 1, 1)
		if err != nil {
			return nil, fmt.Errorf("regionstore: active: %w", err)
		}
		if v[0] == 0 {
			gone = append(gone, name)
			continue
		}
		ls, err := str(r, 2)
		if err != nil {
			return nil, fmt.Errorf("regionstore: active: %w", err)
		}
		lim, err := parseLimit(ls)
		if err != nil {
			return nil, fmt.Errorf("regionstore: active: counter %q: %w", name, err)
		}
		out = append(out, regions.Named{Counter: name, Limit: lim})
	}
	if len(gone) > 0 {
		if err := s.client.SRem(ctx, s.active, gone...).Err(); err != nil {
			return nil, fmt.Errorf("regionstore: active: %w", err)
		}
	}
	return out, nil
}

// Inspect answers a counter's shares at now as regions.Ledger.Inspect
// does, changing nothing; ok is false for a counter the store does not
// hold.
func (s *Store) Inspect(ctx context.Context, counter string, now int64) (regions.Inspection, bool, error) {
	r, err := s.run(ctx, counter, false, []any{"inspect", now, s.margin, "", 0, s.cfg.Skew, s.cfg.Period})
	if err != nil {
		return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w", err)
	}
	if r[0] == "none" {
		return regions.Inspection{}, false, nil
	}
	ls, err := str(r, 1)
	if err != nil {
		return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w", err)
	}
	lim, err := parseLimit(ls)
	if err != nil {
		return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w", err)
	}
	in := regions.Inspection{Kind: lim.Kind, Limit: lim}
	if lim.Kind != regions.FixedWindow {
		v, err := ints(r, 2, 1)
		if err != nil {
			return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w", err)
		}
		in.Share = v[0]
		return in, true, nil
	}
	if (len(r)-2)%3 != 0 {
		return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w: %d values", ErrReply, len(r))
	}
	for i := 2; i < len(r); i += 3 {
		v, err := ints(r, i, 3)
		if err != nil {
			return regions.Inspection{}, false, fmt.Errorf("regionstore: inspect: %w", err)
		}
		in.Windows = append(in.Windows, regions.WindowShare{Window: v[0], Share: v[1], Used: v[2]})
	}
	return in, true, nil
}

// ints reads n integers of a reply from index i.
func ints(r []any, i, n int) ([]int64, error) {
	if i+n > len(r) {
		return nil, fmt.Errorf("%w: %d values, want %d", ErrReply, len(r), i+n)
	}
	v := make([]int64, n)
	for k := range n {
		x, ok := r[i+k].(int64)
		if !ok {
			return nil, fmt.Errorf("%w: value %d is %T", ErrReply, i+k, r[i+k])
		}
		v[k] = x
	}
	return v, nil
}

// str reads a string of a reply at index i.
func str(r []any, i int) (string, error) {
	if i >= len(r) {
		return "", fmt.Errorf("%w: %d values, want %d", ErrReply, len(r), i+1)
	}
	s, ok := r[i].(string)
	if !ok {
		return "", fmt.Errorf("%w: value %d is %T", ErrReply, i, r[i])
	}
	return s, nil
}

// formatLimit is a limit as the ledger hash stores it.
func formatLimit(l regions.Limit) string {
	return strconv.Itoa(int(l.Kind)) + ":" + strconv.FormatInt(l.Units, 10) + ":" + strconv.FormatInt(l.Window, 10)
}

// parseLimit reads a limit stored by formatLimit.
func parseLimit(s string) (regions.Limit, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return regions.Limit{}, fmt.Errorf("%w: limit %q", ErrReply, s)
	}
	k, err1 := strconv.ParseUint(parts[0], 10, 8)
	u, err2 := strconv.ParseInt(parts[1], 10, 64)
	w, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return regions.Limit{}, fmt.Errorf("%w: limit %q", ErrReply, s)
	}
	l := regions.Limit{Kind: regions.Kind(k), Units: u, Window: w}
	if l.Kind < regions.FixedWindow || l.Kind > regions.Bucket || u < 0 || w <= 0 {
		return regions.Limit{}, fmt.Errorf("%w: limit %q", ErrReply, s)
	}
	return l, nil
}

// parseLoanID reads a loan id as regions.LoanID.String writes it: the
// epoch's term and region index, then the sequence number.
func parseLoanID(s string) (regions.LoanID, error) {
	ep, seq, ok := strings.Cut(s, "/")
	term, idx, ok2 := strings.Cut(ep, ".")
	if !ok || !ok2 {
		return regions.LoanID{}, fmt.Errorf("%w: loan id %q", ErrReply, s)
	}
	t, err1 := strconv.ParseUint(term, 10, 56)
	i, err2 := strconv.ParseInt(idx, 10, 16)
	n, err3 := strconv.ParseUint(seq, 10, 64)
	if errors.Join(err1, err2, err3) != nil || i < -1 || i >= regions.MaxRegions {
		return regions.LoanID{}, fmt.Errorf("%w: loan id %q", ErrReply, s)
	}
	id := regions.LoanID{Epoch: regions.NewEpoch(t, int(i)), Seq: n}
	if id.String() != s {
		return regions.LoanID{}, fmt.Errorf("%w: loan id %q", ErrReply, s)
	}
	return id, nil
}

// mulDiv is floor(a × b / d) for non-negative a, b and positive d, exact
// (the quotient below 2^63).
func mulDiv(a, b, d int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	return int64(q)
}

// fdiv is floor division for a positive divisor.
func fdiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
