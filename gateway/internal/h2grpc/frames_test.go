package h2grpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/gateway/internal/h2grpc"
	"github.com/tollgate/tollgate/internal/testwait"
)

// rawClient is an HTTP/2 client speaking frames by hand.
type rawClient struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	// settings is the server's first SETTINGS frame.
	settings map[http2.SettingID]uint32
}

// dialRaw connects, exchanges prefaces and settings (the client's own
// are extra) and returns the client.
func dialRaw(t *testing.T, addr string, extra ...http2.Setting) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc), settings: map[http2.SettingID]uint32{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(extra...); err != nil {
		t.Fatal(err)
	}
	f := c.next()
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want SETTINGS", f)
	}
	_ = sf.ForeachSetting(func(s http2.Setting) error {
		c.settings[s.ID] = s.Val
		return nil
	})
	if err := c.fr.WriteSettingsAck(); err != nil {
		t.Fatal(err)
	}
	return c
}

// next reads the next frame, skipping WINDOW_UPDATE and SETTINGS ACK.
func (c *rawClient) next() http2.Frame {
	c.t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("read frame: %v", err)
		}
		switch f := f.(type) {
		case *http2.WindowUpdateFrame:
			continue
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
		}
		return f
	}
}

func (c *rawClient) headerBlock(fields ...string) []byte {
	c.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), c.hbuf.Bytes()...)
}

// requestHeaders is a gRPC call's header block, with extra fields.
func (c *rawClient) requestHeaders(path string, extra ...string) []byte {
	return c.headerBlock(append([]string{":method", "POST", ":scheme", "http", ":path", path,
		":authority", "test", "content-type", "application/grpc", "te", "trailers"}, extra...)...)
}

// message is v as a gRPC-framed StringValue.
func message(v string) []byte {
	b, _ := proto.Marshal(wrapperspb.String(v))
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// send opens stream id with a call of v.
func (c *rawClient) send(id uint32, v string, extra ...string) {
	c.t.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.requestHeaders(echo, extra...), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.fr.WriteData(id, true, message(v)); err != nil {
		c.t.Fatal(err)
	}
}

// answer is what came back on one stream.
type answer struct {
	headers map[string]string // headers and trailers
	data    []byte
	rst     http2.ErrCode
	ended   bool
}

// readAnswer reads frames until stream id ends (END_STREAM or
// RST_STREAM), answering nothing else.
func (c *rawClient) readAnswer(id uint32) answer {
	c.t.Helper()
	a := answer{headers: map[string]string{}}
	for !a.ended {
		switch f := c.next().(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamID != id {
				continue
			}
			for _, hf := range f.Fields {
				a.headers[hf.Name] = hf.Value
			}
			a.ended = f.StreamEnded()
		case *http2.DataFrame:
			if f.StreamID != id {
				continue
			}
			a.data = append(a.data, f.Data()...)
			a.ended = f.StreamEnded()
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				a.rst, a.ended = f.ErrCode, true
			}
		case *http2.GoAwayFrame:
			c.t.Fatalf("GOAWAY %v while waiting for stream %d: %s", f.ErrCode, id, f.DebugData())
		}
	}
	return a
}

// value decodes the answer's StringValue.
func (a answer) value(t *testing.T) string {
	t.Helper()
	if len(a.data) < 5 {
		t.Fatalf("answer data %q", a.data)
	}
	var v wrapperspb.StringValue
	if err := proto.Unmarshal(a.data[5:], &v); err != nil {
		t.Fatal(err)
	}
	return v.GetValue()
}

// goAway reads until GOAWAY and then the end of the connection.
func (c *rawClient) goAway() http2.ErrCode {
	c.t.Helper()
	var code http2.ErrCode
	seen := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if !seen {
				c.t.Fatalf("connection ended without GOAWAY: %v", err)
			}
			return code
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			code, seen = g.ErrCode, true
		}
	}
}

// TestFramesSettingsAndPing: the server announces its limits, acknowledges
// the client's SETTINGS and answers PING.
func TestFramesSettingsAndPing(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{MaxStreams: 7})
	c := dialRaw(t, ts.addr)
	if got := c.settings[http2.SettingMaxConcurrentStreams]; got != 7 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want 7", got)
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && s.IsAck() {
			break
		}
	}
	data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	if err := c.fr.WritePing(false, data); err != nil {
		t.Fatal(err)
	}
	p, ok := c.next().(*http2.PingFrame)
	if !ok || !p.IsAck() || p.Data != data {
		t.Fatalf("PING answered with %v", p)
	}
}

