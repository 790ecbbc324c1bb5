package tarpit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of ListenerConfig.
const (
	DefaultDelay   = time.Second
	DefaultMaxHeld = 1024
)

// ListenerConfig configures a Listener.
type ListenerConfig struct {
	// Table holds the throttled addresses; required.
	Table *Table
	// Delay is how long a new connection from a throttled address is held
	// before Accept returns it (default DefaultDelay).
	Delay time.Duration
	// MaxHeld is the most connections held at once (default
	// DefaultMaxHeld); a throttled address's connection beyond it is
	// closed at once.
	MaxHeld int
	// Exempt reports addresses never throttled, whatever the table says
	// (the trusted proxies); nil: none.
	Exempt func(netip.Addr) bool
	// OnThrottle is told of every connection from a throttled address:
	// refused false when it is held, true when it was closed at once; nil:
	// nobody. It runs on the accepting goroutine and must be quick.
	OnThrottle func(refused bool)
	// Now is the clock the table is read with (default time.Now).
	Now func() time.Time
}

// Listener wraps a net.Listener: Accept returns connections from
// addresses the Table does not throttle at once, and those from throttled
// addresses after ListenerConfig.Delay (or closes them when MaxHeld are
// already held). The connections it held are distinguishable with Held.
//
// Its first Accept starts two goroutines, one accepting from the wrapped
// listener and one releasing held connections; Close stops both, waits for
// them, and closes the connections still held. Accept and Close are safe
// for concurrent use, and Close is idempotent.
type Listener struct {
	net.Listener
	cfg ListenerConfig

	start     sync.Once
	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
	out       chan accepted // to Accept
	wake      chan struct{} // a connection was queued
	closeErr  error
	heldGauge atomic.Int64

	mu    sync.Mutex // guards queue
	queue []held     // FIFO: every connection is held for the same delay
}

type accepted struct {
	c   net.Conn
	err error
}

type held struct {
	c       net.Conn
	release time.Time
}

// heldConn marks a connection that was held.
type heldConn struct{ net.Conn }

// Held reports whether c came out of a Listener's hold: its address was
// throttled when it connected.
func Held(c net.Conn) bool {
	_, ok := c.(*heldConn)
	return ok
}

// NewListener wraps ln. It starts nothing until the first Accept.
func NewListener(ln net.Listener, cfg ListenerConfig) *Listener {
	if cfg.Delay <= 0 {
		cfg.Delay = DefaultDelay
	}
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = DefaultMaxHeld
	}
	if cfg.Exempt == nil {
		cfg.Exempt = func(netip.Addr) bool { return false }
	}
	if cfg.OnThrottle == nil {
		cfg.OnThrottle = func(bool) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Listener{
		Listener: ln, cfg: cfg,
		done: make(chan struct{}), out: make(chan accepted), wake: make(chan struct{}, 1),
	}
}

// Accept returns the next connection to serve. After Close it returns
// net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	l.start.Do(func() {
		select {
		case <-l.done:
			return // closed before the first Accept: start nothing
		default:
		}
		l.wg.Go(l.accept)
		l.wg.Go(l.release)
	})
	select {
	case a := <-l.out:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close closes the wrapped listener, stops the goroutines, waits for them
// and closes the connections still held.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.Listener.Close()
		l.start.Do(func() {}) // no start after this
		l.wg.Wait()
		l.mu.Lock()
		q := l.queue
		l.queue = nil
		l.mu.Unlock()
		for _, h := range q {
			_ = h.c.Close()
		}
		l.heldGauge.Store(0)
	})
	return l.closeErr
}

// HeldNow returns the number of connections held now.
func (l *Listener) HeldNow() int { return int(l.heldGauge.Load()) }

// accept takes connections from the wrapped listener until it fails for
// good: throttled ones go to the queue, the others straight to Accept.
func (l *Listener) accept() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !l.deliver(accepted{err: err}) || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // temporary: Accept's caller backs off
		}
		if l.throttled(c) {
			l.hold(c)
			continue
		}
		if !l.deliver(accepted{c: c}) {
			_ = c.Close()
			return
		}
	}
}

// deliver hands a to Accept; false once the listener is closed.
func (l *Listener) deliver(a accepted) bool {
	select {
	case l.out <- a:
		return true
	case <-l.done:
		return false
	}
}

func (l *Listener) throttled(c net.Conn) bool {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	return !l.cfg.Exempt(a) && l.cfg.Table.Throttled(a, l.cfg.Now())
}

// hold queues c for release after the delay, or closes it when MaxHeld
// connections are held already.
func (l *Listener) hold(c net.Conn) {
	l.mu.Lock()
	if len(l.queue) >= l.cfg.MaxHeld {
		l.mu.Unlock()
		_ = c.Close()
		l.cfg.OnThrottle(true)
		return
	}
	l.queue = append(l.queue, held{c: c, release: time.Now().Add(l.cfg.Delay)})
	l.heldGauge.Store(int64(len(l.queue)))
	l.mu.Unlock()
	l.cfg.OnThrottle(false)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// release hands held connections to Accept as their delay ends.
func (l *Listener) release() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		var next held
		ok := len(l.queue) > 0
		if ok {
			next = l.queue[0]
		}
		l.mu.Unlock()
		if !ok {
			select {
			case <-l.wake:
				continue
			case <-l.done:
				return
			}
		}
		if wait := time.Until(next.release); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		l.mu.Lock()
		l.queue[0] = held{}
		l.queue = l.queue[1:]
		l.heldGauge.Store(int64(len(l.queue)))
		l.mu.Unlock()
		if !l.deliver(accepted{c: &heldConn{next.c}}) {
			_ = next.c.Close()
			return
		}
	}
}
