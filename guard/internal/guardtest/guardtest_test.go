package guardtest

import "testing"

func TestFullRefill(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name             string
		limit, window, n int64
		wantNum, wantDen int64
	}{
		{"whole", 30, 60_000_000, 30, 60_000_000, 1},
		{"reduced", 10, 3_000_000, 7, 30_000_000, 7},
		{"common factor", 4, 1_000_000, 6, 2_000_000, 3},
		{"one unit", 1, 250_000, 1, 250_000, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if num, den := FullRefill(tt.limit, tt.window, tt.n); num != tt.wantNum || den != tt.wantDen {
				t.Fatalf("FullRefill(%d, %d, %d) = %d/%d, want %d/%d", tt.limit, tt.window, tt.n, num, den, tt.wantNum, tt.wantDen)
			}
		})
	}
}
