package fleetkv

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// DefaultReconnectWait is Options.ReconnectWait's default.
const DefaultReconnectWait = 250 * time.Millisecond

// Options configure Connect.
type Options struct {
	// Name is the connection's name, shown by the server's monitoring
	// (e.g. tollgate-gateway-<gateway_id>).
	Name string
	// Log receives the connection's lines (connected, disconnected,
	// reconnected; Follow's); nil discards them. URLs are logged without
	// their user information.
	Log *slog.Logger
	// ReconnectWait is the pause between two attempts to reach NATS
	// (default DefaultReconnectWait); Follow's retries start from it too.
	ReconnectWait time.Duration
	// Down and Up end the log lines of a disconnect and of a reconnect
	// with what the caller does then (say, "the rules and controls in
	// force stay until it is back"); empty: nothing.
	Down, Up string
}

// Conn is a connection to the fleet's NATS. Connect makes it; Close ends
// it.
type Conn struct {
	nc            *nats.Conn
	js            jetstream.JetStream
	log           *slog.Logger
	reconnectWait time.Duration
	// up is signalled by every (re)connect, for Follow.
	up chan struct{}
	// retiring counts the watchers of ended Follow sessions still being
	// stopped; Close waits for them.
	retiring sync.WaitGroup
}

// Connect connects to NATS at url (several comma-separated). It does not
// wait for the server: while it is unreachable, nats.go retries every
// ReconnectWait, and so it does after every disconnect, for ever. Writes
// that fail are never replayed after a reconnect (see the package's
// notes). It fails only for a URL nats.go refuses.
func Connect(url string, o Options) (*Conn, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.ReconnectWait <= 0 {
		o.ReconnectWait = DefaultReconnectWait
	}
	c := &Conn{log: log, reconnectWait: o.ReconnectWait, up: make(chan struct{}, 1)}
	nc, err := nats.Connect(url, nats.Name(o.Name), nats.ReconnectBufSize(-1), nats.MaxReconnects(-1),
		nats.ReconnectWait(o.ReconnectWait), nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(nc *nats.Conn) {
			log.Info("nats connected", slog.String("url", RedactURL(nc.ConnectedUrl())))
			c.signalUp()
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info(note("nats reconnected", o.Up), slog.String("url", RedactURL(nc.ConnectedUrl())))
			c.signalUp()
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn(note("nats disconnected", o.Down), slog.String("error", err.Error()))
			}
		}),
		nats.NoCallbacksAfterClientClose())
	if err != nil {
		return nil, fmt.Errorf("fleetkv: connect %s: %w", RedactURL(url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("fleetkv: jetstream: %w", err)
	}
	c.nc, c.js = nc, js
	return c, nil
}

// note joins a log message and what the caller does meanwhile.
func note(msg, what string) string {
	if what == "" {
		return msg
	}
	return msg + "; " + what
}

// signalUp tells Follow that the connection is (back) up.
func (c *Conn) signalUp() {
	select {
	case c.up <- struct{}{}:
	default:
	}
}

// IsConnected reports whether the connection is up now. It is safe to call
// from any goroutine.
func (c *Conn) IsConnected() bool { return c.nc.IsConnected() }

// Status is the connection's state as nats.go names it (CONNECTED,
// RECONNECTING, …), for health reports.
func (c *Conn) Status() string { return c.nc.Status().String() }

// LastError is the last error the connection met (nil if none), for
// health reports.
func (c *Conn) LastError() error { return c.nc.LastError() }

// Close closes the connection, which ends the requests of watchers still
// being stopped, and waits for them.
func (c *Conn) Close() {
	c.nc.Close()
	c.retiring.Wait()
}

// OnCountersChanged calls fn with every message on
// tollgatev1.SubjectCounters, on a goroutine of nats.go's (fn must not
// block), until the connection is closed; nats.go keeps the subscription
// across reconnects. A message that does not decode comes with its error
// and a zero CountersChanged.
func (c *Conn) OnCountersChanged(fn func(tollgatev1.CountersChanged, error)) error {
	_, err := c.nc.Subscribe(tollgatev1.SubjectCounters, func(m *nats.Msg) {
		var cc tollgatev1.CountersChanged
		if err := json.Unmarshal(m.Data, &cc); err != nil {
			fn(tollgatev1.CountersChanged{}, fmt.Errorf("fleetkv: decode %s: %w", tollgatev1.SubjectCounters, err))
			return
		}
		fn(cc, nil)
	})
	if err != nil {
		return fmt.Errorf("fleetkv: subscribe %s: %w", tollgatev1.SubjectCounters, err)
	}
	return nil
}

// RedactURL hides the secrets in NATS URLs (several comma-separated), for
// logs: a password (the user name stays), or a token (nats://<token>@host,
// which sits where a user name would).
func RedactURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil || u.User == nil {
			continue
		}
		if _, password := u.User.Password(); password {
			parts[i] = u.Redacted()
		} else {
			u.User = url.User("xxxxx")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
