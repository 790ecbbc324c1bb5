package fleetkv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoResponders is returned by RequestReply when nobody listens on the
// subject (e.g. the region is cut off, or none of its aggregators runs).
var ErrNoResponders = errors.New("fleetkv: no responders")

// RequestReply sends data on subject and waits for one reply until ctx is
// done (core NATS request and reply: at most once, nothing is stored).
func (c *Conn) RequestReply(ctx context.Context, subject string, data []byte) ([]byte, error) {
	m, err := c.nc.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("request %s: %w", subject, ErrNoResponders)
	}
	if err != nil {
		return nil, fmt.Errorf("fleetkv: request %s: %w", subject, err)
	}
	return m.Data, nil
}

// MaxPayload is the largest message the server accepts.
func (c *Conn) MaxPayload() int { return int(c.nc.MaxPayload()) }

// ServeRequests answers requests on subject (in queue group queue: one
// member answers each) with h's reply, one request at a time, until ctx
// is done; nats.go keeps the subscription across reconnects. h gets ctx.
func (c *Conn) ServeRequests(ctx context.Context, subject, queue string, h func(ctx context.Context, data []byte) []byte) error {
	ch := make(chan *nats.Msg, 64)
	sub, err := c.nc.ChanQueueSubscribe(subject, queue, ch)
	if err != nil {
		return fmt.Errorf("fleetkv: subscribe %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			if m.Reply == "" {
				continue
			}
			if err := m.Respond(h(ctx, m.Data)); err != nil {
				c.log.Warn("answering a request failed", slog.String("subject", subject), slog.String("error", err.Error()))
			}
		}
	}
}

// JetStream is the connection's JetStream in its own (the local) domain.
func (c *Conn) JetStream() jetstream.JetStream { return c.js }

// JetStreamIn is the JetStream of another region's domain, reached across
// the links between regions (its API under $JS.<domain>.API).
func (c *Conn) JetStreamIn(domain string) (jetstream.JetStream, error) {
	js, err := jetstream.NewWithDomain(c.nc, domain)
	if err != nil {
		return nil, fmt.Errorf("fleetkv: jetstream in domain %s: %w", domain, err)
	}
	return js, nil
}
