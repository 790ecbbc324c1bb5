package natsserver

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// link is the TCP path of one leafnode remote: the server dials the link's
// loopback listener, and the link forwards to the remote's address. Cutting
// it closes what is open and refuses new connections until it heals, as a
// partition would, without touching the server (nats-server's reload of
// its leafnode options races with its JetStream readers).
type link struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and every copy
}

// dialTimeout bounds a link's dial of its remote.
const dialTimeout = time.Second

// openLink listens on a free loopback port and forwards to target.
func openLink(target string) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &link{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	return l, nil
}

// Addr is the address the server dials.
func (l *link) Addr() string { return l.ln.Addr().String() }

func (l *link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.wg.Go(func() { l.forward(c) })
	}
}

// forward copies c to and from a new connection to the target until
// either side ends or the link is cut.
func (l *link) forward(c net.Conn) {
	if !l.track(c) {
		return
	}
	defer l.untrack(c)
	d, err := net.DialTimeout("tcp", l.target, dialTimeout)
	if err != nil {
		return
	}
	if !l.track(d) {
		return
	}
	defer l.untrack(d)
	done := make(chan struct{})
	go func() { // owned here: forward waits for it below
		defer close(done)
		_, _ = io.Copy(d, c)
		_ = d.Close()
	}()
	_, _ = io.Copy(c, d)
	_ = c.Close()
	<-done
}

// track registers a connection; false (and the connection closed) when
// the link is cut.
func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
}

// setCut cuts the link (closing every connection on it) or heals it.
func (l *link) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			_ = c.Close()
		}
	}
}

// close cuts the link for good and waits for its goroutines.
func (l *link) close() error {
	err := l.ln.Close()
	l.setCut(true)
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