// TestFramesCalls: calls by hand: headers split over CONTINUATION frames,
// a message split over DATA frames, errors as trailers-only answers.
func TestFramesCalls(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{MaxHeaderList: 4096})
	c := dialRaw(t, ts.addr)

	// HEADERS + CONTINUATION + CONTINUATION, then the message in 3 frames.
	block := c.requestHeaders(echo)
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteContinuation(1, false, block[3:6]); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteContinuation(1, true, block[6:]); err != nil {
		t.Fatal(err)
	}
	msg := message("split")
	for i, part := range [][]byte{msg[:2], msg[2:7], msg[7:]} {
		if err := c.fr.WriteData(1, i == 2, part); err != nil {
			t.Fatal(err)
		}
	}
	a := c.readAnswer(1)
	if a.headers[":status"] != "200" || a.headers["grpc-status"] != "0" || a.value(t) != "split" {
		t.Fatalf("split call: %v %q", a.headers, a.data)
	}

	for _, tc := range []struct {
		name   string
		id     uint32
		extra  []string
		status string
	}{
		{"malformed grpc-timeout", 3, []string{"grpc-timeout", "soon"}, "13"},
		{"header list too large", 5, []string{"x-a", strings.Repeat("a", 1500), "x-b", strings.Repeat("b", 1500), "x-c", strings.Repeat("c", 1500)}, "8"},
		{"not gRPC", 7, []string{"content-type", "text/plain"}, "2"},
		{"compressed", 9, nil, "12"},
	} {
		extra := tc.extra
		if tc.name == "not gRPC" {
			// Replaces the request's own content-type.
			block := c.headerBlock(":method", "POST", ":scheme", "http", ":path", echo, "content-type", "text/plain")
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: tc.id, BlockFragment: block, EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			_ = c.fr.WriteData(tc.id, true, message("x"))
		} else if tc.name == "compressed" {
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: tc.id, BlockFragment: c.requestHeaders(echo, "grpc-encoding", "gzip"), EndHeaders: true}); err != nil {
				t.Fatal(err)
			}
			m := message("x")
			m[0] = 1
			_ = c.fr.WriteData(tc.id, true, m)
		} else {
			c.send(tc.id, "x", extra...)
		}
		a := c.readAnswer(tc.id)
		if a.headers["grpc-status"] != tc.status {
			t.Errorf("%s: grpc-status %q (%q), want %s", tc.name, a.headers["grpc-status"], a.headers["grpc-message"], tc.status)
		}
	}
	// The connection still serves.
	c.send(11, "after")
	if a := c.readAnswer(11); a.value(t) != "after" {
		t.Fatalf("after the errors: %q", a.data)
	}
}

// TestFramesFlowControl: an answer larger than the client's window waits
// for WINDOW_UPDATE, then completes.
func TestFramesFlowControl(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	c := dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 16})
	c.send(1, "big:100")
	var got []byte
	for len(got) < 16 {
		f := c.next()
		d, ok := f.(*http2.DataFrame)
		if !ok {
			if _, ok := f.(*http2.MetaHeadersFrame); ok {
				continue
			}
			t.Fatalf("frame %v", f)
		}
		got = append(got, d.Data()...)
	}
	if len(got) != 16 {
		t.Fatalf("%d bytes sent into a window of 16", len(got))
	}
	if err := c.fr.WriteWindowUpdate(1, 1000); err != nil {
		t.Fatal(err)
	}
	a := c.readAnswer(1)
	a.data = append(got, a.data...)
	if a.headers["grpc-status"] != "0" || a.value(t) != strings.Repeat("x", 100) {
		t.Fatalf("answer %v %d bytes", a.headers, len(a.data))
	}
}

// TestFramesStreams: calls beyond SETTINGS_MAX_CONCURRENT_STREAMS are
// refused; a call the client resets has its context cancelled.
func TestFramesStreams(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{MaxStreams: 2})
	c := dialRaw(t, ts.addr)
	c.send(1, "wait:1")
	c.send(3, "wait:3")
	<-ts.started
	<-ts.started
	c.send(5, "wait:5")
	if a := c.readAnswer(5); a.rst != http2.ErrCodeRefusedStream {
		t.Fatalf("third stream: %+v, want RST_STREAM REFUSED_STREAM", a)
	}
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if len(ts.ctxErrs) == 0 {
			return errors.New("the reset call's context is not done")
		}
		if !errors.Is(ts.ctxErrs[0], context.Canceled) {
			t.Fatalf("reset call's context: %v", ts.ctxErrs[0])
		}
		return nil
	})
	close(ts.release)
	if a := c.readAnswer(3); a.value(t) != "wait:3" {
		t.Fatalf("stream 3: %+v", a)
	}
}

