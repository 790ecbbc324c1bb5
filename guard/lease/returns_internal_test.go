package lease

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/tollgate/tollgate/guard"
)

// TestNextReturns: a return call names each counter once (a script that
// reads every counter before writing them keeps only one update of a name
// that comes twice); returns of one lease are added up, those of another
// lease of the same counter wait for the next call; at most returnBatch
// counters a call; nothing is lost or doubled.
func TestNextReturns(t *testing.T) {
	ret := func(name, token string, n int64) guard.Counter {
		return guard.Counter{Name: name, Token: token, Return: n}
	}
	batch := []guard.Counter{
		ret("a", "t1", 3), ret("b", "t1", 1), ret("a", "t1", 2), ret("a", "t2", 5), ret("c", "t1", 1), ret("a", "t2", 1),
	}
	call, rest := nextReturns(batch)
	if want := []guard.Counter{ret("a", "t1", 5), ret("b", "t1", 1), ret("c", "t1", 1)}; !reflect.DeepEqual(call, want) {
		t.Fatalf("first call %v, want %v", call, want)
	}
	call, rest = nextReturns(rest)
	if want := []guard.Counter{ret("a", "t2", 6)}; !reflect.DeepEqual(call, want) || len(rest) != 0 {
		t.Fatalf("second call %v rest %v, want %v and nothing", call, rest, want)
	}

	var many []guard.Counter
	for i := range returnBatch + 5 {
		many = append(many, ret(fmt.Sprint(i), "t", 1))
	}
	call, rest = nextReturns(many)
	if len(call) != returnBatch || len(rest) != 5 {
		t.Fatalf("%d counters in the call, %d left; want %d and 5", len(call), len(rest), returnBatch)
	}
}
