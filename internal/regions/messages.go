package regions

import (
	"cmp"
	"errors"
	"fmt"
)

// LoanID names a loan: the epoch of the coordinator that ordered it and a
// number that coordinator never used before. A loan is applied at most
// once per ID; an extension keeps the ID.
type LoanID struct {
	Epoch Epoch
	Seq   uint64
}

func (id LoanID) String() string { return fmt.Sprintf("%s/%d", id.Epoch, id.Seq) }

// Compare orders loan ids by epoch, then number: -1, 0 or +1.
func (id LoanID) Compare(o LoanID) int {
	if c := cmp.Compare(id.Epoch, o.Epoch); c != 0 {
		return c
	}
	return cmp.Compare(id.Seq, o.Seq)
}

// Loan is units of one counter lent by one region to another for a run of
// slots (windows for a fixed window, periods otherwise).
type Loan struct {
	ID      LoanID
	Counter string
	Limit   Limit
	From    string
	To      string
	// Units: asked for in an Order (the giver gives up to this); given in
	// a Transfer.
	Units int64
	// First and Last are the first and last slot of the loan (slot n is
	// [n × len, (n+1) × len) of the limit's slot length).
	First, Last int64
}

// MaxCounterName is the longest counter name the protocol carries.
const MaxCounterName = 1024

// Validate reports every problem of l at once.
func (l Loan) Validate(cfg Config) error {
	var errs []error
	if l.ID.Epoch == 0 {
		errs = append(errs, fmt.Errorf("%w: loan without an epoch", ErrInvalid))
	}
	if l.Counter == "" || len(l.Counter) > MaxCounterName {
		errs = append(errs, fmt.Errorf("%w: counter name of %d bytes", ErrInvalid, len(l.Counter)))
	}
	if err := l.Limit.Validate(cfg); err != nil {
		errs = append(errs, err)
	}
	if !validName(l.From) || !validName(l.To) || l.From == l.To {
		errs = append(errs, fmt.Errorf("%w: loan from %q to %q", ErrInvalid, l.From, l.To))
	}
	if l.Units < 0 || l.Units > l.Limit.Units {
		errs = append(errs, fmt.Errorf("%w: loan of %d units of a limit of %d", ErrInvalid, l.Units, l.Limit.Units))
	}
	if l.First < 0 || l.Last < l.First || l.Last-l.First > maxLoanSlots {
		errs = append(errs, fmt.Errorf("%w: loan slots %d to %d", ErrInvalid, l.First, l.Last))
	}
	return errors.Join(errs...)
}

// maxLoanSlots bounds how many slots one loan covers (a fixed window far
// shorter than the period needs several).
const maxLoanSlots = 1024

// Message is what regions and coordinators send each other: *Report,
// *Order, *GiveResult, *Transfer, *Heartbeat or *Fenced.
type Message interface {
	// Validate reports every problem of the message at once.
	Validate(cfg Config) error
	message()
}

// TypeName names m's type as metrics and logs label it: report, order,
// give_result, transfer, heartbeat, fenced (unknown for anything else).
func TypeName(m Message) string {
	switch m.(type) {
	case *Report:
		return "report"
	case *Order:
		return "order"
	case *GiveResult:
		return "give_result"
	case *Transfer:
		return "transfer"
	case *Heartbeat:
		return "heartbeat"
	case *Fenced:
		return "fenced"
	}
	return "unknown"
}

// EpochOf is the epoch a message names: its coordinator's, or, for a
// report, the highest its region has seen. A process that starts
// coordinators keeps the highest it has seen in any message, so that it
// never stands with an epoch already used.
func EpochOf(m Message) Epoch {
	switch m := m.(type) {
	case *Report:
		return m.Epoch
	case *Order:
		return m.Epoch
	case *GiveResult:
		return m.Epoch
	case *Transfer:
		return m.Loan.ID.Epoch
	case *Heartbeat:
		return m.Epoch
	case *Fenced:
		return m.Epoch
	}
	return 0
}

// Report is a region's state of its hot counters and of every counter
// holding a loan, sent to the coordinator at each period boundary; or,
// Urgent, of the counters that turned hot within a period.
type Report struct {
	Region string
	// Epoch is the highest coordinator epoch the region has seen: a
	// coordinator with a lower one steps down.
	Epoch Epoch
	// Time is the region's clock when it reported.
	Time     int64
	Counters []CounterReport
	// Urgent: sent within a period, not at its boundary, naming only the
	// counters that turned hot since the region's last report, their
	// demand scaled to a whole period. The coordinator adds them to the
	// region's last report and plans them at once.
	Urgent bool
}

