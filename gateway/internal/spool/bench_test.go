package spool_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/gateway/internal/spool"
	"github.com/tollgate/tollgate/gateway/internal/spool/spooltest"
)

// BenchmarkAppendHeadRemove measures the spool's round trip as the producer
// uses it: spill one segment of ~150-byte records (a decision event's size),
// read the head back, remove it. MB/s counts payload bytes; records/s counts
// records through the whole round trip. It runs on b.TempDir's file system;
// with sync its figures are bounded by fsync latency, three fsyncs per
// segment (file and directory in Append, directory in Remove).
// BenchmarkSegmentCodec has the format's CPU cost alone.
func BenchmarkAppendHeadRemove(b *testing.B) {
	const size = 150
	for _, fsName := range []string{"disk"} {
		for _, noSync := range []bool{false, true} {
			for _, n := range []int{100, 1000} {
				name := fmt.Sprintf("fs=%s/sync=%v/records=%d", fsName, !noSync, n)
				b.Run(name, func(b *testing.B) {
					var fsys spool.FS = spooltest.New()
					d := dir
					if fsName == "disk" {
						fsys, d = spool.OSFS{}, filepath.Join(b.TempDir(), "spool")
					}
					s, err := spool.Open(fsys, d, spool.Options{NoSync: noSync})
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					recs := batch("bench", n, size)
					b.SetBytes(int64(n * size))
					b.ReportAllocs()
					for b.Loop() {
						if err := s.Append(recs); err != nil {
							b.Fatal(err)
						}
						seg, err := s.Head()
						if err != nil {
							b.Fatal(err)
						}
						if len(seg.Records) != n || len(seg.Records[n-1].Payload) != size {
							b.Fatalf("read back %d records", len(seg.Records))
						}
						if err := s.Remove(seg.ID); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "records/s")
					if st := s.Stats(); st.Segments != 0 {
						b.Fatalf("%d segments left", st.Segments)
					}
				})
			}
		}
	}
}
