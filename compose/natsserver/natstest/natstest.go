// Package natstest starts embedded NATS servers for tests through package
// natsserver and stops them with tb.Cleanup. It is the only part that
// imports "testing", so binaries that use natsserver (make run) do not link
// it.
package natstest

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/compose/natsserver"
)

// StartTB starts a NATS server with JetStream (see natsserver.Start) for the
// test and registers its Stop with tb.Cleanup. The start is bounded by
// tb.Context. Any error fails the test at once.
func StartTB(tb testing.TB, opts ...natsserver.Option) *natsserver.Server {
	tb.Helper()
	return lifecycle.StartTB(tb, "nats server", func(ctx context.Context) (*natsserver.Server, error) {
		return natsserver.Start(ctx, opts...)
	})
}
