package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/redisstore"
)

// Redis backends, as Stack.RedisBackend reports them.
const (
	BackendRedisServer = "redis-server"
	BackendEmbedded    = "embedded"
)

// redisBackend is the Redis the stack runs: a redis-server process or an
// embedded miniredis.
type redisBackend struct {
	kind string
	addr string
	srv  *redisserver.Server
	mini *miniredis.Miniredis
}

// config is how the stack's gateway and aggregator reach this Redis:
// with the deadline set (client), else the backend's.
func (r *redisBackend) config(client RedisClient) configs.Redis {
	c := configs.Redis{Mode: redisstore.ModeStandalone, Addrs: []string{r.addr}, Timeout: client.Timeout}
	if c.Timeout == 0 && r.kind == BackendEmbedded {
		c.Timeout = embeddedRedisTimeout
	}
	c.SetDefaults()
	return c
}

// startRedis starts the Redis that mode asks for (Config.Redis).
func startRedis(ctx context.Context, mode string, log *slog.Logger) (*redisBackend, error) {
	if mode != RedisEmbedded {
		bin, err := redisserver.LookPath()
		switch {
		case err == nil:
			srv, err := redisserver.Start(ctx, redisserver.WithBinary(bin), redisserver.WithLogger(log))
			if err != nil {
				return nil, fmt.Errorf("stack: start %s: %w", bin, err)
			}
			log.Info("redis: running redis-server", slog.String("binary", bin), slog.String("addr", srv.Addr()))
			return &redisBackend{kind: BackendRedisServer, addr: srv.Addr(), srv: srv}, nil
		case mode == RedisServer || !errors.Is(err, redisserver.ErrNotFound):
			return nil, fmt.Errorf("stack: %w (or set %s=embedded)", err, envRedis)
		}
		log.Warn("redis: redis-server not found, so using the embedded stand-in: fine to try Tollgate, not to measure it. "+
			"Install redis-server ("+redisserver.InstallCommand+") or point "+redisserver.EnvServer+" at one for the real thing.",
			slog.String("error", err.Error()))
	}
	return startEmbedded(log)
}

// startEmbedded starts miniredis on a free loopback port. This is the one
// place Tollgate runs miniredis: as make run's stand-in on a machine with
// only Go. Tests use a real redis-server (compose/redisserver), except the
// stack's own test of this fallback.
//
// miniredis answers TIME from the wall clock (no SetTime here), which the
// guard's scripts read; but its TTLs only count down when the clock is
// allowed to drive them, so ClockTTL(true) is what makes counters expire.
func startEmbedded(log *slog.Logger) (*redisBackend, error) {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("stack: start embedded redis: %w", err)
	}
	log.Info("redis: running the embedded redis (miniredis)", slog.String("addr", m.Addr()))
	return &redisBackend{kind: BackendEmbedded, addr: m.Addr(), mini: m}, nil
}

// stop stops the server and waits for it to exit.
func (r *redisBackend) stop(log *slog.Logger) error {
	if r.srv != nil {
		return r.srv.Stop() // SIGTERM, then SIGKILL after 5s; logs "redis-server stopped"
	}
	r.mini.Close()
	log.Info("redis: embedded redis stopped", slog.String("addr", r.addr))
	return nil
}
