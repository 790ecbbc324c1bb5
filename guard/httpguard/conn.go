package httpguard

import (
	"context"
	"sync/atomic"
)

// DefaultCloseAfter is the number of connection-closing rejections (see
// [TrackConn]) a tracked connection gets before the middleware answers
// Connection: close.
const DefaultCloseAfter = 3

// connKey is the context key of a connection's state.
type connKey struct{}

// connState is what the middleware counts per client connection.
type connState struct {
	rejections atomic.Int64
	closeAfter int64
}

// TrackConn returns ctx carrying the state of one client connection, for
// http.Server.ConnContext:
//
//	srv.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
//		return httpguard.TrackConn(ctx, httpguard.DefaultCloseAfter)
//	}
//
// The middleware answers Connection: close to a rejection that asks for
// it — a key at the top of the penalty ladder (guard.Decision's
// CloseConnection) or on the blocklist — only where the client is
// connected directly (Identity.Direct), and on a tracked connection only
// at the closeAfter-th such rejection (values below 1 mean 1): a client
// that stops after being told keeps its connection, one that keeps sending
// pays a new handshake. On an untracked connection the first such
// rejection closes it. Over HTTP/2 the count is per connection, all
// streams together, and net/http turns the header into a GOAWAY.
//
// A server may give a connection from an address it distrusts a lower
// closeAfter (the gateway gives 1 to addresses it throttles at accept).
// TrackConn costs one small allocation per connection.
func TrackConn(ctx context.Context, closeAfter int) context.Context {
	st := &connState{closeAfter: max(int64(closeAfter), 1)}
	return context.WithValue(ctx, connKey{}, st)
}

// closeNow counts one connection-closing rejection on the connection of
// ctx and reports whether this one closes it.
func closeNow(ctx context.Context) bool {
	st, ok := ctx.Value(connKey{}).(*connState)
	if !ok {
		return true
	}
	return st.rejections.Add(1) >= st.closeAfter
}
