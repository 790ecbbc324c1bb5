package linkproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate/tollgate/compose/internal/loopback"
)

// Errors; match them with errors.Is.
var (
	// ErrBadLatency is a latency outside [0, MaxLatency].
	ErrBadLatency = errors.New("linkproxy: latency out of range")
)

const (
	// MaxLatency is the largest latency the link accepts.
	MaxLatency = time.Minute
	// ChunkSize is the most bytes one read of a connection takes.
	ChunkSize = 32 << 10
	// MaxQueued is how many chunks of one direction of one connection
	// wait for their delay at most.
	MaxQueued = 64
	// dialTimeout bounds the connection to the target.
	dialTimeout = 5 * time.Second
)

// Config is what Start needs.
type Config struct {
	// Name names the link in logs and in its state (r2, say).
	Name string
	// Listen is the loopback address the link accepts connections on
	// ("127.0.0.1:0": a free port; Addr tells which).
	Listen string
	// Target is the address every connection is forwarded to.
	Target string
	// ControlListen is the loopback address of the control API.
	ControlListen string
	// Logger receives one line per change of the link; nil discards.
	Logger *slog.Logger
}

// State is the link's state, as GET / answers it.
type State struct {
	Name        string `json:"name"`
	Listen      string `json:"listen"`
	Target      string `json:"target"`
	LatencyMS   int64  `json:"latency_ms"`
	Cut         bool   `json:"cut"`
	Connections int    `json:"connections"` // live now
	Accepted    int64  `json:"accepted"`    // since the start
	Refused     int64  `json:"refused"`     // while cut
}

// Link is a running link. Its methods are safe for concurrent use.
type Link struct {
	cfg     Config
	log     *slog.Logger
	ln      net.Listener
	ctl     net.Listener
	srv     *http.Server
	wg      sync.WaitGroup  // the accept loop, the control server and every connection's goroutines
	ctx     context.Context // canceled by Close: ends dials in progress
	stop    context.CancelFunc
	closing chan struct{}
	once    sync.Once

	mu       sync.Mutex
	latency  time.Duration
	cut      bool
	closed   bool
	conns    map[*relayConn]struct{}
	accepted int64
	refused  int64
}

// Start listens on cfg.Listen and cfg.ControlListen and serves both until
// Close. ctx bounds only the start.
func Start(ctx context.Context, cfg Config) (*Link, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("linkproxy: start: %w", err)
	}
	for _, a := range []string{cfg.Listen, cfg.ControlListen} {
		if _, _, err := loopback.Split(a); err != nil {
			return nil, fmt.Errorf("linkproxy: start: %w", err)
		}
	}
	if _, _, err := net.SplitHostPort(cfg.Target); err != nil {
		return nil, fmt.Errorf("linkproxy: start: target %q: %w", cfg.Target, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("linkproxy: start: %w", err)
	}
	ctl, err := lc.Listen(ctx, "tcp", cfg.ControlListen)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("linkproxy: start: control: %w", err)
	}
	p := &Link{cfg: cfg, log: log.With(slog.String("link", cfg.Name)), ln: ln, ctl: ctl,
		closing: make(chan struct{}), conns: map[*relayConn]struct{}{}}
	p.ctx, p.stop = context.WithCancel(context.WithoutCancel(ctx))
	p.srv = &http.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	p.wg.Go(p.accept)
	p.wg.Go(func() { _ = p.srv.Serve(ctl) })
	p.log.Info("link proxy started", slog.String("listen", p.Addr()), slog.String("target", cfg.Target),
		slog.String("control", p.ControlAddr()))
	return p, nil
}

// Addr is the address the link accepts connections on.
func (p *Link) Addr() string { return p.ln.Addr().String() }

// ControlAddr is the control API's address.
func (p *Link) ControlAddr() string { return p.ctl.Addr().String() }

// State returns the link's state.
func (p *Link) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return State{Name: p.cfg.Name, Listen: p.Addr(), Target: p.cfg.Target, LatencyMS: p.latency.Milliseconds(),
		Cut: p.cut, Connections: len(p.conns), Accepted: p.accepted, Refused: p.refused}
}

// SetLatency delays every byte forwarded from now on by d, in both
// directions (bytes already queued keep their delay).
func (p *Link) SetLatency(d time.Duration) error {
	if d < 0 || d > MaxLatency {
		return fmt.Errorf("%w: %v is not within [0, %v]", ErrBadLatency, d, MaxLatency)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.latency = d
	p.log.Info("link latency set", slog.Duration("latency", d))
	return nil
}

// Cut closes every live connection and refuses new ones until Heal.
func (p *Link) Cut() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.cut = true
	live := make([]*relayConn, 0, len(p.conns))
	for l := range p.conns {
		live = append(live, l)
	}
	p.mu.Unlock()
	for _, l := range live {
		l.close()
	}
	p.log.Info("link cut", slog.Int("closed_connections", len(live)))
	return nil
}

// Heal accepts connections again after Cut.
func (p *Link) Heal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.cut = false
	p.log.Info("link healed")
	return nil
}

