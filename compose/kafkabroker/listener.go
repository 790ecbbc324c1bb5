package kafkabroker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
)

// trackingListener counts the connections it accepted that are still open,
// so Down can wait until kfake, which does not wait for its connection
// goroutines, has closed every one.
type trackingListener struct {
	net.Listener

	mu       sync.Mutex
	open     int
	closed   bool
	finished bool          // done is closed
	done     chan struct{} // closed once closed && open == 0
}

func newTrackingListener(l net.Listener) *trackingListener {
	return &trackingListener{Listener: l, done: make(chan struct{})}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.mu.Unlock()
	return &trackedConn{Conn: c, l: l}, nil
}

// Close closes the listener; it is idempotent (kfake closes it twice).
func (l *trackingListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		l.maybeDone()
	}
	return err
}

// idle returns a channel closed once the listener is closed and every
// connection it accepted is closed.
func (l *trackingListener) idle() <-chan struct{} { return l.done }

// maybeDone closes done when nothing is left open. A connection accepted
// while Close ran may still arrive after done is closed; Down then does not
// wait for it. l.mu must be held.
func (l *trackingListener) maybeDone() {
	if l.closed && l.open == 0 && !l.finished {
		l.finished = true
		close(l.done)
	}
}

func (l *trackingListener) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	l.maybeDone()
}

// advertisedListener is a listener that reports addr as its address:
// kfake advertises its listener's address in metadata.
type advertisedListener struct {
	*trackingListener
	addr net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.addr }

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

// slogAdapter sends kfake's log lines to a *slog.Logger, formatting only
// those the handler accepts.
type slogAdapter struct{ log *slog.Logger }

var _ kfake.Logger = slogAdapter{}

func (a slogAdapter) Logf(level kfake.LogLevel, format string, args ...any) {
	var l slog.Level
	switch level {
	case kfake.LogLevelError:
		l = slog.LevelError
	case kfake.LogLevelWarn:
		l = slog.LevelWarn
	case kfake.LogLevelInfo:
		l = slog.LevelInfo
	case kfake.LogLevelDebug:
		l = slog.LevelDebug
	default:
		return
	}
	ctx := context.Background()
	if !a.log.Enabled(ctx, l) {
		return
	}
	a.log.Log(ctx, l, fmt.Sprintf(format, args...), "component", "kfake")
}
