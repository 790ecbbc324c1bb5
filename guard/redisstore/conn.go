package redisstore

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore/internal/scriptargs"
	"github.com/tollgate/tollgate/internal/rawconn"
)

// The lean call path (standalone and Sentinel; Cluster keeps go-redis):
// each batching goroutine owns one connection to the node and sends the
// calls queued since its last batch as one pipeline, with one deadline for
// the batch (the latest of its calls'), set once on the socket; each caller
// stops waiting at its own deadline (a timer reused with the call). A call
// arrives pre-serialised by its caller (EVALSHA and its arguments, written
// into the call's reused buffer), and its reply is parsed straight into
// the call's CounterResults. No allocation per call, no health-check read
// per connection checkout, no []any.
//
// A connection whose batch failed half-way (a timeout, a broken or
// refused connection, bytes that are not RESP) is closed: whether Redis ran
// the calls it was sent is unknown, so none of them is sent again (it
// would charge twice), and the next batch dials afresh. Only NOSCRIPT is retried, on the
// same connection within the same deadline, as EVAL with the script's
// source: Redis refused the call without running it.

// wire says how the lean path reaches its node, taken from the options of
// a go-redis *redis.Client: its dialer (which for a Sentinel-managed
// failover client asks the sentinels for the current primary on every
// dial), credentials and database.
type wire struct {
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	network, addr string
	user, pass    string
	db            int
	// maxAge: how long a connection is used before the next batch dials
	// again (0: for ever). A Sentinel failover client's connections are
	// renewed every failoverRecheck: its dialer asks the sentinels for the
	// primary, and after a failover the old primary may stay a writable
	// primary for seconds (until the sentinels reconfigure it, or for as
	// long as a partition lasts), taking writes its resync then discards.
	// go-redis's own pool closes them on +switch-master, which this path
	// does not see.
	maxAge time.Duration
}

// failoverRecheck is how often a Sentinel client's lean connections are
// dialled again (wire.maxAge).
const failoverRecheck = time.Second

// leanWire returns the wire of client when the lean path can serve it: a
// *redis.Client (standalone or Sentinel failover) with a dialer and
// static credentials. Cluster clients, credential providers and
// connection hooks keep the go-redis path.
func leanWire(client redis.UniversalClient) (*wire, bool) {
	c, ok := client.(*redis.Client)
	if !ok {
		return nil, false
	}
	o := c.Options()
	if o.Dialer == nil || o.OnConnect != nil || o.CredentialsProvider != nil ||
		o.CredentialsProviderContext != nil || o.StreamingCredentialsProvider != nil || o.Limiter != nil {
		return nil, false
	}
	network := cmp.Or(o.Network, "tcp")
	w := &wire{dial: o.Dialer, network: network, addr: o.Addr, user: o.Username, pass: o.Password, db: o.DB}
	if o.Addr == "FailoverClient" { // go-redis's NewFailoverClient
		w.maxAge = failoverRecheck
	}
	return w, true
}

// conn is one connection, owned by one batching goroutine.
type conn struct {
	nc   net.Conn
	rd   replyReader
	w    []byte    // the batch being written, reused
	gen  uint64    // Store.gen when it was dialled
	used time.Time // when its last batch was sent
	born time.Time // when it was dialled
}

// idleCheck is how long a connection may sit unused (Store.idle) before
// its next batch first checks, with one non-blocking read, that Redis has not closed it
// (a restart while the store was idle). A busy connection is not checked:
// when one connection fails, Store.gen retires every older one.
const idleCheck = time.Second

