package gateway

import (
	"context"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/gateway/internal/checkapi"
)

// The check API listener is served by fasthttp (checkapi.NewFastServer
// says why); the proxy and metrics listeners stay on net/http. The
// settings mirror addServer's: limits.read_header_timeout for the headers
// (from the first byte), limits.read_timeout for the body,
// apiWriteTimeout, limits.idle_timeout, limits.max_header_bytes, and
// limits.max_body_bytes answered 413 BODY_TOO_LARGE.

// fastServer is a fasthttp server with what shutdown needs beside it:
// fasthttp closes idle connections on shutdown but has no Close for the
// busy ones, so the listener tracks its connections.
type fastServer struct {
	srv *fasthttp.Server

	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]struct{}
	stopping bool // shutdown has begun
	closed   bool // shutdown timed out: every connection is being closed
}

func (s *Server) newAPIServer(cfg checkapi.Config) *fastServer {
	l := s.cfg.Limits
	return &fastServer{
		conns: make(map[net.Conn]struct{}),
		srv: checkapi.NewFastServer(cfg, checkapi.ServerLimits{
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			ReadTimeout:       l.ReadTimeout,
			WriteTimeout:      apiWriteTimeout,
			IdleTimeout:       l.IdleTimeout,
			MaxHeaderBytes:    l.MaxHeaderBytes,
		}),
	}
}

// serve serves ln until shutdown; nil after a shutdown, even one that
// began before serve did (as net/http's Serve after Shutdown).
func (f *fastServer) serve(ln net.Listener) error {
	f.mu.Lock()
	if f.stopping {
		f.mu.Unlock()
		return nil
	}
	f.ln = ln
	f.mu.Unlock()
	err := f.srv.Serve(&trackingListener{Listener: ln, f: f})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping {
		return nil // the listener closed by shutdown
	}
	return err
}

// shutdown stops accepting, lets in-flight requests finish until ctx is
// done, then closes every connection left.
func (f *fastServer) shutdown(ctx context.Context) error {
	f.mu.Lock()
	f.stopping = true
	ln := f.ln
	f.mu.Unlock()
	err := f.srv.ShutdownWithContext(ctx)
	if ln != nil {
		// fasthttp closes the listeners it knows; serve may have been
		// between its check and fasthttp's Serve.
		_ = ln.Close()
	}
	if err == nil {
		return nil
	}
	f.mu.Lock()
	f.closed = true
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	for _, c := range conns {
		_ = c.Close() // takes f.mu to forget itself
	}
	return err
}

// trackingListener records the connections it accepts until they close.
type trackingListener struct {
	net.Listener
	f *fastServer
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	f := l.f
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, f: f}
	f.conns[tc] = struct{}{}
	f.mu.Unlock()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	f    *fastServer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
	})
	return c.Conn.Close()
}
