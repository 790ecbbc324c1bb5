package gateway

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/gateway/internal/tarpit"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/internal/promdef"
)

// The proxy's connection-level answer to repeat offenders (the
// offenders section). Keys at the top of the penalty ladder are answered
// from the guard's memory (no Redis), with prebuilt bodies (httpguard); a
// direct client's connection is closed at its offenders.close_after-th
// such answer, and its address is then throttled at accept for
// offenders.throttle_for: each new connection is held for
// offenders.throttle_delay before it is read, and closed at its first such
// answer. Trusted proxies are never closed nor throttled: their
// connections carry other clients too.

// offenders is the Server's state of that answer.
type offenders struct {
	cfg   OffendersConfig
	id    *httpguard.Identity
	table *tarpit.Table // nil with offenders.throttle off
	ln    *tarpit.Listener
}

func newOffenders(cfg OffendersConfig, id *httpguard.Identity) *offenders {
	o := &offenders{cfg: cfg, id: id}
	if cfg.Throttle == ThrottleOn {
		o.table = tarpit.NewTable(cfg.MaxAddresses)
	}
	return o
}

// connContext tracks each proxy connection for httpguard: a connection
// from a throttled address is closed at its first top-of-ladder answer.
func (o *offenders) connContext(ctx context.Context, c net.Conn) context.Context {
	n := o.cfg.CloseAfter
	if tarpit.Held(c) {
		n = 1
	}
	return httpguard.TrackConn(ctx, n)
}

// onClose is told of every connection the proxy closes: counted, and for
// the top of the ladder its address throttled. httpguard closes only
// direct clients' connections, never a trusted proxy's.
func (s *Server) onClose(r *http.Request, d *guard.Decision) {
	s.m.ConnectionClosed(d.CloseConnection)
	if !d.CloseConnection || s.offenders.table == nil {
		return
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil && !s.offenders.id.TrustedAddr(ap.Addr()) {
		s.offenders.table.Mark(ap.Addr(), time.Now().Add(s.offenders.cfg.ThrottleFor))
	}
}

// wrapProxyListener returns the proxy's listener, throttling at accept when
// offenders.throttle is on.
func (s *Server) wrapProxyListener(ln net.Listener) net.Listener {
	o := s.offenders
	if o.table == nil {
		return ln
	}
	o.ln = tarpit.NewListener(ln, tarpit.ListenerConfig{
		Table:      o.table,
		Delay:      o.cfg.ThrottleDelay,
		MaxHeld:    o.cfg.MaxHeld,
		Exempt:     o.id.TrustedAddr,
		OnThrottle: s.m.AcceptThrottled,
	})
	return o.ln
}

// offenderCollectors are the gauges of throttling, read at scrape time.
func (s *Server) offenderCollectors() []prometheus.Collector {
	o := s.offenders
	if o.table == nil {
		return nil
	}
	return []prometheus.Collector{
		promdef.GaugeFunc("tollgate_accept_throttled_addresses", "Client addresses (IPv6 by /64) throttled at accept now: their connection was closed for a key at the top of the penalty ladder within offenders.throttle_for.", func() float64 { return float64(o.table.Len(time.Now())) }),
		promdef.GaugeFunc("tollgate_accept_held_connections", "New proxy connections from throttled addresses held now (at most offenders.max_held).", func() float64 {
			if o.ln == nil {
				return 0
			}
			return float64(o.ln.HeldNow())
		}),
	}
}