// connect dials the node and authenticates, all before deadline.
func (w *wire) connect(deadline time.Time) (*conn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	nc, err := w.dial(ctx, w.network, w.addr)
	if err != nil {
		return nil, &dialError{err}
	}
	// Raw reads and writes (TCP only): a batch through the runtime's usual
	// system-call entry woke its monitor thread on an otherwise idle
	// gateway, and that cost more CPU than the batch itself.
	nc = rawconn.Wrap(nc)
	cn := &conn{nc: nc, rd: replyReader{r: bufio.NewReaderSize(nc, 16<<10)}, w: make([]byte, 0, 16<<10), born: time.Now()}
	if w.pass == "" && w.db == 0 {
		return cn, nil
	}
	// AUTH and SELECT, pipelined.
	var b []byte
	n := 0
	if w.pass != "" {
		if w.user != "" {
			b = appendHeader(b, 3)
			b = scriptargs.AppendBulk(b, "AUTH")
			b = scriptargs.AppendBulk(b, w.user)
		} else {
			b = appendHeader(b, 2)
			b = scriptargs.AppendBulk(b, "AUTH")
		}
		b = scriptargs.AppendBulk(b, w.pass)
		n++
	}
	if w.db != 0 {
		b = appendHeader(b, 2)
		b = scriptargs.AppendBulk(b, "SELECT")
		b = scriptargs.AppendBulk(b, strconv.Itoa(w.db))
		n++
	}
	_ = nc.SetDeadline(deadline)
	err = func() error {
		if _, err := nc.Write(b); err != nil {
			return err
		}
		var first error
		for range n {
			v, err := cn.rd.elem()
			if err != nil {
				return err
			}
			if v.kind == '-' && first == nil {
				first = replyError(v.s)
			}
		}
		return first
	}()
	if err != nil {
		nc.Close()
		return nil, unsent{fmt.Errorf("redisstore: connection setup: %w", err)}
	}
	return cn, nil
}

func (cn *conn) close() { _ = cn.nc.Close() }

// dialError is a failed dial: the calls it was for were never sent.
type dialError struct{ err error }

func (e *dialError) Error() string   { return "redisstore: dial: " + e.err.Error() }
func (e *dialError) Unwrap() []error { return []error{e.err, guard.ErrNotSent} }

// unsent marks an error after which the call surely never reached Redis
// (guard.ErrNotSent).
type unsent struct{ err error }

func (e unsent) Error() string   { return e.err.Error() }
func (e unsent) Unwrap() []error { return []error{e.err, guard.ErrNotSent} }

// errQueued is a call's error when its deadline passed before it left the
// queue: it was never sent.
var errQueued error = unsent{fmt.Errorf("redisstore: call deadline passed before it was sent: %w", context.DeadlineExceeded)}

// errNoReply is a call's error when the batch's deadline passed after it
// was sent and before its reply arrived: Redis may have run it, and it is
// never sent again.
var errNoReply = fmt.Errorf("redisstore: no reply within the call deadline: %w", context.DeadlineExceeded)

// ioError wraps an error reading or writing a connection, naming a
// timeout as errNoReply.
func ioError(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errNoReply
	}
	return fmt.Errorf("redisstore: connection: %w", err)
}

// pcall is one call on the lean path: built by its caller, sent and
// answered by a batching goroutine. The caller owns it until it is queued
// and again once done is signalled; a caller that stops waiting (its
// context done) leaves it to the goroutine and the garbage collector.
type pcall struct {
	ctx      context.Context
	deadline time.Time
	cmd      []byte  // EVALSHA, RESP-encoded
	script   *Script // the script cmd calls
	tail     int     // where cmd's numkeys begins (appendEval)
	out      []guard.CounterResult
	now      int64
	admitted bool
	err      error
	done     chan struct{}
	timer    *time.Timer // doPipe's, for the caller's own deadline; reused
	// state settles a race between a caller giving up and its batching
	// goroutine sending the call: whichever moves it from callQueued
	// first decides whether the call is sent.
	state atomic.Int32
}

// pcall states.
const (
	callQueued    = iota // in the queue or a batch, not yet sent
	callTaken            // taken for sending by a batching goroutine
	callAbandoned        // its caller gave up first: never sent
)

// finish answers the call's caller.
func (c *pcall) finish(err error) {
	c.err = err
	c.done <- struct{}{}
}

// pipeWorker is one batching goroutine of the lean path, owning one
// connection: it takes a call, adds whatever else is queued (up to the
// batch size), and sends them as one pipeline.
func (s *Store) pipeWorker() {
	defer s.wg.Done()
	var cn *conn
	defer func() {
		if cn != nil {
			cn.close()
		}
	}()
	serveBatches(s.quit, s.pq, s.batch, func(batch []*pcall) { cn = s.sendPipe(cn, batch) }, failClosed)
}

// failClosed answers a call queued at Close.
func failClosed(c *pcall) { c.finish(ErrClosed) }

