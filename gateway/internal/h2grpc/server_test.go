package h2grpc_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/gateway/internal/h2grpc"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

const echo = "/test.Echo/Echo"

// testServer serves echo: a request "wait:…" cannot be answered on the
// reading goroutine and, elsewhere, waits for release (or its context);
// "err:CODE:msg" answers that status; "big:N" answers N bytes; anything
// else is echoed.
type testServer struct {
	srv     *h2grpc.Server
	addr    string
	release chan struct{}
	started chan struct{} // one value per waiting call
	mu      sync.Mutex
	ctxErrs []error // contexts of waiting calls, when they ended
	served  <-chan error
}

// serve serves srv on a new loopback listener, on a goroutine, and
// returns the listener's address and a channel that receives what Serve
// returned. The caller shuts srv down and reads the channel.
func serve(tb testing.TB, srv *h2grpc.Server) (addr string, served <-chan error) {
	tb.Helper()
	ln := testnet.Listen(tb)
	ch := make(chan error, 1)
	go func() { ch <- srv.Serve(ln) }()
	return ln.Addr().String(), ch
}

func newTestServer(t *testing.T, opts h2grpc.Options) *testServer {
	t.Helper()
	ts := &testServer{release: make(chan struct{}), started: make(chan struct{}, 64)}
	ts.srv = h2grpc.New(opts)
	ts.srv.Handle(echo, ts.handle)
	ts.addr, ts.served = serve(t, ts.srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ts.srv.Shutdown(ctx)
		if err := <-ts.served; !errors.Is(err, h2grpc.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ts
}

func (ts *testServer) handle(ctx context.Context, req, resp []byte) ([]byte, error) {
	var in wrapperspb.StringValue
	if err := proto.Unmarshal(req, &in); err != nil {
		return resp, status.Error(codes.Internal, err.Error())
	}
	v := in.GetValue()
	switch {
	case strings.HasPrefix(v, "wait:"):
		if h2grpc.Local(ctx) {
			return resp, h2grpc.ErrWouldBlock
		}
		select {
		case ts.started <- struct{}{}:
		default:
		}
		select {
		case <-ts.release:
		case <-ctx.Done():
			ts.mu.Lock()
			ts.ctxErrs = append(ts.ctxErrs, ctx.Err())
			ts.mu.Unlock()
			return resp, status.FromContextError(ctx.Err()).Err()
		}
	case strings.HasPrefix(v, "err:"):
		parts := strings.SplitN(v, ":", 3)
		code, _ := strconv.Atoi(parts[1])
		return resp, status.Error(codes.Code(code), parts[2])
	case strings.HasPrefix(v, "big:"):
		n, _ := strconv.Atoi(v[4:])
		v = strings.Repeat("x", n)
	}
	return proto.MarshalOptions{}.MarshalAppend(resp, wrapperspb.String(v))
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func call(ctx context.Context, cc *grpc.ClientConn, method, v string, opts ...grpc.CallOption) (string, error) {
	var out wrapperspb.StringValue
	err := cc.Invoke(ctx, method, wrapperspb.String(v), &out, opts...)
	return out.GetValue(), err
}

// TestCalls: a grpc-go client's calls are answered, on the reading
// goroutine or on their own, with their statuses and messages.
func TestCalls(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{MaxMessage: 512 << 10})
	cc := dial(t, ts.addr)
	close(ts.release)
	for _, tc := range []struct {
		name, method, in, want string
		code                   codes.Code
		msg                    string
	}{
		{"inline", echo, "hello", "hello", codes.OK, ""},
		{"async", echo, "wait:1", "wait:1", codes.OK, ""},
		{"status", echo, "err:5:no such thing", "", codes.NotFound, "no such thing"},
		{"message percent-encoded", echo, "err:3:100% ünïcode\nline", "", codes.InvalidArgument, "100% ünïcode\nline"},
		{"unknown method", "/test.Echo/Nope", "x", "", codes.Unimplemented, "unknown method /test.Echo/Nope"},
		{"large answer beyond the client's windows", echo, "big:300000", strings.Repeat("x", 300000), codes.OK, ""},
		{"large request", echo, strings.Repeat("y", 200000), strings.Repeat("y", 200000), codes.OK, ""},
		{"request above the limit", echo, strings.Repeat("z", 600<<10), "", codes.ResourceExhausted, ""},
		{"empty", echo, "", "", codes.OK, ""},
	} {
		got, err := call(t.Context(), cc, tc.method, tc.in)
		st, _ := status.FromError(err)
		if st.Code() != tc.code || (tc.msg != "" && st.Message() != tc.msg) {
			t.Errorf("%s: status %v %q, want %v %q", tc.name, st.Code(), st.Message(), tc.code, tc.msg)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: answer of %d bytes, want %d", tc.name, len(got), len(tc.want))
		}
	}
	inline, async := ts.srv.Calls()
	if async != 1 || inline < 6 {
		t.Errorf("calls inline %d, async %d; want async 1 (the waiting call) and the others inline", inline, async)
	}
}

// TestWaitingCallsReuseGoroutines: calls that must wait, made one after
// the other, run on the goroutine kept from the first (a goroutine per
// call grew its stack anew each time), and Shutdown ends it at once
// rather than after its idle time.
func TestWaitingCallsReuseGoroutines(t *testing.T) {
	t.Parallel()
	srv := h2grpc.New(h2grpc.Options{})
	ts := &testServer{release: make(chan struct{}), started: make(chan struct{}, 64)}
	srv.Handle(echo, ts.handle)
	close(ts.release)
	addr, served := serve(t, srv)
	cc := dial(t, addr)
	const calls = 50
	for i := range calls {
		if _, err := call(t.Context(), cc, echo, "wait:"+strconv.Itoa(i)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if _, async := srv.Calls(); async != calls {
		t.Fatalf("%d calls answered elsewhere, want %d", async, calls)
	}
	// The worker may not be back waiting when the next call arrives: a
	// few more goroutines are fine, one per call is not.
	if n := srv.WorkersStarted(); n > calls/5 {
		t.Errorf("%d goroutines started for %d calls made one after the other, want them reused", n, calls)
	}
	_ = cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	srv.Shutdown(ctx)
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("Shutdown took %v: the kept goroutines waited out their idle time", took)
	}
	if err := <-served; !errors.Is(err, h2grpc.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}

// TestConcurrentCalls: many calls in flight on one connection, some
// waiting, all get their own answers.
func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	close(ts.release)
	cc := dial(t, ts.addr)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 32 {
		wg.Go(func() {
			for i := range 50 {
				v := "v" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				if i%5 == 0 {
					v = "wait:" + v
				}
				got, err := call(t.Context(), cc, echo, v)
				if err != nil || got != v {
					errs <- errors.New(v + ": got " + got + ": " + status.Convert(err).Message())
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestTimeout: grpc-timeout bounds a waiting call: the handler's context
// ends and the client gets DeadlineExceeded.
func TestTimeout(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	cc := dial(t, ts.addr)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := call(ctx, cc, echo, "wait:timeout")
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("status %v, want DeadlineExceeded", err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if len(ts.ctxErrs) == 0 {
			return errors.New("the handler's context has not ended")
		}
		if err := ts.ctxErrs[0]; !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v", err)
		}
		return nil
	})
}

// TestGracefulShutdown: Shutdown lets a call in flight finish and its
// answer reach the client; the connection then closes and Serve returns.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	cc := dial(t, ts.addr)
	if _, err := call(t.Context(), cc, echo, "warm"); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() {
		got, err := call(t.Context(), cc, echo, "wait:drain")
		if err == nil && got != "wait:drain" {
			err = errors.New("answer " + got)
		}
		res <- err
	}()
	<-ts.started
	shut := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ts.srv.Shutdown(ctx)
		close(shut)
	}()
	select {
	case <-shut:
		t.Fatal("Shutdown returned with a call in flight")
	case err := <-res:
		t.Fatalf("call ended before it was released: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(ts.release)
	if err := <-res; err != nil {
		t.Fatalf("call in flight at shutdown: %v", err)
	}
	<-shut
}

// TestShutdownDeadline: calls still running when Shutdown's context ends
// are cut; Shutdown returns.
func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	cc := dial(t, ts.addr)
	res := make(chan error, 1)
	go func() {
		_, err := call(t.Context(), cc, echo, "wait:forever")
		res <- err
	}()
	<-ts.started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	ts.srv.Shutdown(ctx)
	if err := <-res; err == nil {
		t.Fatal("a call cut by shutdown succeeded")
	}
}
