package stack_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/stack"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/testwait"
)

// startRegions starts a stack of n regions and waits until it is ready,
// allowing more time than one region's start; only warnings of its log
// go to the test's output.
func startRegions(t *testing.T, cfg stack.Config) *running {
	t.Helper()
	return startWithin(t, cfg, slog.LevelWarn, 90*time.Second)
}

// responder answers "ping" on subject from a region's NATS, for as long
// as the test runs: its interest reaches the other regions over the
// leafnode links.
func responder(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond([]byte("pong")) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// roundTrip asks, on one region's NATS, a question only a responder on
// another region's NATS answers: it crosses the leafnode link.
func roundTrip(from *nats.Conn, subject string) error {
	msg, err := from.Request(subject, []byte("ping"), time.Second)
	if err != nil {
		return fmt.Errorf("request across the link: %w", err)
	}
	if string(msg.Data) != "pong" {
		return fmt.Errorf("answer %q", msg.Data)
	}
	return nil
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, url, nats.Name("stack-test"), nats.MaxReconnects(-1))
}

// TestRegions starts the stack with two regions, linked through link
// proxies: each region answers through its own proxy, a key of the
// shipped world-demo rule (one limit of 10 across regions) rotating
// between them gets no more than 10 in all, the join files name every
// region, cutting r2's link leaves both regions deciding while NATS
// messages no longer cross, healing it restores the leafnode link, and
// the shutdown leaves no process, port or file behind.
func TestRegions(t *testing.T) {
	t.Parallel()
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	t0 := time.Now()
	cfg := testConfig(stack.RedisServer)
	cfg.Regions = 2
	cfg.EnvFile = filepath.Join(t.TempDir(), "stack.env")
	r := startRegions(t, cfg)
	t.Logf("two regions ready in %v", time.Since(t0).Round(time.Millisecond))
	r.checkCleanStart(t)
	regions := r.st.Regions()
	if len(regions) != 2 || regions[0].Name != "r1" || regions[1].Name != "r2" {
		t.Fatalf("regions %+v, want r1 and r2", regions)
	}
	if regions[0].Addrs != r.addrs {
		t.Errorf("Addrs %+v, want r1's %+v", r.addrs, regions[0].Addrs)
	}

	// Each region answers through its own proxy, in its own region.
	for _, reg := range regions {
		resp, body := get(t, "http://"+reg.Addrs.Proxy+"/v1/users/42", "sk_prod_acme_1")
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `"pro-default"`) {
			t.Fatalf("%s's proxy: %d %v %s", reg.Name, resp.StatusCode, resp.Header, body)
		}
	}

	// The global rule: 10 a minute across regions, equal shares of 5.
	admitted := map[string]int{}
	for range 8 {
		for _, reg := range regions {
			resp, body := get(t, "http://"+reg.Addrs.Proxy+"/v1/users/42", stack.GlobalDemoKey)
			switch resp.StatusCode {
			case 200:
				admitted[reg.Name]++
			case 429:
			default:
				t.Fatalf("%s: %d %s", reg.Name, resp.StatusCode, body)
			}
		}
	}
	if total := admitted["r1"] + admitted["r2"]; total > 10 || admitted["r1"] == 0 || admitted["r2"] == 0 {
		t.Fatalf("a key rotating between two regions was admitted %v, want at most 10 in all (the global limit), some in each", admitted)
	}
	t.Logf("rotating key admitted %v of 16 requests (global limit 10)", admitted)

	// The join files: bin/stack.env keeps r1's join variables and names
	// every region's addresses; bin/stack.r2.env joins r2. A binary
	// accepts every line.
	env := readEnvFile(t, cfg.EnvFile)
	env2 := readEnvFile(t, stack.RegionEnvFile(cfg.EnvFile, "r2"))
	for name, e := range map[string]map[string]string{"stack.env": env, "stack.r2.env": env2} {
		var environ []string
		for k, v := range e {
			environ = append(environ, k+"="+v)
		}
		if err := configs.CheckEnv(environ, configs.Registry()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, reg := range regions {
			v := "TOLLGATE_STACK_" + strings.ToUpper(reg.Name) + "_"
			want := map[string]string{v + "PROXY": "http://" + reg.Addrs.Proxy, v + "CHECK_API": "http://" + reg.Addrs.API,
				v + "AGGREGATOR": "http://" + reg.Addrs.Aggregator, v + "LINK": "http://" + reg.Link}
			for k, w := range want {
				if e[k] != w {
					t.Errorf("%s: %s=%q, want %q", name, k, e[k], w)
				}
			}
		}
	}
	if env["TOLLGATE_NATS_URL"] != regions[0].Addrs.NATS || env["TOLLGATE_REGION"] != "r1" ||
		env2["TOLLGATE_NATS_URL"] != regions[1].Addrs.NATS || env2["TOLLGATE_REGION"] != "r2" ||
		env2["TOLLGATE_REDIS_ADDRS"] != regions[1].Addrs.Redis || env2["TOLLGATE_KEY_SECRET"] != env["TOLLGATE_KEY_SECRET"] {
		t.Errorf("join files: stack.env %v, stack.r2.env %v", env, env2)
	}

	// The regions' NATS servers are linked, through r2's link.
	nc1, nc2 := connect(t, regions[0].Addrs.NATS), connect(t, regions[1].Addrs.NATS)
	responder(t, nc2, "stack.test.ping")
	testwait.Eventually(t, 15*time.Second, func() error { return roundTrip(nc1, "stack.test.ping") })
	link := env["TOLLGATE_STACK_R2_LINK"]
	var state struct{ Connections int }
	if resp, body := get(t, link+"/", ""); resp.StatusCode != 200 || json.Unmarshal(body, &state) != nil || state.Connections < 1 {
		t.Fatalf("GET %s/: %d %s, want r2's leafnode connection through it", link, resp.StatusCode, body)
	}

	post := func(path string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, link+path, nil)
		if resp, body := do(t, req); resp.StatusCode != 200 {
			t.Fatalf("POST %s%s: %d %s", link, path, resp.StatusCode, body)
		}
	}

	// 200 ms on r2's link: a message from r1 to r2 and back crosses it
	// twice; r2's gateway answers as before (no timing asserted).
	post("/latency?ms=200")
	t1 := time.Now()
	if _, err := nc1.Request("stack.test.ping", []byte("ping"), 10*time.Second); err != nil {
		t.Fatalf("across the slow link: %v", err)
	}
	if took := time.Since(t1); took < 400*time.Millisecond {
		t.Fatalf("a round trip across a link with 200 ms each way took %v, want at least 400ms", took)
	}
	if resp, body := get(t, "http://"+regions[1].Addrs.Proxy+"/v1/users/42", "sk_prod_acme_1"); resp.StatusCode != 200 {
		t.Fatalf("r2 with a slow link: %d %s", resp.StatusCode, body)
	}
	post("/latency?ms=0")

	// Cut r2's link, as the banner says, with its control API.
	post("/cut")
	took := testwait.Eventually(t, 15*time.Second, func() error {
		if err := roundTrip(nc1, "stack.test.ping"); err == nil {
			return fmt.Errorf("a message still crosses the cut link")
		}
		return nil
	})
	t.Logf("link cut observed in %v", took)
	// r2's NATS server keeps trying to link again, and is refused.
	testwait.Eventually(t, 15*time.Second, func() error {
		var st struct{ Connections, Refused int }
		if resp, body := get(t, link+"/", ""); resp.StatusCode != 200 || json.Unmarshal(body, &st) != nil || st.Connections != 0 || st.Refused < 1 {
			return fmt.Errorf("r2's link while cut: %d %s, want no connection and some refused", resp.StatusCode, body)
		}
		return nil
	})
	// Both regions go on deciding: the request path never waits on the link.
	for _, reg := range regions {
		resp, body := get(t, "http://"+reg.Addrs.Proxy+"/v1/users/42", "sk_prod_acme_1")
		if resp.StatusCode != 200 {
			t.Fatalf("%s with its link cut: %d %s", reg.Name, resp.StatusCode, body)
		}
		// The global key is still limited there: its share of this
		// minute's window (a new window may have begun since the rotating
		// client spent the last one, and a loan may have moved a unit)
		// runs out within the whole limit.
		limited := false
		for i := 0; i < 11 && !limited; i++ {
			resp, body = get(t, "http://"+reg.Addrs.Proxy+"/v1/users/42", stack.GlobalDemoKey)
			switch resp.StatusCode {
			case 429:
				limited = true
			case 200:
			default:
				t.Fatalf("%s with its link cut, the global key: %d %s", reg.Name, resp.StatusCode, body)
			}
		}
		if !limited {
			t.Fatalf("%s with its link cut admitted the global key 11 times in a row: more than the whole limit of 10", reg.Name)
		}
	}

	post("/heal")
	took = testwait.Eventually(t, 20*time.Second, func() error { return roundTrip(nc1, "stack.test.ping") })
	t.Logf("leafnode link back %v after the heal", took)

	r.checkLogKeys(t)
	for _, reg := range regions {
		if !strings.Contains(r.logs.String(), "region="+reg.Name+" part=gateway") {
			t.Errorf("no line of %s's gateway, named by its region, in the log", reg.Name)
		}
	}
	pids := []int{redisPid(t, regions[0].Addrs.Redis), redisPid(t, regions[1].Addrs.Redis)}
	r.stop(t)
	for _, reg := range regions {
		for _, a := range []string{reg.Addrs.Proxy, reg.Addrs.API, reg.Addrs.Aggregator, reg.Addrs.Demo, reg.Addrs.Redis, reg.Link, reg.LinkAddr,
			strings.TrimPrefix(reg.Addrs.NATS, "nats://"), reg.Addrs.Kafka} {
			if err := refused(a); err != nil {
				t.Errorf("after the stop: %v", err)
			}
		}
	}
	for _, pid := range pids {
		if pid == 0 {
			t.Error("no redis-server process found for a region")
			continue
		}
		testwait.Eventually(t, 5*time.Second, func() error {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return fmt.Errorf("redis-server %d outlived the stack", pid)
			}
			return nil
		})
	}
	for _, f := range []string{cfg.EnvFile, stack.RegionEnvFile(cfg.EnvFile, "r1"), stack.RegionEnvFile(cfg.EnvFile, "r2"), stack.PIDFile(cfg.EnvFile)} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s outlived the stack", f)
		}
	}
	t.Logf("TestRegions took %v", time.Since(t0).Round(time.Millisecond))
}

