package loopback_test

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/compose/internal/loopback"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	cases := []struct {
		addr     string
		host     string
		port     int
		notLoop  bool
		badInput bool
	}{
		{addr: "127.0.0.1:0", host: "127.0.0.1"},
		{addr: "127.0.0.1:9092", host: "127.0.0.1", port: 9092},
		{addr: "localhost:4222", host: "127.0.0.1", port: 4222},
		{addr: "[::1]:4222", host: "::1", port: 4222},
		{addr: "0.0.0.0:0", notLoop: true},
		{addr: ":9092", notLoop: true},
		{addr: "10.1.2.3:9092", notLoop: true},
		{addr: "example.com:9092", notLoop: true},
		{addr: "127.0.0.1", badInput: true},
		{addr: "127.0.0.1:http", badInput: true},
		{addr: "127.0.0.1:70000", badInput: true},
	}
	for _, tc := range cases {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			host, port, err := loopback.Split(tc.addr)
			switch {
			case tc.notLoop:
				if !errors.Is(err, loopback.ErrNotLoopback) {
					t.Fatalf("Split = %v, want ErrNotLoopback", err)
				}
			case tc.badInput:
				if err == nil || errors.Is(err, loopback.ErrNotLoopback) {
					t.Fatalf("Split = %v, want a parse error", err)
				}
			case err != nil || host != tc.host || port != tc.port:
				t.Fatalf("Split = %q, %d, %v; want %q, %d", host, port, err, tc.host, tc.port)
			}
		})
	}
}
