package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/natsserver"
)

// ChildCommand is the hidden subcommand of bin/loadtest that runs one
// server of the soak's fleet in a process of its own, so that it can be
// killed, paused and restarted: `loadtest chaos-child kafka|nats FLAGS`.
const ChildCommand = "chaos-child"

// childReady starts the line a child prints on stdout once it serves.
const childReady = "ready"

// RunChild runs the server args name (kafka: the compose Kafka-protocol
// broker; nats: the compose NATS server with JetStream) until ctx is done,
// then stops it cleanly. It prints "ready ADDR" on stdout once it serves
// and logs to stderr. It returns the exit status: 0 after a clean stop,
// 1 when the server failed, 2 for bad arguments.
func RunChild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "chaos-child: kafka or nats?")
		return 2
	}
	kind := args[0]
	fs := flag.NewFlagSet(ChildCommand+" "+kind, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	advertise := fs.String("advertise", "", "kafka: the address the broker names in its metadata")
	dir := fs.String("dir", "", "data directory, kept across restarts")
	partitions := fs.Int("partitions", kafkabroker.DefaultPartitions, "kafka: partitions of created topics")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "chaos-child: -dir is required")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var (
		addr string
		stop func() error
	)
	switch kind {
	case "kafka":
		b, err := kafkabroker.Start(ctx, kafkabroker.WithListen(*listen), kafkabroker.WithDataDir(*dir),
			kafkabroker.WithPartitions(*partitions), kafkabroker.WithAdvertisedAddr(*advertise), kafkabroker.WithLogger(log))
		if err != nil {
			fmt.Fprintf(stderr, "chaos-child: %v\n", err)
			return 1
		}
		addr, stop = b.Addr(), b.Stop
	case "nats":
		s, err := natsserver.Start(ctx, natsserver.WithListen(*listen), natsserver.WithStoreDir(*dir), natsserver.WithLogger(log))
		if err != nil {
			fmt.Fprintf(stderr, "chaos-child: %v\n", err)
			return 1
		}
		addr, stop = s.Addr(), s.Stop
	default:
		fmt.Fprintf(stderr, "chaos-child: unknown server %q (kafka or nats)\n", kind)
		return 2
	}
	fmt.Fprintf(stdout, "%s %s\n", childReady, addr)
	<-ctx.Done()
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "chaos-child: stop: %v\n", err)
		return 1
	}
	return 0
}
