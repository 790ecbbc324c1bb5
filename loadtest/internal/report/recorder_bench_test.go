package report

import (
	"testing"
	"time"
)

// BenchmarkRecord measures the recorder on the load generator's request
// path: Begin, the clock read that ends the request, and Record, from as
// many goroutines as the generator's workers share CPUs with.
func BenchmarkRecord(b *testing.B) {
	r := NewRecorder(testOutcomes)
	b.ReportAllocs()
	b.SetParallelism(25) // 50 workers on 2 CPUs, the generator's default
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r.Begin()
			sent := r.start.Add(-time.Duration(500+i&1023) * time.Microsecond)
			r.Record(i&1, sent, time.Since(sent))
			i++
		}
	})
}
