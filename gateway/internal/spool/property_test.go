package spool_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

// TestRandomOperations runs random sequences of Append, Head, Next, Remove,
// Close and reopen, process deaths and machine crashes (in the middle of an
// Append or a Remove too), injected faults and full disks against a model:
// the list of batches appended and not removed. After every step the spool
// must read back exactly the model, in order. Where a crash interrupted an
// operation, either outcome is allowed, and the model follows the spool.
func TestRandomOperations(t *testing.T) {
	t.Parallel()
	seeds := 24
	if testing.Short() {
		seeds = 4
	}
	for _, noSync := range []bool{false, true} {
		for seed := range seeds {
			t.Run(fmt.Sprintf("NoSync=%v/seed=%d", noSync, seed), func(t *testing.T) {
				t.Parallel()
				runRandom(t, uint64(seed), noSync, 250)
			})
		}
	}
}

type randomRun struct {
	t      *testing.T
	rng    *rand.Rand
	fsys   *spooltest.FS
	s      *spool.Spool
	opts   spool.Options
	model  [][]spool.Record
	n      int      // batches made
	counts []string // what happened, for the log
}

func runRandom(t *testing.T, seed uint64, noSync bool, steps int) {
	r := &randomRun{
		t:    t,
		rng:  rand.New(rand.NewPCG(seed, 7)),
		fsys: spooltest.New(),
		opts: spool.Options{MaxBytes: 24 << 10, NoSync: noSync},
	}
	r.reopen(r.fsys)
	defer func() { _ = r.s.Close() }()
	stats := map[string]int{}
	for step := range steps {
		op := r.step()
		stats[op]++
		r.check(fmt.Sprintf("step %d (%s)", step, op))
	}
	t.Logf("%v", stats)
}

// step does one random operation and returns its name.
func (r *randomRun) step() string {
	t := r.t
	rng := r.rng
	switch p := rng.IntN(100); {
	case p < 35:
		b := r.batch()
		err := r.s.Append(b)
		full := r.bytes()+segSize(b) > r.opts.MaxBytes
		switch {
		case full && errors.Is(err, spool.ErrFull):
			return "append: full"
		case !full && err == nil:
			r.model = append(r.model, b)
			return "append"
		}
		t.Fatalf("append of %d bytes to %d of %d: %v", segSize(b), r.bytes(), r.opts.MaxBytes, err)
	case p < 45:
		seg, err := r.s.Head()
		if len(r.model) == 0 {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("head of an empty spool: %v", err)
			}
			return "head: empty"
		}
		if err != nil || !sameRecords(seg.Records, r.model[0]) {
			t.Fatalf("head: %v", err)
		}
		return "head"
	case p < 65:
		if len(r.model) == 0 {
			return "remove: empty"
		}
		i := 0
		if rng.IntN(4) == 0 {
			i = rng.IntN(len(r.model))
		}
		if err := r.s.Remove(r.ids()[i]); err != nil {
			t.Fatalf("remove: %v", err)
		}
		r.model = slices.Delete(r.model, i, i+1)
		return "remove"
	case p < 72:
		if err := r.s.Close(); err != nil {
			t.Fatal(err)
		}
		r.reopen(r.fsys)
		return "close+reopen"
	case p < 78:
		r.crash(nil)
		return "crash"
	case p < 86:
		// An Append cut short by the process's death or a crash.
		b := r.batch()
		r.fsys.Inject(spooltest.CrashAfter(rng.IntN(9)))
		err := r.s.Append(b)
		r.crash(b)
		if err == nil && !r.has(b) {
			t.Fatal("an Append that returned nil was lost")
		}
		return "crash in append"
	case p < 91:
		if len(r.model) == 0 {
			return "crash in remove: empty"
		}
		id, gone := r.ids()[0], r.model[0]
		r.fsys.Inject(spooltest.CrashAfter(rng.IntN(4)))
		err := r.s.Remove(id)
		r.crash(nil)
		if err == nil && !r.opts.NoSync && len(r.model) > 0 && sameRecords(r.model[0], gone) {
			t.Fatal("a Remove that returned nil came back")
		}
		return "crash in remove"
	case p < 96:
		kinds := []spooltest.OpKind{spooltest.OpOpen, spooltest.OpWrite, spooltest.OpClose, spooltest.OpRename}
		if !r.opts.NoSync {
			kinds = append(kinds, spooltest.OpSync)
		}
		kind := kinds[rng.IntN(len(kinds))]
		suffix := ".tmp"
		if kind == spooltest.OpSync && rng.IntN(2) == 0 {
			suffix = "gw-1" // the directory
		}
		b := r.batch()
		if r.bytes()+segSize(b) > r.opts.MaxBytes {
			return "fault: would be full"
		}
		r.fsys.Inject(spooltest.FailNth(kind, suffix, 1, spooltest.ErrInjected))
		err := r.s.Append(b)
		r.fsys.Inject(nil)
		if !errors.Is(err, spooltest.ErrInjected) {
			t.Fatalf("append failing at %s %s: %v", kind, suffix, err)
		}
		return "fault in append"
	default:
		b := r.batch()
		r.fsys.SetCapacity(r.fsys.Usage() + int64(rng.IntN(int(segSize(b))+64)))
		err := r.s.Append(b)
		r.fsys.SetCapacity(0)
		switch {
		case err == nil:
			r.model = append(r.model, b)
			return "disk nearly full: fits"
		case errors.Is(err, spool.ErrFull):
			return "disk full"
		}
		t.Fatalf("append to a full disk: %v", err)
	}
	return ""
}

