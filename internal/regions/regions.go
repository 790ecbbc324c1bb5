package regions

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Errors. Calls wrap them with the operation; match with errors.Is.
var (
	// ErrInvalid: a limit, a fleet, a configuration or a message that
	// breaks a documented bound. Nothing was changed.
	ErrInvalid = errors.New("regions: invalid")
	// ErrLimitMismatch: a message names a counter with another limit than
	// the one the ledger holds for it (the rule changed while the message
	// travelled). Nothing was changed.
	ErrLimitMismatch = errors.New("regions: limit mismatch")
	// ErrNotMine: a message addressed to another region.
	ErrNotMine = errors.New("regions: not addressed to this region")
)

// LimitMismatchError is ErrLimitMismatch with the limit the ledger holds
// for the counter: the limit its region's gateways last decided it with
// (the rule's, or one an override or a penalty cut or raised). The
// region's agent reports the counter under that limit.
type LimitMismatchError struct {
	Counter     string
	Held, Asked Limit
}

func (e *LimitMismatchError) Error() string {
	return fmt.Sprintf("%v: counter %q holds %+v, asked %+v", ErrLimitMismatch, e.Counter, e.Held, e.Asked)
}

// Unwrap makes errors.Is(err, ErrLimitMismatch) hold.
func (e *LimitMismatchError) Unwrap() error { return ErrLimitMismatch }

// Kind is how a counter's units are shared, which follows from its
// algorithm (KindOf).
type Kind uint8

// Kinds.
const (
	// FixedWindow: a share per window of the rule, windows aligned to the
	// Unix epoch; a loan names the windows it is for.
	FixedWindow Kind = iota + 1
	// SlidingWindow: a share of the units admitted over the trailing
	// window (sliding_window_log, sliding_window_counter); units a region
	// admitted count against it until they slide out.
	SlidingWindow
	// Bucket: a share of the capacity and, in the same proportion, of the
	// refill rate (token_bucket, gcra).
	Bucket
)

