// Package h2grpc is a small gRPC server for unary calls over HTTP/2,
// built on golang.org/x/net/http2's Framer and hpack: one goroutine per
// connection reads its frames, and a call whose answer needs no waiting is
// decided on that goroutine, its answer written with those of the other
// calls read in the same batch and flushed once. A call that must wait
// (a handler returning ErrWouldBlock) is handed to another goroutine (one
// kept from an earlier such call when one is idle) and answered when it is
// done. A server at moderate load, where calls
// arrive one at a time, so pays one read and one write per call and no
// hand-off between goroutines.
//
// It speaks the HTTP/2 a gRPC client needs: the connection preface,
// SETTINGS and their acknowledgement, PING, flow control both ways
// (WINDOW_UPDATE), RST_STREAM, CONTINUATION, a bound on concurrent streams,
// on frame and message sizes, GOAWAY with a graceful drain on Shutdown;
// grpc-timeout is honoured and answers end with grpc-status and
// grpc-message trailers. Malformed frames end the connection with GOAWAY
// and the HTTP/2 error code; a malformed call gets its gRPC status.
// Compressed messages and streaming methods are not served (Unimplemented).
package h2grpc

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrWouldBlock is returned by a Handler called with a context for which
// Local reports true when the call cannot be answered without waiting:
// the server calls it again on a goroutine of its own.
var ErrWouldBlock = errors.New("h2grpc: call would block")

// A Handler answers one unary call: req is the request message (valid
// only during the call), and the response message is appended to resp,
// whose bytes (the server's own framing) must be kept as they are.
// An error is the call's status (status.Error); a Handler called with a
// context for which Local reports true may return ErrWouldBlock instead,
// having done nothing.
type Handler func(ctx context.Context, req, resp []byte) ([]byte, error)

type localKey struct{}

// Local reports whether a Handler's call is made on the connection's
// reading goroutine, where it must not wait.
func Local(ctx context.Context) bool { return ctx.Value(localKey{}) != nil }

// Defaults of the Options.
const (
	DefaultMaxMessage       = 1 << 20
	DefaultMaxStreams       = 1024
	DefaultMaxHeaderList    = 64 << 10
	DefaultHandshakeTimeout = 20 * time.Second
)

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// MaxMessage is the largest request message, in bytes; larger ones
	// get ResourceExhausted.
	MaxMessage int
	// MaxStreams is the most calls in flight on one connection
	// (SETTINGS_MAX_CONCURRENT_STREAMS); more are refused (REFUSED_STREAM).
	MaxStreams uint32
	// MaxHeaderList is the largest header list of a call
	// (SETTINGS_MAX_HEADER_LIST_SIZE); larger ones get ResourceExhausted.
	MaxHeaderList uint32
	// TLS, when set, serves TLS with ALPN h2.
	TLS *tls.Config
	// HandshakeTimeout bounds the TLS handshake and the connection
	// preface.
	HandshakeTimeout time.Duration
	// Context wraps the context of the calls made on a connection's
	// reading goroutine (for example with guard.LocalOnly); nil: none.
	Context func(context.Context) context.Context
	// Logger logs connections ended by errors (debug). Nil: discard.
	Logger *slog.Logger
}

// A Server serves unary gRPC methods. Create it with New, add methods with
// Handle before Serve.
type Server struct {
	opts    Options
	methods map[string]Handler
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc

	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*conn]struct{}
	draining bool
	done     chan struct{} // closed when draining starts
	wg       sync.WaitGroup

	// work hands a call that must wait to a goroutine idle after an
	// earlier one (goCall); workers counts those goroutines.
	work    chan func()
	workers sync.WaitGroup
	started atomic.Uint64 // goroutines goCall started, for the tests

	inline, async atomic.Uint64
}

// workerIdle is how long a goroutine that ran a call waits for the next
// before it ends.
const workerIdle = 10 * time.Second

// goCall runs fn, a call that must wait, on a goroutine kept from an
// earlier call, or on a new one. A goroutine started for each call grew
// its stack through the handler's calls every time, copying it at each
// doubling: with a twentieth of the calls waiting for Redis at 7,000
// calls/s, the stack copies and goroutine starts were 2 % of the CPU. A
// kept goroutine's stack has grown already; one idle for workerIdle ends,
// and Shutdown ends the rest.
func (s *Server) goCall(fn func()) {
	select {
	case s.work <- fn:
		return
	default:
	}
	s.workers.Add(1)
	s.started.Add(1)
	go s.worker(fn)
}