func (r *randomRun) batch() []spool.Record {
	r.n++
	return batch(fmt.Sprint(r.n), 1+r.rng.IntN(20), r.rng.IntN(300))
}

func (r *randomRun) bytes() int64 {
	var n int64
	for _, b := range r.model {
		n += segSize(b)
	}
	return n
}

func (r *randomRun) has(b []spool.Record) bool {
	return slices.ContainsFunc(r.model, func(x []spool.Record) bool { return sameRecords(x, b) })
}

// ids returns the ids of the model's segments, read from the spool.
func (r *randomRun) ids() []uint64 {
	var ids []uint64
	for seg, err := r.s.Head(); err == nil; seg, err = r.s.Next(seg.ID) {
		ids = append(ids, seg.ID)
	}
	if len(ids) != len(r.model) {
		r.t.Fatalf("%d segments for a model of %d", len(ids), len(r.model))
	}
	return ids
}

// crash ends the process: a machine crash (with a random part of the
// unsynced state surviving) half of the time, unless NoSync, where only the
// process dies (a machine crash may then lose appends, which
// TestCrashWithoutSync covers). inFlight is an Append the crash may have
// interrupted: after the crash the spool holds the model, or the model and
// inFlight.
func (r *randomRun) crash(inFlight []spool.Record) {
	r.fsys.Inject(nil)
	_ = r.s.Close() // the lock dies with the process
	after := r.fsys
	if !r.opts.NoSync && r.rng.IntN(2) == 0 {
		var rng *rand.Rand
		if r.rng.IntN(2) == 0 {
			rng = rand.New(rand.NewPCG(r.rng.Uint64(), 0))
		}
		after = r.fsys.Crash(rng)
	}
	r.reopen(after)
	got := readAll(r.t, r.s)
	switch {
	case slices.EqualFunc(got, r.model, sameRecords):
	case inFlight != nil && slices.EqualFunc(got, append(slices.Clone(r.model), inFlight), sameRecords):
		r.model = got
	case inFlight == nil && len(got) == len(r.model)-1 && slices.EqualFunc(got, r.model[1:], sameRecords):
		// An interrupted Remove of the head.
		r.model = got
	default:
		r.t.Fatalf("after a crash the spool holds %s, the model %s (in flight: %s)",
			describe(got), describe(r.model), describe([][]spool.Record{inFlight}))
	}
	if st := r.s.Stats(); st.TornSegments != 0 || st.Quarantined != 0 {
		r.t.Fatalf("a crash left damage: %+v", st)
	}
}

func (r *randomRun) reopen(fsys *spooltest.FS) {
	s, err := spool.Open(fsys, dir, r.opts)
	if err != nil {
		r.t.Fatalf("open: %v", err)
	}
	r.fsys, r.s = fsys, s
}

func (r *randomRun) check(what string) {
	r.t.Helper()
	got := readAll(r.t, r.s)
	if !slices.EqualFunc(got, r.model, sameRecords) {
		r.t.Fatalf("%s: spool holds %s, model %s", what, describe(got), describe(r.model))
	}
	st := r.s.Stats()
	if st.Segments != len(r.model) || st.Bytes != r.bytes() {
		r.t.Fatalf("%s: stats %+v for a model of %d segments, %d bytes", what, st, len(r.model), r.bytes())
	}
	if _, other := segFiles(listDir(r.t, r.fsys)); len(other) != 0 {
		r.t.Fatalf("%s: the directory holds %v", what, other)
	}
}