// CounterReport is one counter in a Report.
type CounterReport struct {
	Counter string
	Limit   Limit
	// Share is the region's share now (CounterState.Share); Used what it
	// has admitted against it (CounterState.Used).
	Share, Used int64
	// Demand is the units the region's decisions asked for in the last
	// period, admitted or not; Rejected the part rejected.
	Demand, Rejected int64
	// Out lists the loans the region gave that it still holds units for.
	Out []LoanState
}

// LoanState is a loan as its giver holds it.
type LoanState struct {
	ID    LoanID
	To    string
	Units int64
	First int64
	Last  int64
}

// Order asks a region (Loan.From) to give up to Loan.Units of a counter to
// another (Loan.To), or, with Extend, to extend its loan Loan.ID to
// Loan.Last.
type Order struct {
	Epoch  Epoch
	Loan   Loan
	Extend bool
}

// GiveResult is a giver's answer to an Order: what it gave (0: nothing)
// and until which slot.
type GiveResult struct {
	Epoch Epoch
	Loan  Loan
	// Refused says why nothing was given, if nothing was.
	Refused string
}

// Transfer carries a loan's units from the giver to the receiver, after
// the giver removed them.
type Transfer struct {
	Loan Loan
}

// Heartbeat is a coordinator telling every region that it runs, once per
// period.
type Heartbeat struct {
	Epoch Epoch
}

// Fenced tells a coordinator that a region has seen a higher epoch: it
// steps down.
type Fenced struct {
	Epoch Epoch
}

func (*Report) message()     {}
func (*Order) message()      {}
func (*GiveResult) message() {}
func (*Transfer) message()   {}
func (*Heartbeat) message()  {}
func (*Fenced) message()     {}

// MaxReportCounters bounds the counters of one Report; a region with more
// hot counters sends several.
const MaxReportCounters = 10_000

// Validate implements Message.
func (r *Report) Validate(cfg Config) error {
	var errs []error
	if !validName(r.Region) {
		errs = append(errs, fmt.Errorf("%w: report from %q", ErrInvalid, r.Region))
	}
	if len(r.Counters) > MaxReportCounters {
		errs = append(errs, fmt.Errorf("%w: report of %d counters", ErrInvalid, len(r.Counters)))
	}
	for _, c := range r.Counters {
		if c.Counter == "" || len(c.Counter) > MaxCounterName {
			errs = append(errs, fmt.Errorf("%w: counter name of %d bytes", ErrInvalid, len(c.Counter)))
		}
		if err := c.Limit.Validate(cfg); err != nil {
			errs = append(errs, err)
		}
		if c.Share < 0 || c.Used < 0 || c.Demand < 0 || c.Rejected < 0 || c.Rejected > c.Demand {
			errs = append(errs, fmt.Errorf("%w: counter %q share %d used %d demand %d rejected %d", ErrInvalid, c.Counter, c.Share, c.Used, c.Demand, c.Rejected))
		}
		for _, o := range c.Out {
			if !validName(o.To) || o.Units < 0 || o.Last < o.First {
				errs = append(errs, fmt.Errorf("%w: counter %q loan %s", ErrInvalid, c.Counter, o.ID))
			}
		}
	}
	return errors.Join(errs...)
}

// Validate implements Message.
func (o *Order) Validate(cfg Config) error {
	if o.Epoch == 0 || o.Loan.ID.Epoch == 0 {
		return fmt.Errorf("%w: order without an epoch", ErrInvalid)
	}
	return o.Loan.Validate(cfg)
}

// Validate implements Message.
func (g *GiveResult) Validate(cfg Config) error { return g.Loan.Validate(cfg) }

// Validate implements Message.
func (t *Transfer) Validate(cfg Config) error { return t.Loan.Validate(cfg) }

// Validate implements Message.
func (h *Heartbeat) Validate(Config) error {
	if h.Epoch == 0 {
		return fmt.Errorf("%w: heartbeat without an epoch", ErrInvalid)
	}
	return nil
}

// Validate implements Message.
func (f *Fenced) Validate(Config) error {
	if f.Epoch == 0 {
		return fmt.Errorf("%w: fenced without an epoch", ErrInvalid)
	}
	return nil
}

// Node is where a message goes: a region's name, or one of the two
// broadcast addresses.
type Node string

// Broadcast addresses.
const (
	// ToCoordinators reaches every coordinator the sender can reach (in
	// production a NATS subject every coordinator subscribes to).
	ToCoordinators Node = "*coordinators"
	// ToRegions reaches every region the sender can reach.
	ToRegions Node = "*regions"
)

// Transport sends a message. It may lose, delay, duplicate or reorder it;
// the protocol is safe whatever it does. Send must not block on the
// network: the caller is the one loop that owns the sender.
type Transport interface {
	Send(to Node, m Message)
}

// TransportFunc adapts a function to Transport.
type TransportFunc func(to Node, m Message)

// Send implements Transport.
func (f TransportFunc) Send(to Node, m Message) { f(to, m) }
