package spool_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/tollgate/tollgate/gateway/internal/spool"
)

// The producer's two sides: spill batches while Kafka is away, then replay
// them in order and remove each once Kafka has acknowledged it.
func Example() {
	dataDir, err := os.MkdirTemp("", "tollgate")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	s, err := spool.Open(spool.OSFS{}, filepath.Join(dataDir, "spool", "gw-1"), spool.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	for i := range 3 {
		batch := []spool.Record{
			{Partition: 0, Payload: fmt.Appendf(nil, "batch %d, first", i)},
			{Partition: 1, Payload: fmt.Appendf(nil, "batch %d, second", i)},
		}
		if err := s.Append(batch); errors.Is(err, spool.ErrFull) {
			fmt.Println("lost", len(batch), "records") // counted in a metric
		} else if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(s.Stats().Segments, "segments spooled")

	for {
		seg, err := s.Head()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		for _, r := range seg.Records {
			fmt.Printf("partition %d: %s\n", r.Partition, r.Payload)
		}
		if err := s.Remove(seg.ID); err != nil { // acknowledged by Kafka
			log.Fatal(err)
		}
	}
	// Output:
	// 3 segments spooled
	// partition 0: batch 0, first
	// partition 1: batch 0, second
	// partition 0: batch 1, first
	// partition 1: batch 1, second
	// partition 0: batch 2, first
	// partition 1: batch 2, second
}
