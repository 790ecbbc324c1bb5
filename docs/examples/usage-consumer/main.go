// Command usage-consumer is the smallest complete analytics consumer of
// Tollgate's usage topic: it reads UsageRollup records from
// tollgate.usage.v1 with franz-go, as a read_committed reader, and prints one
// tab-separated line per row. It needs nothing of Tollgate but the
// schemas/tollgatev1 package.
//
//	go run ./docs/examples/usage-consumer -brokers localhost:9092
//	go run ./docs/examples/usage-consumer -brokers localhost:9092 -group billing
//
// Without -group it reads every partition from the start and commits
// nothing; with -group it resumes from the group's committed offsets and
// commits as it goes. Ctrl-C stops it.
//
// A window is published again, with a higher revision, when late events
// change it, and a record may be delivered twice. A real consumer upserts by
// (tenant, key_id, endpoint, granularity, window_start_unix) keeping the
// highest revision; this one does the same in memory and prints a row only
// when it is new or newer.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "comma-separated Kafka seed brokers")
	topic := flag.String("topic", tollgatev1.TopicUsage, "the usage topic")
	group := flag.String("group", "", "consumer group (empty: read from the start, commit nothing)")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, log, strings.Split(*brokers, ","), *topic, *group); err != nil {
		log.Error("usage-consumer", "err", err)
		os.Exit(1)
	}
}

// rowID is what a usage row is upserted by.
type rowID struct {
	tenant, keyID, endpoint string
	granularity             tollgatev1.Granularity
	windowStart             int64
}

func run(ctx context.Context, log *slog.Logger, brokers []string, topic, group string) error {
	opts := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		// The aggregator publishes in transactions: never read aborted ones.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	if group != "" {
		opts = append(opts, kgo.ConsumerGroup(group))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close() // leaves the group, committing what was polled

	fmt.Println("window_start\tgranularity\ttenant\tkey_id\tkey_prefix\tendpoint\tallowed\trejected\tcost\trevision")
	latest := map[rowID]uint32{} // highest revision seen per row
	for {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				log.Warn("fetch", "topic", t, "partition", p, "err", err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			var row tollgatev1.UsageRollup
			if err := proto.Unmarshal(r.Value, &row); err != nil {
				log.Warn("undecodable record", "partition", r.Partition, "offset", r.Offset, "err", err)
				return
			}
			id := rowID{row.GetTenant(), row.GetKeyId(), row.GetEndpoint(), row.GetGranularity(), row.GetWindowStartUnix()}
			if row.GetRevision() <= latest[id] {
				return // a duplicate or an older revision
			}
			latest[id] = row.GetRevision()
			fmt.Printf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n",
				time.Unix(row.GetWindowStartUnix(), 0).UTC().Format(time.RFC3339),
				strings.ToLower(strings.TrimPrefix(row.GetGranularity().String(), "GRANULARITY_")),
				row.GetTenant(), row.GetKeyId(), row.GetKeyPrefix(), row.GetEndpoint(),
				row.GetAllowed(), row.GetRejected(), row.GetCost(), row.GetRevision())
		})
	}
}