// TestREADMERegions runs the README's "Several regions" commands, as
// written, with bash and curl, against a stack of two regions, and checks
// each answer: the rotating key's statuses are the ones the README
// prints (the global limit, split in equal static shares), the cut and
// the heal act on r2's link, and r2 decides while cut off.
func TestREADMERegions(t *testing.T) {
	t.Parallel()
	if _, err := redisserver.LookPath(); err != nil {
		t.Fatalf("%v (make deps installs it)", err)
	}
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	stmts := readmeStatements(t, string(src), "## Several regions")

	cfg := testConfig(stack.RedisServer)
	cfg.EnvFile = filepath.Join(t.TempDir(), "stack.env")
	var r *running
	sh := newShell(t, "", map[string]string{})
	var nc1, nc2 *nats.Conn
	linkState := func(o shellOut, cut bool) error {
		var s struct {
			Name string
			Cut  bool
		}
		if err := expectJSON(o, 200, &s); err != nil {
			return err
		}
		if s.Name != "r2" || s.Cut != cut {
			return fmt.Errorf("want r2's link with cut %v: %s", cut, o.text)
		}
		return nil
	}
	steps := []step{
		{"TOLLGATE_STACK_REGIONS=2 make run", func(t *testing.T, st statement) {
			cfg.Regions = 2
			r = startRegions(t, cfg)
			regions := r.st.Regions()
			nc1, nc2 = connect(t, regions[0].Addrs.NATS), connect(t, regions[1].Addrs.NATS)
			responder(t, nc2, "readme.ping")
			testwait.Eventually(t, 15*time.Second, func() error { return roundTrip(nc1, "readme.ping") })
		}},
		{"set -a; . bin/stack.env; set +a", func(t *testing.T, _ statement) {
			for k, v := range readEnvFile(t, cfg.EnvFile) {
				sh.env = append(sh.env, k+"="+v)
			}
		}},
		{"sk_world_demo", func(t *testing.T, st statement) {
			if len(st.outputs) != 1 {
				t.Fatalf("README: the rotating loop should be followed by the line it prints, as a comment: %q", st.outputs)
			}
			o := sh.run(st.text)
			got := strings.Fields(o.text)
			if n := strings.Count(o.text, "200"); n > 10 || len(got) != 16 {
				t.Fatalf("the rotating key: %q, want 16 answers, at most 10 of them 200 (the global limit)", o.text)
			}
			if want := strings.Fields(st.outputs[0]); !slices.Equal(got, want) {
				t.Fatalf("README command\n%s\nprinted %q, the README says %q", st.text, o.text, st.outputs[0])
			}
		}},
		{"$TOLLGATE_STACK_R2_LINK/cut", func(t *testing.T, st statement) {
			if err := linkState(sh.run(st.text), true); err != nil {
				t.Fatal(err)
			}
			testwait.Eventually(t, 15*time.Second, func() error {
				if roundTrip(nc1, "readme.ping") == nil {
					return fmt.Errorf("NATS messages still cross r2's cut link")
				}
				return nil
			})
		}},
		{"$TOLLGATE_STACK_R2_PROXY/v1/users/42", func(t *testing.T, st statement) {
			if len(st.outputs) != 1 {
				t.Fatalf("README: the request to r2 should be followed by the line it prints, as a comment: %q", st.outputs)
			}
			if o := sh.run(st.text); o.text != st.outputs[0] {
				t.Fatalf("README command\n%s\nprinted %q, the README says %q", st.text, o.text, st.outputs[0])
			}
		}},
		{"$TOLLGATE_STACK_R2_LINK/heal", func(t *testing.T, st statement) {
			if err := linkState(sh.run(st.text), false); err != nil {
				t.Fatal(err)
			}
			took := testwait.Eventually(t, 20*time.Second, func() error { return roundTrip(nc1, "readme.ping") })
			t.Logf("r2 linked again %v after the heal", took)
		}},
	}
	runSteps(t, `README.md's "Several regions"`, stmts, steps)
	r.stop(t)
}
