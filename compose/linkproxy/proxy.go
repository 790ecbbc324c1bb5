// Package linkproxy is a TCP proxy that stands for a network link: it
// forwards every connection it accepts to a target, and can cut, stall,
// delay or make one-way the links of chosen clients, on the connections
// they hold and the ones they open later.
//
// A [Proxy] names each connection's client when it accepts it, with a
// [Classifier] (for example one built on [Owners], which finds the process
// holding the peer's socket, so that one proxy in front of a server tells
// its clients apart). A fault is set for a client name, or for
// [AnyClient].
//
// The chaos soak puts one proxy in front of every server of the fleet
// (docs/reliability.md).
//
// A [Link] is the local stack's link between two regions
// (docs/local-stack.md: Several regions), with a small HTTP control API on
// another loopback address that changes the link while it runs:
//
//	GET  /                the link's state (JSON)
//	POST /latency?ms=100  delay every byte by 100 ms, in both directions (0: none)
//	POST /cut             reset every live connection and refuse new ones
//	POST /stall           forward nothing and hold new connections
//	POST /heal            undo cut and stall: deliver what was held
//
// Every answer is the link's state as JSON; a bad request is a 400 whose
// body says what is wrong.
//
//	l, err := linkproxy.Start(ctx, linkproxy.Config{Listen: "127.0.0.1:0",
//		Target: "127.0.0.1:7422", ControlListen: "127.0.0.1:0"})
//	defer l.Close()
//
// Each connection's bytes wait in a bounded queue (MaxQueued chunks of at
// most ChunkSize bytes per direction): a slow reader slows the writer down,
// as TCP would, and the proxy's memory stays bounded however much latency
// is added.
package linkproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Mode is what a fault does to a link.
type Mode int

// Modes.
const (
	// Pass forwards both ways: no fault.
	Pass Mode = iota
	// Cut resets the client's connections and every new one at once: a
	// process gone from the network, seen as errors.
	Cut
	// Stall forwards nothing either way, and holds new connections
	// without dialling the target: a partition, seen as deadlines passing.
	// On heal what was held is delivered.
	Stall
	// Latency delays every chunk of data by Fault.Delay, both ways, from
	// when the proxy read it: the stream is late, not slower. Chunks
	// already read keep the delay they were read with.
	Latency
	// OneWay forwards one direction only (Fault.ToServer) and holds the
	// other.
	OneWay
)

// String names the mode as the soak's history does.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Cut:
		return "cut"
	case Stall:
		return "stall"
	case Latency:
		return "latency"
	case OneWay:
		return "oneway"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Fault is what happens to a client's link.
type Fault struct {
	Mode Mode
	// Delay is the latency added to each chunk (Latency).
	Delay time.Duration
	// ToServer is the direction that still flows (OneWay): true, from the
	// client to the server; false, from the server to the client.
	ToServer bool
}

// AnyClient names every client: a fault set for it applies to the
// clients without a fault of their own.
const AnyClient = "*"

// Unknown is the name of a client the classifier could not name.
const Unknown = "unknown"

// Classifier names the client of a connection from its peer address and
// the proxy's own address; "" means Unknown. It is called once per
// accepted connection, before any byte is forwarded.
type Classifier func(peer, local netip.AddrPort) string

// Option configures Listen.
type Option func(*Proxy)

// WithClassifier sets how clients are named (default: every client is
// Unknown).
func WithClassifier(c Classifier) Option { return func(p *Proxy) { p.classify = c } }

// WithLogger sets the logger of connection errors (default: discard).
func WithLogger(log *slog.Logger) Option { return func(p *Proxy) { p.log = log } }

// WithDialTimeout bounds the dial of the target (default 2 s); a client
// whose target cannot be dialled is reset.
func WithDialTimeout(d time.Duration) Option { return func(p *Proxy) { p.dialTimeout = d } }

// ErrClosed is returned by the methods that change a closed Link.
var ErrClosed = errors.New("linkproxy: closed")