// worker runs fn, then the calls goCall hands it, until it has been idle
// for workerIdle or the server is shut down.
func (s *Server) worker(fn func()) {
	defer s.workers.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		fn()
		fn = nil
		idle.Reset(workerIdle)
		select {
		case fn = <-s.work:
		case <-idle.C:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// Calls returns how many calls were answered on their connection's
// reading goroutine (inline) and on goroutines of their own (async).
func (s *Server) Calls() (inline, async uint64) { return s.inline.Load(), s.async.Load() }

// New returns a Server with opts.
func New(opts Options) *Server {
	if opts.MaxMessage <= 0 {
		opts.MaxMessage = DefaultMaxMessage
	}
	opts.MaxStreams = cmp.Or(opts.MaxStreams, DefaultMaxStreams)
	opts.MaxHeaderList = cmp.Or(opts.MaxHeaderList, DefaultMaxHeaderList)
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.TLS != nil {
		opts.TLS = opts.TLS.Clone()
		opts.TLS.NextProtos = []string{"h2"}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		opts: opts, methods: map[string]Handler{}, log: log, ctx: ctx, cancel: cancel,
		lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, done: make(chan struct{}),
		work: make(chan func()),
	}
}

// Handle serves the unary method path ("/package.Service/Method") with h.
// Call it before Serve.
func (s *Server) Handle(path string, h Handler) { s.methods[path] = h }

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("h2grpc: server closed")

// Serve accepts connections on ln until Shutdown, which makes it return
// ErrServerClosed; any other error ends it too. Each connection is
// served by a goroutine of its own, which Shutdown waits for.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			draining := s.draining
			s.mu.Unlock()
			if draining {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
				case <-s.done:
				}
				continue
			}
			return fmt.Errorf("h2grpc: accept: %w", err)
		}
		delay = 0
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			_ = nc.Close()
			return ErrServerClosed
		}
		c := s.track(nc)
		s.mu.Unlock()
		go s.run(c)
	}
}

// ServeConn serves one connection accepted elsewhere until it ends.
func (s *Server) ServeConn(nc net.Conn) {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	c := s.track(nc)
	s.mu.Unlock()
	s.run(c)
}

// track registers a new connection; s.mu is held.
func (s *Server) track(nc net.Conn) *conn {
	c := newConn(s, nc)
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return c
}

// run serves c, then forgets it.
func (s *Server) run(c *conn) {
	defer s.wg.Done()
	c.serve()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops accepting connections, tells every connection to take no
// more calls (GOAWAY), and waits for the calls in flight until ctx is done;
// then it cuts what is left. It returns once every connection's goroutines
// have ended, and the goroutines kept for calls too.
func (s *Server) Shutdown(ctx context.Context) {
	s.mu.Lock()
	if !s.draining {
		s.draining = true
		close(s.done)
	}
	for ln := range s.lns {
		_ = ln.Close()
	}
	clear(s.lns)
	conns := s.connList()
	s.mu.Unlock()
	// Outside s.mu: a GOAWAY to a client that does not read may wait
	// until the cut below.
	var told sync.WaitGroup
	defer told.Wait()
	for _, c := range conns {
		told.Go(c.goAway)
	}
	finished := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		s.cancel()
		s.mu.Lock()
		conns := s.connList()
		s.mu.Unlock()
		for _, c := range conns {
			c.close()
		}
		<-finished
	}
	s.cancel()
	// Every call has been answered: the goroutines kept for the next
	// ones end.
	s.workers.Wait()
}

// connList returns the connections served; s.mu is held.
func (s *Server) connList() []*conn {
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// statusOf returns the gRPC code and message of a Handler's error.
func statusOf(err error) (codes.Code, string) {
	if err == nil {
		return codes.OK, ""
	}
	st, ok := status.FromError(err)
	if !ok {
		return codes.Unknown, err.Error()
	}
	return st.Code(), st.Message()
}
