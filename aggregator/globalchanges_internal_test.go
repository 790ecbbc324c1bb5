package aggregator

import "testing"

// TestLastWriterWins: a global change applies only when it is later, by
// (time, origin region), than the last one applied to its entry; the same
// change again is not later than itself.
func TestLastWriterWins(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    globalChange
		last *lastWrite
		want bool
	}{
		{"first change of an entry", globalChange{TimeMicros: 5, Origin: "eu"}, nil, true},
		{"later", globalChange{TimeMicros: 6, Origin: "eu"}, &lastWrite{TimeMicros: 5, Origin: "us"}, true},
		{"earlier", globalChange{TimeMicros: 4, Origin: "us"}, &lastWrite{TimeMicros: 5, Origin: "eu"}, false},
		{"same time, later origin", globalChange{TimeMicros: 5, Origin: "us"}, &lastWrite{TimeMicros: 5, Origin: "eu"}, true},
		{"same time, earlier origin", globalChange{TimeMicros: 5, Origin: "eu"}, &lastWrite{TimeMicros: 5, Origin: "us"}, false},
		{"the same change again", globalChange{ID: "x", TimeMicros: 5, Origin: "eu"}, &lastWrite{ID: "x", TimeMicros: 5, Origin: "eu"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.c.later(tt.last); got != tt.want {
				t.Errorf("later = %v, want %v", got, tt.want)
			}
		})
	}
}