const (
	// ChunkSize is the most bytes one read of a connection takes.
	ChunkSize = 32 << 10
	// MaxQueued is how many chunks of one direction of one connection
	// wait for their delay, or for a fault to let them through, at most.
	MaxQueued = 64
)

// Totals counts a proxy's connections since it started.
type Totals struct {
	// Accepted is how many connections were let through to the target.
	Accepted int64
	// Refused is how many connections were reset without reaching the
	// target because their client's link was cut.
	Refused int64
}

// Proxy is one TCP proxy. Its methods are safe for concurrent use.
type Proxy struct {
	ln          net.Listener
	classify    Classifier
	log         *slog.Logger
	dialTimeout time.Duration

	mu      sync.Mutex
	target  string           // guarded by mu
	faults  map[string]Fault // guarded by mu; by client name
	links   map[*link]bool   // guarded by mu
	changed chan struct{}    // guarded by mu; closed and replaced on every change
	closed  bool             // guarded by mu
	totals  Totals           // guarded by mu

	done chan struct{} // closed by Close
	wg   sync.WaitGroup
}

// Listen binds addr (host:port, port 0 for a free one) and starts the
// proxy's accept loop, one goroutine; each connection then has five (its
// handler, and a reader and a writer each way). Close stops all of them and waits. Until
// SetTarget names a target, connections are held as in a stall.
func Listen(addr string, opts ...Option) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("linkproxy: listen %s: %w", addr, err)
	}
	p := &Proxy{ln: ln, dialTimeout: 2 * time.Second, faults: map[string]Fault{}, links: map[*link]bool{},
		changed: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(p)
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetTarget sets the address new connections are forwarded to. Existing
// connections keep theirs.
func (p *Proxy) SetTarget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = addr
	p.changedLocked()
}

// Set puts fault f on the links of client (or AnyClient). A Cut resets
// the client's connections at once.
func (p *Proxy) Set(client string, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f.Mode == Pass {
		delete(p.faults, client)
	} else {
		p.faults[client] = f
	}
	p.changedLocked()
	if f.Mode != Cut {
		return
	}
	for l := range p.links {
		if p.faultLocked(l.client).Mode == Cut {
			l.reset()
		}
	}
}

// Clear heals the links of client (or AnyClient): held data is delivered.
func (p *Proxy) Clear(client string) { p.Set(client, Fault{}) }

// Conns returns how many connections the proxy holds, per client name.
func (p *Proxy) Conns() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for l := range p.links {
		out[l.client]++
	}
	return out
}

// Totals returns how many connections the proxy let through and refused.
func (p *Proxy) Totals() Totals {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.totals
}

func (p *Proxy) count(f func(*Totals)) {
	p.mu.Lock()
	f(&p.totals)
	p.mu.Unlock()
}

// Close stops accepting, resets every connection and waits for the
// proxy's goroutines. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	for l := range p.links {
		l.reset()
	}
	p.changedLocked()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// faultLocked is the fault in force for client.
func (p *Proxy) faultLocked(client string) Fault {
	if f, ok := p.faults[client]; ok {
		return f
	}
	return p.faults[AnyClient]
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			p.log.Warn("linkproxy: accept", slog.String("addr", p.Addr()), slog.String("error", err.Error()))
			return
		}
		name := Unknown
		if p.classify != nil {
			ap, err1 := netip.ParseAddrPort(c.RemoteAddr().String())
			lp, err2 := netip.ParseAddrPort(c.LocalAddr().String())
			if err1 == nil && err2 == nil {
				if n := p.classify(ap, lp); n != "" {
					name = n
				}
			}
		}
		l := &link{client: name, c: c, done: make(chan struct{})}
		l.ctx, l.cancel = context.WithCancel(context.Background())
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.reset()
			return
		}
		p.links[l] = true
		p.mu.Unlock()
		p.wg.Add(1)
		go p.handle(l)
	}
}

// handle waits until the client may connect, dials the target and pumps
// both ways until both directions end or the link is reset.
func (p *Proxy) handle(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.reset()
	}()
	target, ok := p.admit(l)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, p.dialTimeout) // a reset ends the dial
	var d net.Dialer
	s, err := d.DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		return
	}
	if !l.attach(s) {
		_ = s.Close()
		return
	}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(l, s, l.c, true) }()
	go func() { defer pumps.Done(); p.pump(l, l.c, s, false) }()
	pumps.Wait()
	l.end(false) // both directions ended cleanly, unless reset meanwhile
}