// TestFramesConnectionErrors: frames HTTP/2 forbids end the connection
// with GOAWAY and their error code.
func TestFramesConnectionErrors(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	for _, tc := range []struct {
		name string
		send func(c *rawClient) error
		want http2.ErrCode
	}{
		{"HEADERS on an even stream", func(c *rawClient) error {
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: c.requestHeaders(echo), EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"DATA on an idle stream", func(c *rawClient) error { return c.fr.WriteData(9, true, message("x")) }, http2.ErrCodeProtocol},
		{"connection window overflow", func(c *rawClient) error { return c.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
		{"frame above the maximum size", func(c *rawClient) error {
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.requestHeaders(echo), EndHeaders: true}); err != nil {
				return err
			}
			return c.fr.WriteData(1, true, make([]byte, 20000))
		}, http2.ErrCodeFrameSize},
		{"broken HPACK", func(c *rawClient) error {
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
		{"CONTINUATION without HEADERS", func(c *rawClient) error { return c.fr.WriteContinuation(1, true, []byte{0x82}) }, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(c *rawClient) error {
			return c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"invalid SETTINGS value", func(c *rawClient) error {
			return c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1})
		}, http2.ErrCodeProtocol},
	} {
		c := dialRaw(t, ts.addr)
		if err := tc.send(c); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := c.goAway(); got != tc.want {
			t.Errorf("%s: GOAWAY %v, want %v", tc.name, got, tc.want)
		}
	}

	// Not HTTP/2 at all: the connection is closed.
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, nc); err != nil {
		t.Fatalf("HTTP/1.1 request: %v, want the connection closed", err)
	}
}

// TestFramesShutdown: a connection told GOAWAY by Shutdown answers the
// call it has, refuses new streams, then closes.
func TestFramesShutdown(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	c := dialRaw(t, ts.addr)
	c.send(1, "wait:1")
	<-ts.started
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ts.srv.Shutdown(ctx)
	}()
	g, ok := c.next().(*http2.GoAwayFrame)
	if !ok || g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
		t.Fatalf("got %v, want GOAWAY NO_ERROR last stream 1", g)
	}
	c.send(3, "late")
	if a := c.readAnswer(3); a.rst != http2.ErrCodeRefusedStream {
		t.Fatalf("stream after GOAWAY: %+v", a)
	}
	close(ts.release)
	if a := c.readAnswer(1); a.value(t) != "wait:1" {
		t.Fatalf("call in flight: %+v", a)
	}
	if _, err := c.fr.ReadFrame(); err == nil {
		t.Fatal("connection open after its last call")
	}
	<-shut
}

// TestFramesShutdownClientNotReading: a client that stops reading while
// answers are being written does not hold up Shutdown past its context.
func TestFramesShutdownClientNotReading(t *testing.T) {
	t.Parallel()
	srv := h2grpc.New(h2grpc.Options{})
	big := bytes.Repeat([]byte{'x'}, 4<<20)
	srv.Handle(echo, func(_ context.Context, _, resp []byte) ([]byte, error) {
		return append(resp, big...), nil
	})
	addr, served := serve(t, srv)
	c := dialRaw(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
	if err := c.fr.WriteWindowUpdate(0, 1<<31-1-65535); err != nil {
		t.Fatal(err)
	}
	for id := uint32(1); id < 16; id += 2 {
		c.send(id, "x")
	}
	// Once the answers are being written, the client reads nothing more:
	// the server's writes fill the socket.
	for {
		if _, ok := c.next().(*http2.DataFrame); ok {
			break
		}
	}
	// Its GOAWAY cannot be written either; the context's end cuts it.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Shutdown(ctx)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waiting 20 s after its context ended")
	}
	if err := <-served; !errors.Is(err, h2grpc.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}

// TestFramesHeaderTableSize: successful answers' header blocks do not use
// the HPACK table (the same bytes on every call), except the first block
// after the client changes SETTINGS_HEADER_TABLE_SIZE, which starts with
// the dynamic table size update RFC 7541 asks for there; answers decode
// before and after.
func TestFramesHeaderTableSize(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{})
	c := dialRaw(t, ts.addr)
	c.fr.ReadMetaHeaders = nil
	dec := hpack.NewDecoder(4096, nil)
	// blocks reads stream id's answer: its header blocks, decoded fields
	// and message value.
	blocks := func(id uint32) (raw [][]byte, fields map[string]string) {
		t.Helper()
		fields = map[string]string{}
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			h, ok := f.(*http2.HeadersFrame)
			if !ok || h.StreamID != id {
				continue
			}
			b := bytes.Clone(h.HeaderBlockFragment())
			raw = append(raw, b)
			hfs, err := dec.DecodeFull(b)
			if err != nil {
				t.Fatalf("stream %d: decode %x: %v", id, b, err)
			}
			for _, hf := range hfs {
				fields[hf.Name] = hf.Value
			}
			if h.StreamEnded() {
				return raw, fields
			}
		}
	}
	c.send(1, "one")
	first, fields := blocks(1)
	if fields[":status"] != "200" || fields["grpc-status"] != "0" || fields["content-type"] != "application/grpc" {
		t.Fatalf("first answer's fields %v", fields)
	}
	c.send(3, "two")
	second, _ := blocks(3)
	if !reflect.DeepEqual(first, second) {
		t.Errorf("header blocks of two answers differ: %x, %x", first, second)
	}

	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	c.send(5, "three")
	third, fields := blocks(5)
	if len(third) == 0 || third[0][0]&0xe0 != 0x20 {
		t.Fatalf("first header block after SETTINGS_HEADER_TABLE_SIZE %x: want a dynamic table size update first", third)
	}
	if fields[":status"] != "200" || fields["grpc-status"] != "0" {
		t.Fatalf("fields after the size update %v", fields)
	}
	c.send(7, "four")
	if fourth, _ := blocks(7); !reflect.DeepEqual(fourth, first) {
		t.Errorf("after the size update, header blocks %x, want %x", fourth, first)
	}

	// The change comes while an answer waits for window, its headers
	// sent: its trailers are the first block after it.
	c = dialRaw(t, ts.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 16})
	c.fr.ReadMetaHeaders = nil
	dec = hpack.NewDecoder(4096, nil)
	c.send(1, "big:100")
	for sent := 0; sent < 16; {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if _, err := dec.DecodeFull(f.HeaderBlockFragment()); err != nil {
				t.Fatal(err)
			}
		case *http2.DataFrame:
			sent += len(f.Data())
		}
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteWindowUpdate(1, 1000); err != nil {
		t.Fatal(err)
	}
	trailers, fields := blocks(1)
	if len(trailers) != 1 || trailers[0][0]&0xe0 != 0x20 || fields["grpc-status"] != "0" {
		t.Fatalf("trailers after SETTINGS_HEADER_TABLE_SIZE %x (%v): want a dynamic table size update first", trailers, fields)
	}
}

