package h2grpc_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/gateway/internal/h2grpc"
)

// seedFrames is a client's frames after the preface, written by fr.
func seedFrames(write func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer)) []byte {
	var b, hbuf bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	enc := hpack.NewEncoder(&hbuf)
	_ = fr.WriteSettings()
	write(fr, enc, &hbuf)
	return b.Bytes()
}

func headers(enc *hpack.Encoder, hbuf *bytes.Buffer, fields ...string) []byte {
	hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), hbuf.Bytes()...)
}

// FuzzConn: whatever a client sends after the preface, the server never
// panics, answers within its limits and ends the connection when the
// client goes.
func FuzzConn(f *testing.F) {
	call := func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer) {
		b := headers(enc, hbuf, ":method", "POST", ":scheme", "http", ":path", echo, "content-type", "application/grpc", "grpc-timeout", "1S")
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:2]})
		_ = fr.WriteContinuation(1, true, b[2:])
		m, _ := proto.Marshal(wrapperspb.String("wait:x"))
		_ = fr.WriteData(1, false, append([]byte{0, 0, 0, 0, byte(len(m))}, m[:1]...))
		_ = fr.WriteData(1, true, m[1:])
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteWindowUpdate(0, 100)
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	}
	f.Add(seedFrames(call))
	f.Add(seedFrames(func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer) {
		b := headers(enc, hbuf, ":method", "POST", ":path", "/nope", "content-type", "application/grpc+proto")
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: b, EndHeaders: true, EndStream: true})
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
		_ = fr.WriteData(3, true, []byte{0, 0, 0, 0, 0})
	}))
	f.Add([]byte{0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte("garbage that is not a frame at all"))
	f.Fuzz(func(t *testing.T, data []byte) {
		srv := h2grpc.New(h2grpc.Options{MaxStreams: 4, MaxMessage: 1 << 10, MaxHeaderList: 1 << 10})
		srv.Handle(echo, func(ctx context.Context, req, resp []byte) ([]byte, error) {
			if h2grpc.Local(ctx) && len(req) > 0 && req[len(req)-1]%2 == 0 {
				return resp, h2grpc.ErrWouldBlock
			}
			return append(resp, req...), nil
		})
		client, server := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			srv.ServeConn(server)
		}()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			_, _ = io.Copy(io.Discard, client)
		}()
		_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(client, http2.ClientPreface)
		_, _ = client.Write(data)
		_ = client.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection outlived its client")
		}
		<-drained
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
}
