package main

import (
	"slices"
	"testing"
)

func TestParseFractions(t *testing.T) {
	tests := []struct {
		in   string
		want []float64
		bad  bool
	}{
		{in: "0.5,0.25", want: []float64{0.5, 0.25}},
		{in: " 1 ", want: []float64{1}},
		{in: "0", bad: true},
		{in: "1.5", bad: true},
		{in: "0.5,", bad: true},
		{in: "half", bad: true},
		{in: "NaN", bad: true},
	}
	for _, tt := range tests {
		got, err := parseFractions(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("parseFractions(%q) = %v, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("parseFractions(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestLoadString(t *testing.T) {
	tests := []struct {
		l    load
		want string
	}{
		{load{}, "closed loop"},
		{load{rate: 4000}, "open loop 4000/s"},
		{load{rate: 4710, fraction: 0.5}, "open loop 4710/s (0.50 × envoy's maximum)"},
	}
	for _, tt := range tests {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.l, got, tt.want)
		}
	}
}
