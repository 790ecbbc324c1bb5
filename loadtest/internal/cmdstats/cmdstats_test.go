package cmdstats

import (
	"errors"
	"maps"
	"testing"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
)

// info is INFO commandstats as redis-server 7.0 writes it.
const info = "# Commandstats\r\n" +
	"cmdstat_evalsha:calls=1200,usec=9000,usec_per_call=7.50,rejected_calls=0,failed_calls=2\r\n" +
	"cmdstat_evalsha_ro:calls=3,usec=20,usec_per_call=6.67,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_info:calls=7,usec=700,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_GET:calls=10,usec=5,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
	"\r\n"

func TestParse(t *testing.T) {
	t.Parallel()
	st, err := Parse(info)
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{"evalsha": 1200, "evalsha_ro": 3, "info": 7, "client|setinfo": 2, "get": 10}
	if !maps.Equal(st, want) {
		t.Errorf("Parse = %v, want %v", st, want)
	}
	if got := st.Total(); got != 1215 {
		t.Errorf("Total = %d, want 1215 (info left out)", got)
	}
	if got := st.EvalSHA(); got != 1203 {
		t.Errorf("EvalSHA = %d, want 1203", got)
	}
	for _, bad := range []string{"cmdstat_get:usec=1", "cmdstat_get:calls=x", "cmdstat_:calls=1", "cmdstat_get"} {
		if _, err := Parse(bad); !errors.Is(err, ErrFormat) {
			t.Errorf("Parse(%q) = %v, want ErrFormat", bad, err)
		}
	}
}

func TestSub(t *testing.T) {
	t.Parallel()
	before := Stats{"evalsha": 10, "get": 5, "set": 100}
	after := Stats{"evalsha": 25, "get": 5, "set": 3, "hello": 1}
	want := Stats{"evalsha": 15, "set": 3, "hello": 1} // set was reset: counted from zero
	if got := after.Sub(before); !maps.Equal(got, want) {
		t.Errorf("Sub = %v, want %v", got, want)
	}
}

// TestSamplerRealRedis counts commands run between two samples of a real
// redis-server.
func TestSamplerRealRedis(t *testing.T) {
	t.Parallel()
	srv, other := redistest.StartTB(t), redistest.StartTB(t)
	rdb := srv.Client()
	defer rdb.Close()
	ctx := t.Context()
	sha, err := rdb.ScriptLoad(ctx, "return redis.call('INCR', KEYS[1])").Result()
	if err != nil {
		t.Fatal(err)
	}

	s := NewSampler([]string{srv.Addr(), other.Addr(), srv.Addr()}, Credentials{}) // srv once, and the idle other
	defer s.Close()
	if got := len(s.Addrs()); got != 2 {
		t.Errorf("%d addresses sampled, want 2 (duplicates dropped)", got)
	}
	before, err := s.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if err := rdb.EvalSha(ctx, sha, []string{"n"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after, err := s.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	// The INCR inside the script is counted as a command of its own.
	if d.Total() != 10+5+5 || d["set"] != 10 || d.EvalSHA() != 5 || d["incr"] != 5 {
		t.Errorf("delta %v: total %d, want set 10, evalsha 5, incr 5, total 20", d, d.Total())
	}

	bad := NewSampler([]string{"127.0.0.1:1"}, Credentials{})
	defer bad.Close()
	if _, err := bad.Sample(ctx); err == nil {
		t.Error("sampling a closed port succeeded")
	}
}