// admit waits until a new connection of l's client may be dialled: no
// target yet and Stall hold it, Cut refuses it.
func (p *Proxy) admit(l *link) (string, bool) {
	for {
		p.mu.Lock()
		f, target, ch := p.faultLocked(l.client), p.target, p.changed
		p.mu.Unlock()
		switch {
		case f.Mode == Cut:
			p.count(func(t *Totals) { t.Refused++ })
			return "", false
		case target != "" && f.Mode != Stall:
			p.count(func(t *Totals) { t.Accepted++ })
			return target, true
		}
		select {
		case <-ch:
		case <-l.done:
			return "", false
		}
	}
}

// chunk is what one read of a connection took, due at due (zero: at once).
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst, toServer being the direction: it reads into a
// queue of at most MaxQueued chunks, and a writer takes each chunk once its
// latency has passed and the fault in force lets it through, so that a
// latency delays the bytes without slowing the stream and a slow reader
// slows the writer down. When src ends, dst's write side is closed; an
// error resets the link.
func (p *Proxy) pump(l *link, dst, src net.Conn, toServer bool) {
	q := make(chan chunk, MaxQueued)
	var w sync.WaitGroup
	w.Go(func() { p.write(l, dst, q, toServer) })
	defer w.Wait()
	defer close(q)
	for {
		buf := make([]byte, ChunkSize)
		n, err := src.Read(buf)
		if n > 0 {
			c := chunk{b: buf[:n]}
			if d := p.delay(l.client); d > 0 {
				c.due = time.Now().Add(d)
			}
			select {
			case q <- c:
			case <-l.done:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				l.reset()
			}
			return
		}
	}
}

// write is pump's writer: it ends when q is closed and drained, or the
// link is reset.
func (p *Proxy) write(l *link, dst net.Conn, q <-chan chunk, toServer bool) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for c := range q {
		if wait := time.Until(c.due); !c.due.IsZero() && wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if !p.gate(l, toServer) {
			l.reset()
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.reset()
			return
		}
	}
	select {
	case <-l.done:
		return
	default:
	}
	// src ended: pass the end on, as TCP would.
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	l.reset()
}

// delay is the latency client's fault adds to a chunk read now.
func (p *Proxy) delay(client string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.faultLocked(client); f.Mode == Latency {
		return f.Delay
	}
	return 0
}

// gate blocks until a chunk may go in direction toServer; false: the link
// is to be reset.
func (p *Proxy) gate(l *link, toServer bool) bool {
	for {
		p.mu.Lock()
		f, ch := p.faultLocked(l.client), p.changed
		p.mu.Unlock()
		switch f.Mode {
		case Pass:
			return true
		case Cut:
			return false
		case Latency:
			return true // the chunk has waited its delay in the queue
		case OneWay:
			if f.ToServer == toServer {
				return true
			}
		}
		select {
		case <-ch:
		case <-l.done:
			return false
		}
	}
}

// link is one proxied connection.
type link struct {
	client string
	c      net.Conn // the client's
	done   chan struct{}
	ctx    context.Context // ends with done
	cancel context.CancelFunc

	mu   sync.Mutex
	s    net.Conn // the target's, once dialled
	dead bool
	once sync.Once
}

// attach records the target's connection; false when the link was reset
// meanwhile.
func (l *link) attach(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return false
	}
	l.s = s
	return true
}

// reset closes both connections with a TCP reset (no lingering), once.
func (l *link) reset() { l.end(true) }

// end closes both connections, with a reset when abort is set, once.
func (l *link) end(abort bool) {
	l.once.Do(func() {
		l.mu.Lock()
		l.dead = true
		s := l.s
		l.mu.Unlock()
		close(l.done)
		l.cancel()
		for _, c := range []net.Conn{l.c, s} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && abort {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}
