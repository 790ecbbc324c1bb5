package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

var _ redis.Error = replyErr("")

func TestNodeFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"deadline", context.DeadlineExceeded, true},
		{"wrapped deadline", fmt.Errorf("redisstore: check: %w", context.DeadlineExceeded), true},
		{"refused dial", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"broken read", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, true},
		{"pool timeout", errors.New("redis: connection pool timeout"), true},
		{"loading", replyErr("LOADING Redis is loading the dataset in memory"), true},
		{"busy script", replyErr("BUSY Redis is busy running a script"), true},
		{"replica after failover", replyErr("READONLY You can't write against a read only replica."), true},
		{"cluster down", replyErr("CLUSTERDOWN The cluster is down"), true},
		{"out of memory", replyErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{"script error", replyErr("ERR user_script:40: attempt to index a nil value"), false},
		{"wrong type", replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"noscript", replyErr("NOSCRIPT No matching script."), false},
		{"malformed reply", ErrReply, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := nodeFailure(tc.err); got != tc.want {
				t.Fatalf("nodeFailure(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
