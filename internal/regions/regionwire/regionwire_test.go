package regionwire_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/internal/regions"
	"github.com/tollgate/tollgate/internal/regions/regionwire"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

var (
	cfg   = regions.Config{}.WithDefaults()
	limit = regions.Limit{Kind: regions.FixedWindow, Units: 100, Window: 60_000_000}
	loan  = regions.Loan{ID: regions.LoanID{Epoch: regions.NewEpoch(3, 1), Seq: 7}, Counter: "t:k:search",
		Limit: limit, From: "eu", To: "us", Units: 20, First: 29_000_000, Last: 29_000_001}
)

// messages is one valid message of every type, with its sender.
func messages() []struct {
	from string
	m    regions.Message
} {
	return []struct {
		from string
		m    regions.Message
	}{
		{"eu", &regions.Report{Region: "eu", Epoch: regions.NewEpoch(3, 1), Time: 1_764_000_000_000_000}},
		{"eu", &regions.Report{Region: "eu", Epoch: regions.NewEpoch(3, 1), Time: 1_764_000_000_000_000,
			Counters: []regions.CounterReport{
				{Counter: "a", Limit: limit, Share: 50, Used: 50, Demand: 400, Rejected: 350},
				{Counter: "b", Limit: regions.Limit{Kind: regions.Bucket, Units: 10, Window: 1_000_000}, Share: 5, Used: 1,
					Out: []regions.LoanState{{ID: loan.ID, To: "us", Units: 2, First: 5, Last: 6}}},
			}}},
		{"eu", &regions.Report{Region: "eu", Epoch: regions.NewEpoch(3, 1), Time: 1_764_000_000_250_000, Urgent: true,
			Counters: []regions.CounterReport{{Counter: "a", Limit: limit, Share: 50, Used: 20, Demand: 80}}}},
		{"us", &regions.Order{Epoch: regions.NewEpoch(3, 1), Loan: loan}},
		{"us", &regions.Order{Epoch: regions.NewEpoch(3, 1), Loan: loan, Extend: true}},
		{"eu", &regions.GiveResult{Epoch: regions.NewEpoch(3, 1), Loan: loan}},
		{"eu", &regions.GiveResult{Epoch: regions.NewEpoch(3, 1), Loan: func() regions.Loan { l := loan; l.Units = 0; return l }(), Refused: regions.RefusedNothing}},
		{"eu", &regions.Transfer{Loan: loan}},
		{"us", &regions.Heartbeat{Epoch: regions.NewEpoch(3, 1)}},
		{"ap", &regions.Fenced{Epoch: regions.NewEpoch(4, 2)}},
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range messages() {
		t.Run(reflect.TypeOf(tc.m).Elem().Name(), func(t *testing.T) {
			b, err := regionwire.Encode(tc.from, tc.m)
			if err != nil {
				t.Fatal(err)
			}
			from, m, err := regionwire.Decode(b, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if from != tc.from || !reflect.DeepEqual(m, tc.m) {
				t.Fatalf("decoded %q %+v, want %q %+v", from, m, tc.from, tc.m)
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	enc := func(w *tollgatev1.RegionMessage) []byte {
		b, err := proto.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wloan := func(mod func(*tollgatev1.RegionLoan)) *tollgatev1.RegionLoan {
		b, err := regionwire.Encode("eu", &regions.Transfer{Loan: loan})
		if err != nil {
			t.Fatal(err)
		}
		var w tollgatev1.RegionMessage
		if err := proto.Unmarshal(b, &w); err != nil {
			t.Fatal(err)
		}
		l := w.GetTransfer().GetLoan()
		mod(l)
		return l
	}
	transfer := func(l *tollgatev1.RegionLoan) []byte {
		return enc(&tollgatev1.RegionMessage{From: "eu", Body: &tollgatev1.RegionMessage_Transfer{Transfer: &tollgatev1.RegionTransfer{Loan: l}}})
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"not protobuf", []byte{0xff, 0xff, 0xff}},
		{"empty: no body", nil},
		{"too large", make([]byte, regionwire.MaxMessageSize+1)},
		{"sender not a region", enc(&tollgatev1.RegionMessage{From: "EU!", Body: &tollgatev1.RegionMessage_Heartbeat{Heartbeat: &tollgatev1.RegionHeartbeat{Epoch: 257}}})},
		{"heartbeat without epoch", enc(&tollgatev1.RegionMessage{From: "eu", Body: &tollgatev1.RegionMessage_Heartbeat{Heartbeat: &tollgatev1.RegionHeartbeat{}}})},
		{"transfer without loan", transfer(nil)},
		{"loan without id", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.Id = nil }))},
		{"loan without limit", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.Limit = nil }))},
		{"unknown kind", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.Limit.Kind = 9 }))},
		{"negative units", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.Units = -1 }))},
		{"units above the limit", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.Units = 101 }))},
		{"loan to itself", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.To = "eu" }))},
		{"transfer sent by another than the giver", transfer(wloan(func(l *tollgatev1.RegionLoan) { l.From = "ap"; l.To = "us" }))},
		{"report for another region", enc(&tollgatev1.RegionMessage{From: "eu", Body: &tollgatev1.RegionMessage_Report{Report: &tollgatev1.RegionReport{Region: "us"}}})},
		{"report counter without limit", enc(&tollgatev1.RegionMessage{From: "eu", Body: &tollgatev1.RegionMessage_Report{Report: &tollgatev1.RegionReport{Region: "eu",
			Counters: []*tollgatev1.RegionCounterReport{{Counter: "a"}}}}})},
		{"report rejected above demand", enc(&tollgatev1.RegionMessage{From: "eu", Body: &tollgatev1.RegionMessage_Report{Report: &tollgatev1.RegionReport{Region: "eu",
			Counters: []*tollgatev1.RegionCounterReport{{Counter: "a", Limit: &tollgatev1.RegionLimit{Kind: 1, Units: 10, WindowMicros: 60_000_000}, Demand: 1, Rejected: 2}}}}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			from, m, err := regionwire.Decode(tc.b, cfg)
			if !errors.Is(err, regionwire.ErrMalformed) {
				t.Fatalf("decoded %q %+v, err %v; want ErrMalformed", from, m, err)
			}
			if m != nil {
				t.Fatalf("a refused message came back: %+v", m)
			}
			t.Log(err)
		})
	}
}

