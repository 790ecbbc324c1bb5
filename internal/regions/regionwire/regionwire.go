// Package regionwire puts the regions protocol's messages on the wire: a
// regions.Message as a tollgatev1.RegionMessage (Protocol Buffers, version 1
// of the contract), and the core NATS subjects they travel on.
//
// Decode accepts only what the protocol accepts: a message whose body is not
// one it knows, whose sender is not a region's name, or whose values break
// the bounds of the message's Validate is refused with an error wrapping
// ErrMalformed, and nothing of it reaches the protocol.
package regionwire

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Subjects. Every message is core NATS, at most once: the protocol survives
// loss, duplication and reordering.
const (
	// SubjectPrefix starts every subject of the protocol.
	SubjectPrefix = "tollgate.regions."
	// CoordinatorsSubject reaches every coordinator (regions.ToCoordinators):
	// reports, give results and fenced notices.
	CoordinatorsSubject = SubjectPrefix + "coordinators"
	// RegionsSubject reaches every region (regions.ToRegions): heartbeats.
	RegionsSubject = SubjectPrefix + "all"
	// demandPrefix starts a region's demand subject, DemandSubject.
	demandPrefix = SubjectPrefix + "demand."
	// regionPrefix starts a region's own subject, RegionSubject.
	regionPrefix = SubjectPrefix + "to."
)

// MaxMessageSize bounds what Decode reads: NATS's default maximum payload.
const MaxMessageSize = 1 << 20

var (
	// ErrMalformed: the bytes are not a valid message of the protocol.
	ErrMalformed = errors.New("regionwire: malformed message")
	// ErrTooLarge: a message encodes to more than MaxMessageSize bytes
	// (a report of many long counter names: send it in parts).
	ErrTooLarge = errors.New("regionwire: message too large")
)

// RegionSubject is the subject of one region's agent: orders and
// transfers addressed to it.
func RegionSubject(region string) string { return regionPrefix + region }

// DemandSubject is where a region's aggregator instances forward the
// demand they count to the one running the region's agent, as Reports of
// the region.
func DemandSubject(region string) string { return demandPrefix + region }

// SubjectOf is the subject a message to node goes on.
func SubjectOf(to regions.Node) string {
	switch to {
	case regions.ToCoordinators:
		return CoordinatorsSubject
	case regions.ToRegions:
		return RegionsSubject
	}
	return RegionSubject(string(to))
}

// Encode writes m, sent by region from.
func Encode(from string, m regions.Message) ([]byte, error) {
	w := &tollgatev1.RegionMessage{From: from}
	switch m := m.(type) {
	case *regions.Report:
		w.Body = &tollgatev1.RegionMessage_Report{Report: reportOut(m)}
	case *regions.Order:
		w.Body = &tollgatev1.RegionMessage_Order{Order: &tollgatev1.RegionOrder{
			Epoch: uint64(m.Epoch), Loan: loanOut(m.Loan), Extend: m.Extend}}
	case *regions.GiveResult:
		w.Body = &tollgatev1.RegionMessage_GiveResult{GiveResult: &tollgatev1.RegionGiveResult{
			Epoch: uint64(m.Epoch), Loan: loanOut(m.Loan), Refused: m.Refused}}
	case *regions.Transfer:
		w.Body = &tollgatev1.RegionMessage_Transfer{Transfer: &tollgatev1.RegionTransfer{Loan: loanOut(m.Loan)}}
	case *regions.Heartbeat:
		w.Body = &tollgatev1.RegionMessage_Heartbeat{Heartbeat: &tollgatev1.RegionHeartbeat{Epoch: uint64(m.Epoch)}}
	case *regions.Fenced:
		w.Body = &tollgatev1.RegionMessage_Fenced{Fenced: &tollgatev1.RegionFenced{Epoch: uint64(m.Epoch)}}
	default:
		return nil, fmt.Errorf("regionwire: encode: message of type %T", m)
	}
	b, err := proto.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("regionwire: encode: %w", err)
	}
	if len(b) > MaxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes, above %d", ErrTooLarge, len(b), MaxMessageSize)
	}
	return b, nil
}

