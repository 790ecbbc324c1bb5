package h2grpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tollgate/tollgate/gateway/internal/h2grpc"
)

// BenchmarkUnaryCall measures the server's own cost of one call answered
// on the reading goroutine, one call at a time, as at moderate load: the
// client writes prepared frames and reads the answer's frames into a
// fixed buffer, so that the allocations reported are the server's. The
// handler appends a fixed message; a call must allocate nothing.
func BenchmarkUnaryCall(b *testing.B) {
	srv := h2grpc.New(h2grpc.Options{})
	reply := []byte("a fixed answer of some forty bytes, more or less")
	srv.Handle(echo, func(_ context.Context, req, resp []byte) ([]byte, error) {
		return append(resp, reply...), nil
	})
	addr, served := serve(b, srv)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-served; !errors.Is(err, h2grpc.ErrServerClosed) {
			b.Errorf("Serve: %v", err)
		}
	}()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()

	// The preface, empty SETTINGS, their ACK and the whole connection
	// window, so that the server never waits for window.
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	out.WriteString(http2.ClientPreface)
	_ = fr.WriteSettings()
	_ = fr.WriteSettingsAck()
	_ = fr.WriteWindowUpdate(0, 1<<31-1-65535)
	if _, err := nc.Write(out.Bytes()); err != nil {
		b.Fatal(err)
	}
	// A call's frames: the header block as a grpc-go client sends it from
	// its second call on (every field indexed), after a first call that
	// fills the server's table.
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	block := func() []byte {
		hbuf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", echo},
			{":authority", "127.0.0.1"}, {"content-type", "application/grpc"}, {"user-agent", "grpc-go/bench"}, {"te", "trailers"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		return bytes.Clone(hbuf.Bytes())
	}
	first, rest := block(), block()
	msg := message("sk_bench_0001")
	frames := func(id uint32, blk []byte) []byte {
		out.Reset()
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndHeaders: true})
		_ = fr.WriteData(id, true, msg)
		return bytes.Clone(out.Bytes())
	}
	call := frames(1, first)
	next := frames(3, rest)
	// Where the stream id sits in each of the two frames of next.
	idAt := []int{5, 9 + len(rest) + 5}

	rbuf := make([]byte, 64<<10)
	var have int
	// readAnswer reads frames until the end of stream id's answer.
	readAnswer := func(id uint32) {
		for {
			for have < 9 {
				n, err := nc.Read(rbuf[have:])
				if err != nil {
					b.Fatal(err)
				}
				have += n
			}
			l := int(rbuf[0])<<16 | int(rbuf[1])<<8 | int(rbuf[2])
			for have < 9+l {
				n, err := nc.Read(rbuf[have:])
				if err != nil {
					b.Fatal(err)
				}
				have += n
			}
			typ, flags := http2.FrameType(rbuf[3]), http2.Flags(rbuf[4])
			sid := binary.BigEndian.Uint32(rbuf[5:9]) & (1<<31 - 1)
			if typ == http2.FrameGoAway || typ == http2.FrameRSTStream {
				b.Fatalf("%v frame", typ)
			}
			copy(rbuf, rbuf[9+l:have])
			have -= 9 + l
			if sid == id && typ == http2.FrameHeaders && flags.Has(http2.FlagHeadersEndStream) {
				return
			}
		}
	}
	write := func(p []byte) {
		if _, err := nc.Write(p); err != nil {
			b.Fatal(err)
		}
	}
	write(call)
	readAnswer(1)

	b.ReportAllocs()
	b.ResetTimer()
	id := uint32(3)
	for b.Loop() {
		for _, at := range idAt {
			binary.BigEndian.PutUint32(next[at:], id)
		}
		write(next)
		readAnswer(id)
		id += 2
		if id > 1<<31-2 {
			b.Fatal("stream ids used up")
		}
	}
	b.StopTimer()
	if inline, async := srv.Calls(); async != 0 || inline == 0 {
		b.Fatalf("calls inline %d, async %d: want all inline", inline, async)
	}

}
