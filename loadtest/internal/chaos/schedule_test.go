package chaos

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var shape = Shape{Gateways: 3, Aggregators: 2, SpoolGateway: 3, RedisNodes: []string{"redis-a", "redis-b"}, Sentinels: 3}

func TestPlanIsReplayedBySeed(t *testing.T) {
	a := Plan(42, 10*time.Minute, 0, Kinds, shape)
	b := Plan(42, 10*time.Minute, 0, Kinds, shape)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if c := Plan(43, 10*time.Minute, 0, Kinds, shape); reflect.DeepEqual(a, c) {
		t.Fatal("two seeds gave one schedule")
	}
	if n := len(a); n < 80 || n > 100 {
		t.Fatalf("%d faults in 10 minutes, want about one per 6 s", n)
	}
}

func TestPlanRespectsItsBounds(t *testing.T) {
	for seed := range uint64(30) {
		d := 5 * time.Minute
		plan := Plan(seed, d, 0, Kinds, shape)
		for i, p := range plan {
			if p.At < 0 || p.At+p.For > d {
				t.Fatalf("seed %d: %v outside the fault phase", seed, p)
			}
			active, gws := 0, map[string]bool{}
			if strings.HasPrefix(p.Kind, "gw-") {
				gws[p.Target] = true
			}
			for _, q := range plan[:i] {
				if q.At+q.For+occupied <= p.At {
					continue
				}
				active++
				if busyKey(q) == busyKey(p) {
					t.Fatalf("seed %d: %v and %v share %s", seed, q, p, busyKey(p))
				}
				if strings.HasPrefix(q.Kind, "gw-") {
					gws[q.Target] = true
				}
			}
			if active >= maxConcurrent {
				t.Fatalf("seed %d: %v starts with %d faults in force", seed, p, active)
			}
			if len(gws) >= shape.Gateways {
				t.Fatalf("seed %d: %v leaves no gateway up", seed, p)
			}
		}
	}
}

func TestPlanDrawsOnlyTheKindsAllowed(t *testing.T) {
	kinds, err := ParseKinds("link-cut, gw-kill,link-cut")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, p := range Plan(7, 10*time.Minute, 60, kinds, shape) {
		seen[p.Kind]++
		if p.Kind == KindLinkCut && p.Link == nil {
			t.Fatalf("%v has no link", p)
		}
	}
	if len(seen) != 2 || seen[KindLinkCut] == 0 || seen[KindGatewayKill] == 0 {
		t.Fatalf("kinds drawn: %v", seen)
	}
	if _, err := ParseKinds("gw-kill,cosmic-ray"); err == nil || !strings.Contains(err.Error(), "cosmic-ray") {
		t.Fatalf("ParseKinds of an unknown kind: %v", err)
	}
	all, _ := ParseKinds("all")
	if len(all) != len(Kinds) {
		t.Fatalf("all = %v", all)
	}
}

func TestPlanCoversEveryKindOverALongRun(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Plan(1, 30*time.Minute, 0, Kinds, shape) {
		seen[p.Kind] = true
	}
	for _, k := range Kinds {
		if !seen[k] {
			t.Errorf("no %s in 30 minutes", k)
		}
	}
}

func TestPlanOnClusterDrawsNoSentinel(t *testing.T) {
	cl := Shape{Gateways: 3, Aggregators: 2, SpoolGateway: 3, RedisNodes: []string{"redis-1", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6"}}
	for _, p := range Plan(5, 30*time.Minute, 0, Kinds, cl) {
		if p.Kind == KindSentinelKill || strings.HasPrefix(p.Target, "sentinel-") || (p.Link != nil && strings.HasPrefix(p.Link.Client, "sentinel-")) {
			t.Fatalf("%v on a cluster", p)
		}
	}
}
