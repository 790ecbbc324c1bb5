package report

import (
	"testing"
	"time"
)

// BenchmarkRecord measures the recorder on the load generator's request
// path: Begin and Record of one answer, from as many goroutines as the
// generator's workers share CPUs with.
func BenchmarkRecord(b *testing.B) {
	r := NewRecorder(testOutcomes)
	b.ReportAllocs()
	b.SetParallelism(25) // 50 workers on 2 CPUs, the generator's default
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r.Begin()
			r.Record(i&1, time.Duration(500+i&1023)*time.Microsecond)
			i++
		}
	})
}
