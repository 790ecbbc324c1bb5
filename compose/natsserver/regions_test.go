package natsserver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/testwait"
)

// crossing publishes on subject from pub until sub receives it, polling, and
// returns nil once it did.
func crossing(t *testing.T, pub *nats.Conn, sub *nats.Subscription, subject string) func() error {
	return func() error {
		if err := pub.Publish(subject, []byte("hello")); err != nil {
			return err
		}
		if err := pub.Flush(); err != nil {
			return err
		}
		if _, err := sub.NextMsg(50 * time.Millisecond); err != nil {
			return fmt.Errorf("%s not received across regions: %w", subject, err)
		}
		return nil
	}
}

// domainOf returns the JetStream domain that answers js's account info.
func domainOf(t *testing.T, js jetstream.JetStream) (string, error) {
	info, err := js.AccountInfo(t.Context())
	if err != nil {
		return "", err
	}
	return info.Domain, nil
}

func TestRegionsLinkedByLeafnodes(t *testing.T) {
	t.Parallel()
	regions := []string{"eu", "us", "ap"}
	servers := natstest.StartRegionsTB(t, regions)
	conns := make([]*nats.Conn, len(servers))
	for i, s := range servers {
		if got := s.Domain(); got != regions[i] {
			t.Fatalf("server %d: domain %q, want %q", i, got, regions[i])
		}
		conns[i] = connect(t, s)
	}
	if servers[0].LeafnodeURL() == "" || servers[1].LeafnodeURL() != "" {
		t.Fatalf("leafnode URLs: hub %q, spoke %q", servers[0].LeafnodeURL(), servers[1].LeafnodeURL())
	}

	// A core subject crosses spoke to spoke (through the hub) and hub to spoke.
	subAP, err := conns[2].SubscribeSync("tollgate.test.ap")
	if err != nil {
		t.Fatal(err)
	}
	subEU, err := conns[0].SubscribeSync("tollgate.test.eu")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, crossing(t, conns[1], subAP, "tollgate.test.ap"))
	testwait.Eventually(t, 10*time.Second, crossing(t, conns[2], subEU, "tollgate.test.eu"))
	testwait.Eventually(t, 10*time.Second, crossing(t, conns[0], subAP, "tollgate.test.ap"))

	// Each region's JetStream answers in its own domain; another region's
	// is reached only by naming its domain.
	for i, nc := range conns {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := domainOf(t, js); err != nil || d != regions[i] {
			t.Fatalf("region %s: JetStream domain %q (%v), want its own", regions[i], d, err)
		}
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		js, err := jetstream.NewWithDomain(conns[0], "ap")
		if err != nil {
			return err
		}
		if d, err := domainOf(t, js); err != nil || d != "ap" {
			return fmt.Errorf("domain ap from eu: %q (%v)", d, err)
		}
		return nil
	})

	// Cut the link of ap: it and the others keep their JetStream, nothing
	// crosses to it, and it comes back on heal.
	if err := servers[2].CutLinks(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		if n := servers[2].Leafnodes(); n != 0 {
			return fmt.Errorf("ap still has %d links", n)
		}
		return nil
	})
	// And it stays cut: ap retries every 250ms, and a remote that had
	// learnt the hub's own leafnode address would link again around the
	// proxy.
	stay := time.NewTicker(50 * time.Millisecond)
	defer stay.Stop()
	for until := time.Now().Add(2 * time.Second); time.Now().Before(until); {
		<-stay.C
		if n := servers[2].Leafnodes(); n != 0 {
			t.Fatalf("ap linked again (%d links) while cut off", n)
		}
	}
	for i, nc := range conns {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "cut"})
		if err != nil {
			t.Fatalf("region %s: JetStream while ap is cut off: %v", regions[i], err)
		}
		if _, err := kv.PutString(t.Context(), "k", regions[i]); err != nil {
			t.Fatalf("region %s: KV put while ap is cut off: %v", regions[i], err)
		}
		if d, err := domainOf(t, js); err != nil || d != regions[i] {
			t.Fatalf("region %s: JetStream domain %q (%v) while ap is cut off", regions[i], d, err)
		}
	}
	if err := conns[1].Publish("tollgate.test.ap", []byte("lost")); err != nil {
		t.Fatal(err)
	}
	if err := conns[1].Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := subAP.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("ap received %v (%v) while cut off", m, err)
	}
	if err := servers[2].HealLinks(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitLinkedTB(t, servers)
	testwait.Eventually(t, 10*time.Second, crossing(t, conns[1], subAP, "tollgate.test.ap"))
}

func TestLeafnodeOptionsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  natsserver.Option
	}{
		{"listen not loopback", natsserver.WithLeafnodeListen("0.0.0.0:0")},
		{"listen without port", natsserver.WithLeafnodeListen("127.0.0.1")},
		{"remote without host", natsserver.WithLeafnodeRemotes("nats-leaf://")},
		{"remote not a URL", natsserver.WithLeafnodeRemotes("::nope")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := natsserver.Start(t.Context(), tc.opt)
			if err == nil {
				_ = s.Stop()
				t.Fatal("started")
			}
			t.Log(err)
		})
	}
}