// Decode reads a message and its sender, and validates the message under
// cfg (regions.Message.Validate). Any problem is an error wrapping
// ErrMalformed.
func Decode(b []byte, cfg regions.Config) (from string, m regions.Message, err error) {
	if len(b) > MaxMessageSize {
		return "", nil, fmt.Errorf("%w: %d bytes, above %d", ErrMalformed, len(b), MaxMessageSize)
	}
	var w tollgatev1.RegionMessage
	if err := proto.Unmarshal(b, &w); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if !validName(w.From) {
		return "", nil, fmt.Errorf("%w: sender %q is not a region's name", ErrMalformed, w.From)
	}
	switch body := w.Body.(type) {
	case *tollgatev1.RegionMessage_Report:
		m, err = reportIn(body.Report)
	case *tollgatev1.RegionMessage_Order:
		o := body.Order
		var loan regions.Loan
		loan, err = loanIn(o.GetLoan())
		m = &regions.Order{Epoch: regions.Epoch(o.GetEpoch()), Loan: loan, Extend: o.GetExtend()}
	case *tollgatev1.RegionMessage_GiveResult:
		g := body.GiveResult
		var loan regions.Loan
		loan, err = loanIn(g.GetLoan())
		m = &regions.GiveResult{Epoch: regions.Epoch(g.GetEpoch()), Loan: loan, Refused: g.GetRefused()}
	case *tollgatev1.RegionMessage_Transfer:
		var loan regions.Loan
		loan, err = loanIn(body.Transfer.GetLoan())
		m = &regions.Transfer{Loan: loan}
	case *tollgatev1.RegionMessage_Heartbeat:
		m = &regions.Heartbeat{Epoch: regions.Epoch(body.Heartbeat.GetEpoch())}
	case *tollgatev1.RegionMessage_Fenced:
		m = &regions.Fenced{Epoch: regions.Epoch(body.Fenced.GetEpoch())}
	default:
		return "", nil, fmt.Errorf("%w: no body this version knows", ErrMalformed)
	}
	if err == nil {
		err = m.Validate(cfg)
	}
	if err == nil {
		err = senderMatches(w.From, m)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: %T from %s: %w", ErrMalformed, m, w.From, err)
	}
	return w.From, m, nil
}

// senderMatches refuses a message whose sender is not the region it speaks
// for: a report's region, a give result's or a transfer's giver.
func senderMatches(from string, m regions.Message) error {
	var want string
	switch m := m.(type) {
	case *regions.Report:
		want = m.Region
	case *regions.GiveResult:
		want = m.Loan.From
	case *regions.Transfer:
		want = m.Loan.From
	default:
		return nil
	}
	if from != want {
		return fmt.Errorf("sent by %s for %s", from, want)
	}
	return nil
}

// validName is a region's name: 1 to 64 bytes of [a-z0-9-].
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func limitOut(l regions.Limit) *tollgatev1.RegionLimit {
	return &tollgatev1.RegionLimit{Kind: tollgatev1.RegionLimit_Kind(l.Kind), Units: l.Units, WindowMicros: l.Window}
}

func limitIn(l *tollgatev1.RegionLimit) (regions.Limit, error) {
	if l == nil {
		return regions.Limit{}, errors.New("no limit")
	}
	var k regions.Kind
	switch l.GetKind() {
	case tollgatev1.RegionLimit_KIND_FIXED_WINDOW:
		k = regions.FixedWindow
	case tollgatev1.RegionLimit_KIND_SLIDING_WINDOW:
		k = regions.SlidingWindow
	case tollgatev1.RegionLimit_KIND_BUCKET:
		k = regions.Bucket
	default:
		return regions.Limit{}, fmt.Errorf("limit kind %d", l.GetKind())
	}
	return regions.Limit{Kind: k, Units: l.GetUnits(), Window: l.GetWindowMicros()}, nil
}

