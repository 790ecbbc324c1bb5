package linkproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate/tollgate/compose/internal/loopback"
)

// ErrBadLatency is a latency outside [0, MaxLatency]; match it with
// errors.Is.
var ErrBadLatency = errors.New("linkproxy: latency out of range")

const (
	// MaxLatency is the largest latency a Link accepts.
	MaxLatency = time.Minute
	// linkDialTimeout bounds a Link's connection to its target.
	linkDialTimeout = 5 * time.Second
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
	Stalled     bool   `json:"stalled"`
	Connections int    `json:"connections"` // live now
	Accepted    int64  `json:"accepted"`    // since the start
	Refused     int64  `json:"refused"`     // while cut
}

// Link is a Proxy every client of which shares one fault, changed through
// an HTTP control API: the local stack's link between two regions. Its
// methods are safe for concurrent use.
type Link struct {
	cfg   Config
	log   *slog.Logger
	proxy *Proxy
	ctl   net.Listener
	srv   *http.Server
	wg    sync.WaitGroup // the control server
	once  sync.Once

	mu      sync.Mutex
	latency time.Duration // guarded by mu
	cut     bool          // guarded by mu
	stalled bool          // guarded by mu
	closed  bool          // guarded by mu
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
	log = log.With(slog.String("link", cfg.Name))
	var lc net.ListenConfig
	ctl, err := lc.Listen(ctx, "tcp", cfg.ControlListen)
	if err != nil {
		return nil, fmt.Errorf("linkproxy: start: control: %w", err)
	}
	p, err := Listen(cfg.Listen, WithLogger(log), WithDialTimeout(linkDialTimeout))
	if err != nil {
		_ = ctl.Close()
		return nil, fmt.Errorf("linkproxy: start: %w", err)
	}
	p.SetTarget(cfg.Target)
	l := &Link{cfg: cfg, log: log, proxy: p, ctl: ctl}
	l.srv = &http.Server{
		Handler:           l.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	l.wg.Go(func() { _ = l.srv.Serve(ctl) })
	log.Info("link proxy started", slog.String("listen", l.Addr()), slog.String("target", cfg.Target),
		slog.String("control", l.ControlAddr()))
	return l, nil
}

// Addr is the address the link accepts connections on.
func (l *Link) Addr() string { return l.proxy.Addr() }

// ControlAddr is the control API's address.
func (l *Link) ControlAddr() string { return l.ctl.Addr().String() }

// State returns the link's state.
func (l *Link) State() State {
	l.mu.Lock()
	lat, cut, stalled := l.latency, l.cut, l.stalled
	l.mu.Unlock()
	live := 0
	for _, n := range l.proxy.Conns() {
		live += n
	}
	t := l.proxy.Totals()
	return State{Name: l.cfg.Name, Listen: l.Addr(), Target: l.cfg.Target, LatencyMS: lat.Milliseconds(),
		Cut: cut, Stalled: stalled, Connections: live, Accepted: t.Accepted, Refused: t.Refused}
}

// SetLatency delays every byte forwarded from now on by d, in both
// directions (bytes already queued keep their delay). A cut link keeps
// the latency for when it heals.
func (l *Link) SetLatency(d time.Duration) error {
	if d < 0 || d > MaxLatency {
		return fmt.Errorf("%w: %v is not within [0, %v]", ErrBadLatency, d, MaxLatency)
	}
	if err := l.change(func() { l.latency = d }); err != nil {
		return err
	}
	l.log.Info("link latency set", slog.Duration("latency", d))
	return nil
}

// Cut resets every live connection and refuses new ones until Heal.
func (l *Link) Cut() error {
	live := l.State().Connections
	if err := l.change(func() { l.cut = true }); err != nil {
		return err
	}
	l.log.Info("link cut", slog.Int("closed_connections", live))
	return nil
}

// Stall forwards nothing either way and holds new connections without
// dialling the target, until Heal delivers what was held: a partition
// that ends in deadlines, not in errors. A cut link stays cut.
func (l *Link) Stall() error {
	if err := l.change(func() { l.stalled = true }); err != nil {
		return err
	}
	l.log.Info("link stalled")
	return nil
}

// Heal undoes Cut and Stall: connections are accepted again, and what a
// stall held is delivered.
func (l *Link) Heal() error {
	if err := l.change(func() { l.cut, l.stalled = false, false }); err != nil {
		return err
	}
	l.log.Info("link healed")
	return nil
}

// change applies f to the link's state and puts the resulting fault on
// every client.
func (l *Link) change(f func()) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	f()
	fault := Fault{}
	switch {
	case l.cut:
		fault = Fault{Mode: Cut}
	case l.stalled:
		fault = Fault{Mode: Stall}
	case l.latency > 0:
		fault = Fault{Mode: Latency, Delay: l.latency}
	}
	l.proxy.Set(AnyClient, fault)
	return nil
}

// Close stops accepting, resets every connection, stops the control API
// and returns once every goroutine of the link has exited. It may be
// called more than once.
func (l *Link) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		err = l.proxy.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if serr := l.srv.Shutdown(ctx); serr != nil {
			_ = l.srv.Close()
		}
		l.wg.Wait()
		l.log.Info("link proxy stopped", slog.String("listen", l.Addr()))
	})
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("linkproxy: close: %w", err)
	}
	return nil
}

// Handler is the control API.
func (l *Link) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { reply(w, http.StatusOK, l.State()) })
	mux.HandleFunc("POST /latency", func(w http.ResponseWriter, r *http.Request) {
		ms, err := parseMS(r)
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		if err := l.SetLatency(time.Duration(ms) * time.Millisecond); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		reply(w, http.StatusOK, l.State())
	})
	mux.HandleFunc("POST /cut", func(w http.ResponseWriter, _ *http.Request) { l.answer(w, l.Cut) })
	mux.HandleFunc("POST /stall", func(w http.ResponseWriter, _ *http.Request) { l.answer(w, l.Stall) })
	mux.HandleFunc("POST /heal", func(w http.ResponseWriter, _ *http.Request) { l.answer(w, l.Heal) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, fmt.Errorf("no %s %s: the link's API is GET /, POST /latency?ms=N, POST /cut, POST /stall and POST /heal", r.Method, r.URL.Path))
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

func (l *Link) answer(w http.ResponseWriter, f func() error) {
	if err := f(); err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	reply(w, http.StatusOK, l.State())
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, err error) {
	reply(w, code, map[string]string{"error": err.Error()})
}