func TestEncodeTooLarge(t *testing.T) {
	t.Parallel()
	rep := &regions.Report{Region: "eu", Time: 1}
	for i := range 2000 {
		rep.Counters = append(rep.Counters, regions.CounterReport{Counter: fmt.Sprintf("%04d%01000d", i, 0), Limit: limit})
	}
	if _, err := regionwire.Encode("eu", rep); !errors.Is(err, regionwire.ErrTooLarge) {
		t.Fatalf("encode of about 2 MB: %v, want ErrTooLarge", err)
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		to   regions.Node
		want string
	}{
		{regions.ToCoordinators, "tollgate.regions.coordinators"},
		{regions.ToRegions, "tollgate.regions.all"},
		{"eu", "tollgate.regions.to.eu"},
		{"coordinators", "tollgate.regions.to.coordinators"},
	} {
		if got := regionwire.SubjectOf(tc.to); got != tc.want {
			t.Errorf("SubjectOf(%q) = %q, want %q", tc.to, got, tc.want)
		}
	}
	if got := regionwire.DemandSubject("eu"); got != "tollgate.regions.demand.eu" {
		t.Errorf("DemandSubject(eu) = %q", got)
	}
}

// FuzzDecode: any bytes decode to a valid message or an ErrMalformed, never
// a panic; what decodes encodes back to bytes that decode to the same.
func FuzzDecode(f *testing.F) {
	for _, tc := range messages() {
		b, err := regionwire.Encode(tc.from, tc.m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		from, m, err := regionwire.Decode(b, cfg)
		if err != nil {
			if !errors.Is(err, regionwire.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if err := m.Validate(cfg); err != nil {
			t.Fatalf("decoded an invalid message: %v", err)
		}
		b2, err := regionwire.Encode(from, m)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		from2, m2, err := regionwire.Decode(b2, cfg)
		if err != nil || from2 != from || !reflect.DeepEqual(m2, m) {
			t.Fatalf("round trip: %q %+v (%v), want %q %+v", from2, m2, err, from, m)
		}
	})
}
