package service_test

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/internal/testnet"
)

// TestListenAll: every listener is tried; each busy one is named with its
// variable, a bad address says what it is, and nothing stays bound after a
// failure. Without failures every listener is bound.
func TestListenAll(t *testing.T) {
	t.Parallel()
	taken := func() string { return testnet.Listen(t).Addr().String() }
	busy1, busy2, open := taken(), taken(), testnet.FreeAddr(t)
	tests := []struct {
		name  string
		ls    []service.Listener
		inUse []string // variables named busy
		other []string // texts of other failures
	}{
		{"all free", []service.Listener{{"a", "127.0.0.1:0", "TOLLGATE_A"}, {"b", open, "TOLLGATE_B"}}, nil, nil},
		{"two busy", []service.Listener{
			{"a", busy1, "TOLLGATE_A"}, {"b", open, "TOLLGATE_B"}, {"c", busy2, "TOLLGATE_C"},
		}, []string{"TOLLGATE_A", "TOLLGATE_C"}, nil},
		{"busy and bad", []service.Listener{
			{"a", busy1, "TOLLGATE_A"}, {"b", "127.0.0.1:notaport", "TOLLGATE_B"},
		}, []string{"TOLLGATE_A"}, []string{"b listener: cannot listen on 127.0.0.1:notaport (TOLLGATE_B)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lns, err := service.ListenAll(tt.ls)
			if len(tt.inUse)+len(tt.other) == 0 {
				if err != nil || len(lns) != len(tt.ls) {
					t.Fatalf("ListenAll: %d listeners, %v", len(lns), err)
				}
				for _, ln := range lns {
					_ = ln.Close()
				}
				return
			}
			if err == nil || lns != nil {
				t.Fatalf("ListenAll: %d listeners, %v; want an error", len(lns), err)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.inUse)+len(tt.other) {
				t.Fatalf("error of %d lines, want %d: %v", len(lines), len(tt.inUse)+len(tt.other), err)
			}
			if len(tt.inUse) > 0 && (!errors.Is(err, service.ErrAddrInUse) || !errors.Is(err, syscall.EADDRINUSE)) {
				t.Fatalf("%v does not match ErrAddrInUse and EADDRINUSE", err)
			}
			for _, v := range tt.inUse {
				if !strings.Contains(err.Error(), "is already in use ("+v+"): stop what listens there, or set "+v) {
					t.Errorf("%v does not name %s", err, v)
				}
			}
			for _, o := range tt.other {
				if !strings.Contains(err.Error(), o) {
					t.Errorf("%v lacks %q", err, o)
				}
			}
			// What was bound was released.
			ln, err := net.Listen("tcp", open)
			if err != nil {
				t.Fatalf("a failed ListenAll kept %s: %v", open, err)
			}
			_ = ln.Close()
		})
	}
}
