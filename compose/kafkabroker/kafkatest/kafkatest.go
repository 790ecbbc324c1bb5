// Package kafkatest starts in-process Kafka brokers for tests through
// package kafkabroker and stops them with tb.Cleanup. It is the only part
// that imports "testing", so binaries that use kafkabroker (make run) do not
// link it.
package kafkatest

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

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

// RefuseProduce is the broker's answer to req refusing every partition it
// writes with the error code (a kerr code), for a test's
// kfake ControlKey on kmsg.Produce.
func RefuseProduce(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, tp := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
		for _, p := range tp.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