// sendPipe sends batch on cn (dialled first when nil) and answers every
// call; it returns the connection for the next batch, nil when cn had to
// be closed.
func (s *Store) sendPipe(cn *conn, batch []*pcall) *conn {
	// Calls whose deadline passed while queued, or whose caller gave up,
	// are answered without being sent: never send work nobody waits for.
	now := time.Now()
	live := batch[:0]
	var deadline time.Time
	for _, c := range batch {
		switch {
		case !c.deadline.After(now):
			c.finish(errQueued)
		case c.ctx.Err() != nil:
			c.finish(unsent{c.ctx.Err()})
		case !c.state.CompareAndSwap(callQueued, callTaken):
			// Its caller gave up first (callAbandoned) and was told the
			// call was never sent: keep that true.
			c.finish(errQueued)
		default:
			// The batch waits for the latest of its calls' deadlines: a
			// call's deadline is its own (its caller stops waiting at it,
			// doPipe), never one of a batch-mate's older or shorter ones.
			if len(live) == 0 || c.deadline.After(deadline) {
				deadline = c.deadline
			}
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return cn
	}
	if cn != nil && (cn.gen != s.gen.Load() || s.wire.maxAge > 0 && now.Sub(cn.born) >= s.wire.maxAge ||
		now.Sub(cn.used) >= s.idle && !alive(cn.nc)) {
		cn.close()
		cn = nil
	}
	// Counted as sent once let through the breaker, as go-redis's path
	// counts them, even when the dial fails.
	s.calls.Add(int64(len(live)))
	if cn == nil {
		gen := s.gen.Load()
		var err error
		if cn, err = s.wire.connect(deadline); err != nil {
			s.gen.Add(1)
			for _, c := range live {
				c.finish(err)
			}
			return nil
		}
		cn.gen = gen
	}
	cn.used = now
	_ = cn.nc.SetDeadline(deadline)
	cn.w = cn.w[:0]
	for _, c := range live {
		cn.w = append(cn.w, c.cmd...)
	}
	retry, reconnect, ok := s.exchange(cn, live)
	if ok && len(retry) > 0 {
		// NOSCRIPT: the script is not loaded (a restarted or flushed
		// Redis); the calls did not run. EVAL loads it.
		cn.w = cn.w[:0]
		for _, c := range retry {
			cn.w = appendEval(cn.w, c.script.Source, c.cmd, c.tail)
		}
		var again bool
		retry, again, ok = s.exchange(cn, retry)
		reconnect = reconnect || again
		for _, c := range retry {
			c.finish(c.err)
		}
	}
	if !ok || reconnect {
		// Every connection dialled before this one failed is suspect:
		// Redis restarted, hangs, or is no longer the primary.
		s.gen.Add(1)
		cn.close()
		return nil
	}
	return cn
}

// exchange writes cn.w, the commands of calls, and reads their replies.
// It answers every call except those refused with NOSCRIPT, which it
// returns (with their error set). reconnect: a reply said this connection
// reaches no primary (a replica after a failover, a primary that lost its
// replicas' quorum): the next batch should dial again, which on Sentinel
// asks the sentinels. !ok: the connection failed and every call not yet
// answered was failed.
func (s *Store) exchange(cn *conn, calls []*pcall) (retry []*pcall, reconnect, ok bool) {
	if _, err := cn.nc.Write(cn.w); err != nil {
		err = ioError(err)
		for _, c := range calls {
			c.finish(err)
		}
		return nil, false, false
	}
	for i, c := range calls {
		t, adm, callErr, err := cn.rd.scriptReply(c.out)
		if err != nil {
			err = ioError(err)
			for _, c := range retry {
				c.finish(err)
			}
			for _, c := range calls[i:] {
				c.finish(err)
			}
			return nil, false, false
		}
		if callErr != nil {
			if hasPrefix(callErr, "NOSCRIPT") {
				c.err = callErr
				retry = append(retry, c)
				continue
			}
			if hasPrefix(callErr, "READONLY") || hasPrefix(callErr, "MASTERDOWN") {
				reconnect = true
			}
			c.finish(callErr)
			continue
		}
		c.now, c.admitted = t, adm
		c.finish(nil)
	}
	return retry, reconnect, true
}
