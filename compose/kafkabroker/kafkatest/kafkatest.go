// Package kafkatest starts in-process Kafka brokers for tests through
// package kafkabroker and stops them with tb.Cleanup. It is the only part
// that imports "testing", so binaries that use kafkabroker (make run) do not
// link it.
package kafkatest

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/compose/kafkabroker"
)

// StartTB starts a broker (see kafkabroker.Start) for the test and
// registers its Stop with tb.Cleanup. The start is bounded by tb.Context.
// Any error fails the test at once.
func StartTB(tb testing.TB, opts ...kafkabroker.Option) *kafkabroker.Broker {
	tb.Helper()
	return lifecycle.StartTB(tb, "kafka broker", func(ctx context.Context) (*kafkabroker.Broker, error) {
		return kafkabroker.Start(ctx, opts...)
	})
}