// TestFramesMalformedHeaders: a header list HTTP/2 forbids resets its
// stream (PROTOCOL_ERROR) and the connection serves on; a CONTINUATION
// after a malformed field, or a fragment far beyond the header list's
// limit, ends the connection.
func TestFramesMalformedHeaders(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, h2grpc.Options{MaxHeaderList: 1024})
	c := dialRaw(t, ts.addr)
	id := uint32(1)
	for _, tc := range []struct {
		name   string
		fields []string
	}{
		{"upper-case name", []string{":method", "POST", ":path", echo, "content-type", "application/grpc", "X-Upper", "1"}},
		{"pseudo-header after a regular one", []string{":method", "POST", "content-type", "application/grpc", ":path", echo}},
		{"duplicate pseudo-header", []string{":method", "POST", ":path", echo, ":path", echo, "content-type", "application/grpc"}},
		{"unknown pseudo-header", []string{":method", "POST", ":path", echo, ":foo", "1", "content-type", "application/grpc"}},
		{"request and response pseudo-headers", []string{":method", "POST", ":path", echo, ":status", "200", "content-type", "application/grpc"}},
		{"control byte in a value", []string{":method", "POST", ":path", echo, "content-type", "application/grpc", "x-a", "bad\x00value"}},
	} {
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.headerBlock(tc.fields...), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		_ = c.fr.WriteData(id, true, message("x"))
		if a := c.readAnswer(id); a.rst != http2.ErrCodeProtocol {
			t.Errorf("%s: %+v, want RST_STREAM PROTOCOL_ERROR", tc.name, a)
		}
		id += 2
	}
	c.send(id, "still")
	if a := c.readAnswer(id); a.value(t) != "still" {
		t.Fatalf("after the malformed header lists: %+v", a)
	}

	for _, tc := range []struct {
		name string
		send func(c *rawClient) error
	}{
		{"CONTINUATION after a malformed field", func(c *rawClient) error {
			block := c.headerBlock(":method", "POST", "X-Upper", "1")
			if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block}); err != nil {
				return err
			}
			return c.fr.WriteContinuation(1, true, c.headerBlock(":path", echo))
		}},
		{"fragment far beyond the header list's limit", func(c *rawClient) error {
			block := c.headerBlock(":method", "POST", ":path", echo, "x-big", strings.Repeat("z", 10000))
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true})
		}},
	} {
		c := dialRaw(t, ts.addr)
		if err := tc.send(c); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := c.goAway(); got != http2.ErrCodeProtocol {
			t.Errorf("%s: GOAWAY %v, want PROTOCOL_ERROR", tc.name, got)
		}
	}
}