// Close stops accepting, closes every connection and the control API, and
// returns once every goroutine of the proxy has exited. It may be called
// more than once.
func (p *Link) Close() error {
	var err error
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		live := make([]*relayConn, 0, len(p.conns))
		for l := range p.conns {
			live = append(live, l)
		}
		p.mu.Unlock()
		close(p.closing)
		p.stop()
		err = p.ln.Close()
		for _, l := range live {
			l.close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if serr := p.srv.Shutdown(ctx); serr != nil {
			_ = p.srv.Close()
		}
		p.wg.Wait()
		p.log.Info("link proxy stopped", slog.String("listen", p.Addr()))
	})
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("linkproxy: close: %w", err)
	}
	return nil
}

// accept runs until the listener is closed.
func (p *Link) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("link proxy: accept", slog.String("error", err.Error()))
			select {
			case <-p.closing:
				return
			case <-time.After(50 * time.Millisecond): // a transient error (EMFILE): do not spin
			}
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.refused++
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.accepted++
		l := &relayConn{client: c, gone: make(chan struct{})}
		p.conns[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			p.serve(l)
		}()
	}
}

// link is one proxied connection.
type relayConn struct {
	client net.Conn
	mu     sync.Mutex
	server net.Conn // nil until dialled
	done   bool
	gone   chan struct{} // closed by close
}

// close closes both sides; the connection's goroutines then end.
func (l *relayConn) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		close(l.gone)
	}
	l.done = true
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// serve dials the target and forwards both directions until either side
// ends or the link is cut.
func (p *Link) serve(l *relayConn) {
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout) // Close ends a dial in progress
	defer cancel()
	var d net.Dialer
	srv, err := d.DialContext(ctx, "tcp", p.cfg.Target)
	if err != nil {
		p.log.Debug("link proxy: dial target", slog.String("error", err.Error()))
		return
	}
	l.mu.Lock()
	l.server = srv
	done := l.done
	l.mu.Unlock()
	if done {
		_ = srv.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(l, srv, l.client) })
	wg.Go(func() { p.pipe(l, l.client, srv) })
	wg.Wait()
}

// chunk is bytes read at a time, due at due.
type relayChunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk held until the latency set when it
// was read has passed. When either side fails it closes the link, so that
// the other direction ends too.
func (p *Link) pipe(l *relayConn, dst, src net.Conn) {
	q := make(chan relayChunk, MaxQueued)
	var wg sync.WaitGroup
	wg.Go(func() { // the writer
		defer l.close()
		timer := time.NewTimer(0)
		defer timer.Stop()
		for c := range q {
			if wait := time.Until(c.due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-l.gone:
					return
				}
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
		// src ended: pass the end on, as TCP would.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	})
	defer wg.Wait()
	defer close(q)
	for {
		buf := make([]byte, ChunkSize)
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat := p.latency
			p.mu.Unlock()
			select {
			case q <- relayChunk{b: buf[:n], due: time.Now().Add(lat)}:
			case <-l.gone:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				l.close()
			}
			return
		}
	}
}

// Handler is the control API.
func (p *Link) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { p.reply(w, http.StatusOK, p.State()) })
	mux.HandleFunc("POST /latency", func(w http.ResponseWriter, r *http.Request) {
		ms, err := parseMS(r)
		if err != nil {
			p.fail(w, http.StatusBadRequest, err)
			return
		}
		if err := p.SetLatency(time.Duration(ms) * time.Millisecond); err != nil {
			p.fail(w, http.StatusBadRequest, err)
			return
		}
		p.reply(w, http.StatusOK, p.State())
	})
	mux.HandleFunc("POST /cut", func(w http.ResponseWriter, _ *http.Request) { p.change(w, p.Cut) })
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, _ *http.Request) { p.change(w, p.Heal) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.fail(w, http.StatusNotFound, fmt.Errorf("no %s %s: the link's API is GET /, POST /latency?ms=N, POST /cut and POST /heal", r.Method, r.URL.Path))
	})
	return mux
}

// parseMS reads the latency request's ms parameter.
func parseMS(r *http.Request) (int64, error) {
	q := r.URL.Query()
	vs, ok := q["ms"]
	if !ok || len(vs) != 1 {
		return 0, errors.New("give the latency once, in whole milliseconds: POST /latency?ms=100 (0 removes it)")
	}
	ms, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ms=%q is not a whole number of milliseconds", vs[0])
	}
	if ms < 0 || ms > MaxLatency.Milliseconds() {
		return 0, fmt.Errorf("ms=%d is not within [0, %d]", ms, MaxLatency.Milliseconds())
	}
	return ms, nil
}

func (p *Link) change(w http.ResponseWriter, f func() error) {
	if err := f(); err != nil {
		p.fail(w, http.StatusServiceUnavailable, err)
		return
	}
	p.reply(w, http.StatusOK, p.State())
}

func (p *Link) reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (p *Link) fail(w http.ResponseWriter, code int, err error) {
	p.reply(w, code, map[string]string{"error": err.Error()})
}