func (k Kind) String() string {
	switch k {
	case FixedWindow:
		return "fixed_window"
	case SlidingWindow:
		return "sliding_window"
	case Bucket:
		return "bucket"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// KindOf is the kind of a rule's algorithm, by its name in the rules file.
func KindOf(algorithm string) (Kind, error) {
	switch algorithm {
	case "fixed_window":
		return FixedWindow, nil
	case "sliding_window_log", "sliding_window_counter":
		return SlidingWindow, nil
	case "token_bucket", "gcra":
		return Bucket, nil
	}
	return 0, fmt.Errorf("%w: algorithm %q", ErrInvalid, algorithm)
}

// Limit is a global rule's limit as the protocol sees it.
type Limit struct {
	Kind Kind
	// Units is L: the units per window, or a bucket's capacity.
	Units int64
	// Window is W in microseconds: the rule's window, or for a bucket the
	// time an empty bucket takes to refill (capacity ÷ rate), so that a
	// share of s units refills at s/W per microsecond.
	Window int64
}

// maxUnitTime bounds Units × Window so that exact bucket arithmetic
// (tokens scaled by Window) never overflows int64.
const maxUnitTime = 1 << 60

// Validate reports what is wrong with the limit under cfg, every problem
// at once.
func (l Limit) Validate(cfg Config) error {
	var errs []error
	if l.Kind < FixedWindow || l.Kind > Bucket {
		errs = append(errs, fmt.Errorf("%w: kind %d", ErrInvalid, l.Kind))
	}
	if l.Units < 0 {
		errs = append(errs, fmt.Errorf("%w: units %d < 0", ErrInvalid, l.Units))
	}
	if l.Window <= 0 {
		errs = append(errs, fmt.Errorf("%w: window %dµs <= 0", ErrInvalid, l.Window))
	} else if l.Units > 0 && l.Units > maxUnitTime/l.Window {
		errs = append(errs, fmt.Errorf("%w: units × window %d × %dµs too large", ErrInvalid, l.Units, l.Window))
	}
	if l.Kind == FixedWindow && l.Window > 0 && l.Window < 4*cfg.Skew {
		// The skew bands at a window's two ends must not meet, and a
		// loan is used only from Skew after its start to Skew before its
		// end: a window shorter than four skews would lose half of it.
		errs = append(errs, fmt.Errorf("%w: a global fixed window of %dµs is shorter than 4 × the skew bound (%dµs)", ErrInvalid, l.Window, cfg.Skew))
	}
	return errors.Join(errs...)
}

// slotLen is the length of the slots loans are counted in: the window for
// fixed windows (a loan names windows), the period otherwise.
func (l Limit) slotLen(cfg Config) int64 {
	if l.Kind == FixedWindow {
		return l.Window
	}
	return cfg.Period
}

// Defaults of Config.
const (
	DefaultPeriod          = 1_000_000 // µs
	DefaultSkew            = 100_000   // µs
	DefaultHotFraction     = 0.5
	DefaultHeadroom        = 1.25
	DefaultTolerance       = 0.01
	DefaultFailoverPeriods = 3
	DefaultPlanOffset      = DefaultPeriod / 4
)

// Config is the protocol's settings, the same in every region.
type Config struct {
	// Period is the rebalance period in microseconds (default 1 s):
	// regions report at each period boundary, the coordinator plans
	// once per period, and a loan of a sliding window or a bucket lasts
	// until the end of the period after the one it was made in.
	Period int64
	// Skew is the clock skew bound in microseconds (default 100 ms):
	// every region's clock is within Skew of true time, at a steady
	// offset. Loans start Skew late and end Skew early at the receiver,
	// the giver reuses units Skew after a loan's end, and a fixed window
	// holds at most its share at every offset within Skew (band.go).
	Skew int64
	// HotFraction (default 0.5): a counter is hot in a region when it
	// rejected in the last period, or its demand in the period exceeds
	// this fraction of what its static share admits in a period. Only hot
	// counters and counters holding loans are reported.
	HotFraction float64
	// Headroom (default 1.25): a region's need is its demand rate over
	// the window times Headroom.
	Headroom float64
	// Tolerance (default 0.01): as a fraction of L, how far a region's
	// share may be from its target before the coordinator moves units
	// (converged: every share within Tolerance × L of its target).
	Tolerance float64
	// FailoverPeriods (default 3): a region that has heard no coordinator
	// for FailoverPeriods + 2 × its place in the fleet's order periods
	// starts one with a higher epoch.
	FailoverPeriods int
	// PlanOffset is how long after a period boundary the coordinator
	// plans (default Period/4), so the regions' reports of the period
	// have arrived.
	PlanOffset int64
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Period = cmp.Or(c.Period, DefaultPeriod)
	c.Skew = cmp.Or(c.Skew, DefaultSkew)
	c.HotFraction = cmp.Or(c.HotFraction, DefaultHotFraction)
	c.Headroom = cmp.Or(c.Headroom, DefaultHeadroom)
	c.Tolerance = cmp.Or(c.Tolerance, DefaultTolerance)
	c.FailoverPeriods = cmp.Or(c.FailoverPeriods, DefaultFailoverPeriods)
	c.PlanOffset = cmp.Or(c.PlanOffset, c.Period/4)
	return c
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Period <= 0 {
		errs = append(errs, fmt.Errorf("%w: period %dµs <= 0", ErrInvalid, c.Period))
	}
	if c.Skew < 0 {
		errs = append(errs, fmt.Errorf("%w: skew %dµs < 0", ErrInvalid, c.Skew))
	}
	if c.Period > 0 && c.Skew >= 0 && 4*c.Skew >= c.Period {
		errs = append(errs, fmt.Errorf("%w: skew %dµs must be under a quarter of the period %dµs", ErrInvalid, c.Skew, c.Period))
	}
	if !(c.HotFraction > 0 && c.HotFraction <= 1) {
		errs = append(errs, fmt.Errorf("%w: hot fraction %v not in (0, 1]", ErrInvalid, c.HotFraction))
	}
	if !(c.Headroom >= 1 && c.Headroom <= 10) {
		errs = append(errs, fmt.Errorf("%w: headroom %v not in [1, 10]", ErrInvalid, c.Headroom))
	}
	if !(c.Tolerance >= 0 && c.Tolerance < 0.5) {
		errs = append(errs, fmt.Errorf("%w: tolerance %v not in [0, 0.5)", ErrInvalid, c.Tolerance))
	}
	if c.FailoverPeriods < 1 {
		errs = append(errs, fmt.Errorf("%w: failover periods %d < 1", ErrInvalid, c.FailoverPeriods))
	}
	if c.PlanOffset < 0 || c.PlanOffset >= c.Period {
		errs = append(errs, fmt.Errorf("%w: plan offset %dµs not in [0, period)", ErrInvalid, c.PlanOffset))
	}
	return errors.Join(errs...)
}

// WeightScale is what a weight of 1 is: weights are parts per million.
const WeightScale = 1_000_000

// MaxRegions is the most regions a fleet may have (an epoch names its
// region in 8 bits).
const MaxRegions = 255

// Member is one region of the fleet.
type Member struct {
	// Name is the region's name: 1 to 64 bytes of [a-z0-9-].
	Name string
	// Weight is the region's static part of every global limit, in parts
	// per million; the weights of a fleet sum to at most WeightScale.
	Weight int64
}

// Fleet is every region, in the order in which they stand for coordinator.
type Fleet struct {
	Members []Member
}

// EqualFleet is a fleet of the named regions with equal weights summing to
// 1 (the first regions take the millionths that do not divide evenly).
func EqualFleet(names ...string) Fleet {
	f := Fleet{Members: make([]Member, len(names))}
	n := int64(len(names))
	for i, name := range names {
		w := int64(WeightScale) / max(n, 1)
		if int64(i) < int64(WeightScale)%max(n, 1) {
			w++
		}
		f.Members[i] = Member{Name: name, Weight: w}
	}
	return f
}

// Validate reports every problem of f at once.
func (f Fleet) Validate() error {
	var errs []error
	if len(f.Members) == 0 || len(f.Members) > MaxRegions {
		errs = append(errs, fmt.Errorf("%w: %d regions, want 1 to %d", ErrInvalid, len(f.Members), MaxRegions))
	}
	var sum int64
	seen := map[string]bool{}
	for _, m := range f.Members {
		if !validName(m.Name) {
			errs = append(errs, fmt.Errorf("%w: region name %q (1 to 64 of a-z, 0-9, -)", ErrInvalid, m.Name))
		}
		if seen[m.Name] {
			errs = append(errs, fmt.Errorf("%w: region %q twice", ErrInvalid, m.Name))
		}
		seen[m.Name] = true
		if m.Weight < 0 || m.Weight > WeightScale {
			errs = append(errs, fmt.Errorf("%w: region %q weight %d not in [0, %d]", ErrInvalid, m.Name, m.Weight, WeightScale))
		} else {
			sum += m.Weight
		}
	}
	if sum > WeightScale {
		errs = append(errs, fmt.Errorf("%w: weights sum to %d > %d", ErrInvalid, sum, WeightScale))
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Index is the region's place in the fleet, or -1.
func (f Fleet) Index(name string) int {
	return slices.IndexFunc(f.Members, func(m Member) bool { return m.Name == name })
}

// Place checks what a Store of region in fleet is built from: cfg with its
// defaults, valid; fleet valid; region in it. It returns cfg with defaults
// and the region's index in the fleet.
func Place(cfg Config, fleet Fleet, region string) (Config, int, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, -1, err
	}
	if err := fleet.Validate(); err != nil {
		return cfg, -1, err
	}
	i := fleet.Index(region)
	if i < 0 {
		return cfg, -1, fmt.Errorf("%w: region %q not in the fleet", ErrInvalid, region)
	}
	return cfg, i, nil
}

// Static is every region's static share of units, in the fleet's order
// (StaticShares of the weights).
func (f Fleet) Static(units int64) []int64 {
	w := make([]int64, len(f.Members))
	for i, m := range f.Members {
		w[i] = m.Weight
	}
	s, err := StaticShares(units, w)
	if err != nil {
		// A validated fleet and a validated limit never get here; a share
		// of nothing is the safe answer.
		return make([]int64, len(f.Members))
	}
	return s
}

// StaticShares splits units by weights (parts per million, summing to at
// most WeightScale) with largest-remainder rounding: the shares sum to
// floor(units × Σw / WeightScale) — every unit when the weights sum to 1 —
// each share is its exact quota rounded down or up, and ties go to the
// region that comes first. With fewer units than regions some shares are 0.
func StaticShares(units int64, weights []int64) ([]int64, error) {
	if units < 0 {
		return nil, fmt.Errorf("%w: units %d < 0", ErrInvalid, units)
	}
	var sum int64
	for _, w := range weights {
		if w < 0 || w > WeightScale {
			return nil, fmt.Errorf("%w: weight %d not in [0, %d]", ErrInvalid, w, WeightScale)
		}
		sum += w
	}
	if sum > WeightScale {
		return nil, fmt.Errorf("%w: weights sum to %d > %d", ErrInvalid, sum, WeightScale)
	}
	total, _ := mulDiv(units, sum, WeightScale)
	return largestRemainder(total, units, weights, WeightScale), nil
}

// largestRemainder splits total units among parts: part i's quota is
// units × parts[i] / denom; each gets its quota rounded down, and the
// units left go one each to the largest remainders (ties: lower index).
// total must be at most Σ quotas rounded up, which holds for total =
// floor(Σ quotas).
func largestRemainder(total, units int64, parts []int64, denom int64) []int64 {
	shares := make([]int64, len(parts))
	rems := make([]int64, len(parts))
	var given int64
	for i, p := range parts {
		shares[i], rems[i] = mulDiv(units, p, denom)
		given += shares[i]
	}
	for _, i := range largestFirst(rems) {
		if given >= total {
			break
		}
		if rems[i] > 0 {
			shares[i]++
			given++
		}
	}
	return shares
}

// largestFirst is the indexes of xs, largest first (ties: lower index first).
func largestFirst(xs []int64) []int {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case xs[a] > xs[b]:
			return -1
		case xs[a] < xs[b]:
			return 1
		}
		return 0
	})
	return idx
}

// mulDiv returns floor(a × b / d) and the remainder, for non-negative a, b
// and positive d, without overflowing (the quotient must fit in int64).
func mulDiv(a, b, d int64) (q, r int64) {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(d) {
		return math.MaxInt64, 0
	}
	uq, ur := bits.Div64(hi, lo, uint64(d))
	if uq > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(uq), int64(ur)
}

// Epoch is a coordinator's term and the region it runs in: a higher epoch
// deposes a lower one. Two regions never make the same epoch.
type Epoch uint64

// NewEpoch is the epoch of term run by the fleet's region at index.
func NewEpoch(term uint64, index int) Epoch { return Epoch(term<<8 | uint64(index+1)&0xff) }

// Term is the epoch's term.
func (e Epoch) Term() uint64 { return uint64(e) >> 8 }

// Index is the fleet index of the region that runs the epoch's
// coordinator, or -1 for the zero epoch.
func (e Epoch) Index() int { return int(uint64(e)&0xff) - 1 }

func (e Epoch) String() string { return fmt.Sprintf("%d.%d", e.Term(), e.Index()) }

// fdiv is floor division for a positive divisor.
func fdiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
