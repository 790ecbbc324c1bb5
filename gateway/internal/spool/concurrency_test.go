package spool_test

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

// TestConcurrentAppendAndReplay runs the producer's two sides at once, as
// the package comment allows: one goroutine appends, another replays and
// removes, while others read Stats and the metadata. Every segment is read
// once, in order. Run with -race.
func TestConcurrentAppendAndReplay(t *testing.T) {
	t.Parallel()
	for _, fsName := range []string{"mem", "disk"} {
		t.Run(fsName, func(t *testing.T) {
			t.Parallel()
			fsys, d := testFS(t, fsName, "spool")
			s, err := spool.Open(fsys, d, spool.Options{NoSync: fsName == "disk"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			const n = 300
			appended := make(chan struct{}, n)
			done := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := range n {
					if err := s.Append(batch(fmt.Sprint(i), 1+i%9, 150)); err != nil {
						t.Errorf("append %d: %v", i, err)
						return
					}
					appended <- struct{}{}
				}
			})
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					_ = s.Stats()
					if err := s.WriteMeta(fmt.Appendf(nil, "m%d", i)); err != nil {
						t.Errorf("write meta: %v", err)
						return
					}
					if _, err := s.ReadMeta(); err != nil {
						t.Errorf("read meta: %v", err)
						return
					}
				}
			})

			// The replaying side: read ahead with Next, remove behind.
			var last uint64
			var unacked []uint64
			for i := 0; i < n; {
				seg, err := s.Next(last)
				if errors.Is(err, io.EOF) {
					<-appended // wait for the appender
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if want := batch(fmt.Sprint(i), 1+i%9, 150); !sameRecords(seg.Records, want) {
					t.Fatalf("read %s, want %s", describe([][]spool.Record{seg.Records}), describe([][]spool.Record{want}))
				}
				last = seg.ID
				unacked = append(unacked, seg.ID)
				if len(unacked) == 3 {
					for _, id := range unacked {
						if err := s.Remove(id); err != nil {
							t.Fatal(err)
						}
					}
					unacked = unacked[:0]
				}
				i++
			}
			close(done)
			wg.Wait()
			if st := s.Stats(); st.Segments != len(unacked) {
				t.Fatalf("stats %+v, want %d segments left", st, len(unacked))
			}
		})
	}
}

// TestCloseDuringUse closes the spool while an appender and a reader run:
// their calls return ErrClosed afterwards, nothing panics or races.
func TestCloseDuringUse(t *testing.T) {
	t.Parallel()
	s := open(t, spooltest.New(), spool.Options{})
	var wg sync.WaitGroup
	started := make(chan struct{}, 2)
	wg.Go(func() {
		started <- struct{}{}
		for i := 0; ; i++ {
			if err := s.Append(batch(fmt.Sprint(i), 2, 50)); err != nil {
				if !errors.Is(err, spool.ErrClosed) {
					t.Errorf("append: %v", err)
				}
				return
			}
		}
	})
	wg.Go(func() {
		started <- struct{}{}
		for {
			seg, err := s.Head()
			if errors.Is(err, io.EOF) {
				continue
			}
			if err == nil {
				err = s.Remove(seg.ID)
			}
			if err != nil {
				if !errors.Is(err, spool.ErrClosed) {
					t.Errorf("replay: %v", err)
				}
				return
			}
		}
	})
	<-started
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