func idOut(id regions.LoanID) *tollgatev1.RegionLoanId {
	return &tollgatev1.RegionLoanId{Epoch: uint64(id.Epoch), Seq: id.Seq}
}

func idIn(id *tollgatev1.RegionLoanId) (regions.LoanID, error) {
	if id == nil {
		return regions.LoanID{}, errors.New("no loan id")
	}
	return regions.LoanID{Epoch: regions.Epoch(id.GetEpoch()), Seq: id.GetSeq()}, nil
}

func loanOut(l regions.Loan) *tollgatev1.RegionLoan {
	return &tollgatev1.RegionLoan{Id: idOut(l.ID), Counter: l.Counter, Limit: limitOut(l.Limit),
		From: l.From, To: l.To, Units: l.Units, FirstSlot: l.First, LastSlot: l.Last}
}

func loanIn(l *tollgatev1.RegionLoan) (regions.Loan, error) {
	if l == nil {
		return regions.Loan{}, errors.New("no loan")
	}
	id, err := idIn(l.GetId())
	if err != nil {
		return regions.Loan{}, err
	}
	lim, err := limitIn(l.GetLimit())
	if err != nil {
		return regions.Loan{}, err
	}
	return regions.Loan{ID: id, Counter: l.GetCounter(), Limit: lim, From: l.GetFrom(), To: l.GetTo(),
		Units: l.GetUnits(), First: l.GetFirstSlot(), Last: l.GetLastSlot()}, nil
}

func reportOut(r *regions.Report) *tollgatev1.RegionReport {
	w := &tollgatev1.RegionReport{Region: r.Region, Epoch: uint64(r.Epoch), TimeUnixMicros: r.Time, Urgent: r.Urgent,
		Counters: make([]*tollgatev1.RegionCounterReport, len(r.Counters))}
	for i, c := range r.Counters {
		wc := &tollgatev1.RegionCounterReport{Counter: c.Counter, Limit: limitOut(c.Limit), Share: c.Share,
			Used: c.Used, Demand: c.Demand, Rejected: c.Rejected, Out: make([]*tollgatev1.RegionLoanState, len(c.Out))}
		for j, o := range c.Out {
			wc.Out[j] = &tollgatev1.RegionLoanState{Id: idOut(o.ID), To: o.To, Units: o.Units, FirstSlot: o.First, LastSlot: o.Last}
		}
		w.Counters[i] = wc
	}
	return w
}

func reportIn(w *tollgatev1.RegionReport) (*regions.Report, error) {
	if len(w.GetCounters()) > regions.MaxReportCounters {
		return nil, fmt.Errorf("report of %d counters", len(w.GetCounters()))
	}
	r := &regions.Report{Region: w.GetRegion(), Epoch: regions.Epoch(w.GetEpoch()), Time: w.GetTimeUnixMicros(), Urgent: w.GetUrgent()}
	if n := len(w.GetCounters()); n > 0 {
		r.Counters = make([]regions.CounterReport, n)
	}
	for i, wc := range w.GetCounters() {
		lim, err := limitIn(wc.GetLimit())
		if err != nil {
			return nil, fmt.Errorf("counter %q: %w", wc.GetCounter(), err)
		}
		c := regions.CounterReport{Counter: wc.GetCounter(), Limit: lim, Share: wc.GetShare(), Used: wc.GetUsed(),
			Demand: wc.GetDemand(), Rejected: wc.GetRejected()}
		for _, o := range wc.GetOut() {
			id, err := idIn(o.GetId())
			if err != nil {
				return nil, fmt.Errorf("counter %q: %w", wc.GetCounter(), err)
			}
			c.Out = append(c.Out, regions.LoanState{ID: id, To: o.GetTo(), Units: o.GetUnits(), First: o.GetFirstSlot(), Last: o.GetLastSlot()})
		}
		r.Counters[i] = c
	}
	return r, nil
}
