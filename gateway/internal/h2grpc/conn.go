package h2grpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/tollgate/tollgate/internal/rawconn"
)

const (
	// connWindow is the connection's receive window: data read is
	// acknowledged once half of it has been used.
	connWindow = 1 << 20
	// streamWindow is a stream's receive window (the HTTP/2 default,
	// never announced otherwise); a request message larger than it is
	// acknowledged as it comes.
	streamWindow = 65535
	// maxGRPCMessageLen bounds the grpc-message trailer.
	maxGRPCMessageLen = 1024
	// pingGrace: a client may ping this often without calls in between;
	// more than maxPingStrikes pings closer together end the connection
	// (GOAWAY ENHANCE_YOUR_CALM), as gRPC servers enforce keepalive.
	pingGrace      = 10 * time.Second
	maxPingStrikes = 2
	// closeGrace is how long a connection that said GOAWAY reads what the
	// client still sends before it closes.
	closeGrace = time.Second
	readBuffer = 32 << 10
	// maxScratch bounds the response buffer a connection keeps between
	// calls.
	maxScratch = 64 << 10
)

// stream is one call. Fields after the first group are guarded by the
// connection's mu.
type stream struct {
	id      uint32
	h       Handler
	timeout time.Duration // grpc-timeout; 0: none
	buf     []byte        // the gRPC-framed request so far
	recv    int32         // receive window left
	ended   bool          // the client's END_STREAM came

	// Under c.mu.
	send    int64              // the peer's window for this stream
	cancel  context.CancelFunc // of an asynchronous call
	pending []byte             // framed response data waiting for window
	code    codes.Code         // of the pending answer's trailers
	msg     string
}

// conn is one client connection. The reading goroutine owns the read
// side; mu guards the write side and the streams.
type conn struct {
	s        *Server
	raw      net.Conn // as accepted: closing it ends any read or write
	nc       net.Conn // raw (its reads and writes by rawconn.Wrap), or its TLS
	br       *bufio.Reader
	fr       *http2.Framer
	ctx      context.Context // cancelled when the connection ends
	cancel   context.CancelFunc
	localCtx context.Context // calls on the reading goroutine
	calls    sync.WaitGroup  // asynchronous calls
	recv     int32           // connection receive window left
	scratch  []byte          // response of a call decided while reading
	dec      *hpack.Decoder  // request header blocks, into hs
	hs       headerState     // the header block being read
	lastPing time.Time
	strikes  int

	mu         sync.Mutex
	bw         *bufio.Writer
	hbuf       bytes.Buffer
	enc        *hpack.Encoder
	streams    map[uint32]*stream
	lastID     uint32
	send       int64     // the peer's connection window
	initWindow int64     // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   int       // the peer's SETTINGS_MAX_FRAME_SIZE
	blocked    []*stream // answers waiting for window, in order
	reading    bool      // the reading goroutine will flush
	dirty      bool      // written, not flushed
	goingAway  bool
	closed     bool
	// tableUpdate: the peer changed SETTINGS_HEADER_TABLE_SIZE, so the
	// next header block comes from enc (it starts with the size update).
	tableUpdate bool
	werr        error
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancel(s.ctx)
	c := &conn{
		s: s, raw: nc, nc: rawconn.Wrap(nc), ctx: ctx, cancel: cancel, recv: connWindow,
		streams: map[uint32]*stream{}, send: 65535, initWindow: 65535, maxFrame: 16384,
	}
	lctx := context.WithValue(ctx, localKey{}, true)
	if s.opts.Context != nil {
		lctx = s.opts.Context(lctx)
	}
	c.localCtx = lctx
	return c
}

// serve runs the connection until it ends, then waits for its calls.
func (c *conn) serve() {
	defer func() {
		c.cancel()
		c.close()
		c.calls.Wait()
	}()
	if err := c.handshake(); err != nil {
		c.s.log.Debug("h2grpc: handshake", slog.String("remote", c.nc.RemoteAddr().String()), slog.Any("error", err))
		return
	}
	reading := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if !c.readError(err) {
				c.drain()
				return
			}
			continue
		}
		if !reading {
			// Answers written from now on wait for this batch's flush.
			reading = true
			c.mu.Lock()
			c.reading = true
			c.mu.Unlock()
		}
		if err := c.frame(f); err != nil {
			c.connError(err)
			c.drain()
			return
		}
		if !c.buffered() {
			reading = false
			c.mu.Lock()
			c.reading = false
			c.flushLocked()
			c.mu.Unlock()
		}
	}
}

// drain reads and drops what the client still sends after the connection
// said its last word, until the client closes or closeGrace passes.
func (c *conn) drain() {
	c.mu.Lock()
	closing := c.closed
	c.mu.Unlock()
	if closing {
		_, _ = io.Copy(io.Discard, c.br)
	}
}

// buffered reports whether a whole frame is already read into br, so that
// reading it will not wait.
func (c *conn) buffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := c.br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// handshake does TLS when configured, sends the server's SETTINGS and
// reads the client's preface.
func (c *conn) handshake() error {
	_ = c.nc.SetDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	if c.s.opts.TLS != nil {
		tc := tls.Server(c.nc, c.s.opts.TLS)
		if err := tc.HandshakeContext(c.ctx); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
		c.mu.Lock()
		c.nc = tc
		c.mu.Unlock()
	}
	c.br = bufio.NewReaderSize(c.nc, readBuffer)
	c.mu.Lock()
	c.bw = bufio.NewWriterSize(c.nc, readBuffer)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384)
	c.dec = hpack.NewDecoder(4096, c.emit)
	c.dec.SetMaxStringLength(int(c.s.opts.MaxHeaderList))
	c.enc = hpack.NewEncoder(&c.hbuf)
	err := c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.opts.MaxStreams},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.s.opts.MaxHeaderList})
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, connWindow-65535)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil {
		return fmt.Errorf("preface: %w", err)
	}
	if string(preface[:]) != http2.ClientPreface {
		return errors.New("preface: not HTTP/2")
	}
	_ = c.nc.SetDeadline(time.Time{})
	return nil
}

// readError handles an error of ReadFrame; it reports whether reading
// goes on (a stream's error).
func (c *conn) readError(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		c.mu.Lock()
		c.resetLocked(se.StreamID, se.Code)
		c.flushLocked()
		c.mu.Unlock()
		return true
	}
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.connError(err)
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.connError(http2.ConnectionError(http2.ErrCodeFrameSize))
	default:
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.s.log.Debug("h2grpc: read", slog.String("remote", c.nc.RemoteAddr().String()), slog.Any("error", err))
		}
	}
	return false
}

// connError ends the connection with GOAWAY carrying err's HTTP/2 code.
func (c *conn) connError(err error) {
	code := http2.ErrCodeProtocol
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		code = http2.ErrCode(ce)
	}
	var ge goAwayError
	if errors.As(err, &ge) {
		code = ge.code
	}
	c.s.log.Debug("h2grpc: connection error", slog.String("remote", c.nc.RemoteAddr().String()), slog.Any("error", err))
	c.mu.Lock()
	if !c.closed && c.werr == nil {
		_ = c.fr.WriteGoAway(c.lastID, code, []byte(err.Error()))
		c.dirty = true
		c.flushLocked()
	}
	c.mu.Unlock()
	c.closeWrite()
}

// goAwayError is a connection error with a message of its own.
type goAwayError struct {
	code http2.ErrCode
	msg  string
}

func (e goAwayError) Error() string { return e.msg }

func connErr(code http2.ErrCode, format string, args ...any) error {
	return goAwayError{code: code, msg: fmt.Sprintf(format, args...)}
}

// frame handles one frame read.
func (c *conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		c.hs = headerState{id: f.StreamID, endStream: f.StreamEnded(), remain: c.s.opts.MaxHeaderList}
		c.dec.SetEmitEnabled(true)
		return c.headerBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		// The Framer has checked that it continues c.hs's stream.
		return c.headerBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.data(f)
	case *http2.SettingsFrame:
		return c.settings(f)
	case *http2.PingFrame:
		return c.ping(f)
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		if st := c.streams[f.StreamID]; st != nil {
			c.removeLocked(st)
		} else if f.StreamID > c.lastID {
			c.mu.Unlock()
			return connErr(http2.ErrCodeProtocol, "RST_STREAM on idle stream %d", f.StreamID)
		}
		c.mu.Unlock()
	case *http2.GoAwayFrame:
		// The client opens no more streams; it closes when it is done.
	case *http2.PushPromiseFrame:
		return connErr(http2.ErrCodeProtocol, "PUSH_PROMISE from a client")
	case *http2.PriorityFrame, *http2.UnknownFrame:
		// Priorities do not matter to small unary answers.
	}
	return nil
}

func (c *conn) settings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.initWindow
			c.initWindow = int64(s.Val)
			for _, st := range c.streams {
				st.send += delta
				if st.send > math.MaxInt32 {
					return connErr(http2.ErrCodeFlowControl, "stream window above 2^31-1")
				}
			}
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.enc.SetMaxDynamicTableSizeLimit(s.Val)
			c.tableUpdate = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := c.fr.WriteSettingsAck(); err != nil {
		return err
	}
	c.dirty = true
	c.sendBlockedLocked()
	return nil
}

func (c *conn) ping(f *http2.PingFrame) error {
	if f.IsAck() {
		return nil
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingGrace {
		c.strikes++
		if c.strikes > maxPingStrikes {
			return goAwayError{code: http2.ErrCodeEnhanceYourCalm, msg: "too_many_pings"}
		}
	}
	c.lastPing = now
	c.dirty = true
	return c.fr.WritePing(true, f.Data)
}

func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		c.send += int64(f.Increment)
		if c.send > math.MaxInt32 {
			return connErr(http2.ErrCodeFlowControl, "connection window above 2^31-1")
		}
	} else if st := c.streams[f.StreamID]; st != nil {
		st.send += int64(f.Increment)
		if st.send > math.MaxInt32 {
			c.resetLocked(st.id, http2.ErrCodeFlowControl)
			return nil
		}
	}
	c.sendBlockedLocked()
	return nil
}

// headerState is what the reading goroutine keeps of the header block
// it decodes: the fields a call needs, and what makes the block invalid.
type headerState struct {
	id                           uint32
	endStream                    bool
	remain                       uint32 // of the header list's size
	truncated                    bool   // larger than MaxHeaderList
	invalid                      error  // a malformed field
	regular                      bool   // a regular field came
	pseudo                       uint8  // pseudo-header fields seen
	method, path, ctype, timeout string
}

// Pseudo-header fields of requests (and :status, of responses).
const (
	pseudoMethod = 1 << iota
	pseudoPath
	pseudoScheme
	pseudoAuthority
	pseudoProtocol
	pseudoStatus
)

var (
	errPseudoAfterRegular = errors.New("pseudo header field after regular")
	errMixedPseudo        = errors.New("mix of request and response pseudo headers")
)

// emit takes one decoded field of the header block: the checks
// golang.org/x/net/http2 makes of a header list, without keeping the
// fields a call does not use.
func (c *conn) emit(hf hpack.HeaderField) {
	hs := &c.hs
	if !httpguts.ValidHeaderFieldValue(hf.Value) {
		// Not the value: it may be secret.
		hs.invalid = fmt.Errorf("invalid header field value for %q", hf.Name)
	}
	if strings.HasPrefix(hf.Name, ":") {
		if hs.regular {
			hs.invalid = errPseudoAfterRegular
		}
		var bit uint8
		switch hf.Name {
		case ":method":
			bit = pseudoMethod
		case ":path":
			bit = pseudoPath
		case ":scheme":
			bit = pseudoScheme
		case ":authority":
			bit = pseudoAuthority
		case ":protocol":
			bit = pseudoProtocol
		case ":status":
			bit = pseudoStatus
		default:
			hs.invalid = fmt.Errorf("invalid pseudo-header %q", hf.Name)
		}
		if hs.pseudo&bit != 0 {
			hs.invalid = fmt.Errorf("duplicate pseudo-header %q", hf.Name)
		}
		hs.pseudo |= bit
		if hs.pseudo&pseudoStatus != 0 && hs.pseudo&^pseudoStatus != 0 {
			hs.invalid = errMixedPseudo
		}
	} else {
		hs.regular = true
		if !validFieldName(hf.Name) {
			hs.invalid = fmt.Errorf("invalid header field name %q", hf.Name)
		}
	}
	if hs.invalid != nil {
		c.dec.SetEmitEnabled(false)
		return
	}
	if size := hf.Size(); size > hs.remain {
		c.dec.SetEmitEnabled(false)
		hs.truncated, hs.remain = true, 0
		return
	} else {
		hs.remain -= size
	}
	switch hf.Name {
	case ":method":
		hs.method = hf.Value
	case ":path":
		hs.path = hf.Value
	case "content-type":
		hs.ctype = hf.Value
	case "grpc-timeout":
		hs.timeout = hf.Value
	}
}

// validFieldName reports whether v is a header field name HTTP/2 allows:
// a token, in lower case.
func validFieldName(v string) bool {
	if v == "" {
		return false
	}
	for _, r := range v {
		if !httpguts.IsTokenRune(r) || 'A' <= r && r <= 'Z' {
			return false
		}
	}
	return true
}

// headerBlock decodes a fragment of c.hs's header block; at its end
// (ended), it opens or ends the stream.
func (c *conn) headerBlock(frag []byte, ended bool) error {
	hs := &c.hs
	// A fragment far larger than what is left of the list (headers, and
	// as much again for trailers until the list is cut), or any after a
	// malformed field, ends the connection, as golang.org/x/net/http2's
	// server does: its fields would not be read anyway.
	budget := int64(hs.remain)
	if !hs.truncated {
		budget += int64(c.s.opts.MaxHeaderList)
	}
	if int64(len(frag)) > 2*budget || hs.invalid != nil {
		return connErr(http2.ErrCodeProtocol, "header block of stream %d: too large or malformed", hs.id)
	}
	if _, err := c.dec.Write(frag); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if !ended {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if hs.invalid != nil {
		c.mu.Lock()
		if hs.id%2 == 1 && hs.id > c.lastID {
			// Closed by the reset: what the client still sends on it is
			// dropped, not taken for frames on an idle stream.
			c.lastID = hs.id
		}
		c.resetLocked(hs.id, http2.ErrCodeProtocol)
		c.mu.Unlock()
		return nil
	}
	return c.headers()
}

// headers opens stream c.hs.id (or ends it: trailers).
func (c *conn) headers() error {
	hs := &c.hs
	id := hs.id
	if id%2 == 0 {
		return connErr(http2.ErrCodeProtocol, "HEADERS on even stream %d", id)
	}
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.mu.Unlock()
		if !hs.endStream || st.ended {
			c.reset(id, http2.ErrCodeProtocol)
			return nil
		}
		// Trailers: the request is complete.
		st.ended = true
		c.call(st, nil)
		return nil
	}
	if id <= c.lastID {
		c.mu.Unlock()
		return connErr(http2.ErrCodeStreamClosed, "HEADERS on closed stream %d", id)
	}
	c.lastID = id
	if c.goingAway {
		c.resetLocked(id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		return nil
	}
	if uint32(len(c.streams)) >= c.s.opts.MaxStreams {
		c.resetLocked(id, http2.ErrCodeRefusedStream)
		c.mu.Unlock()
		return nil
	}
	st := &stream{id: id, recv: streamWindow, send: c.initWindow, ended: hs.endStream}
	c.streams[id] = st
	c.mu.Unlock()

	if hs.truncated {
		c.refuse(st, codes.ResourceExhausted, fmt.Sprintf("header list larger than %d bytes", c.s.opts.MaxHeaderList))
		return nil
	}
	method, path, ctype, timeout := hs.method, hs.path, hs.ctype, hs.timeout
	if method != "POST" || path == "" {
		c.reset(id, http2.ErrCodeProtocol)
		return nil
	}
	if !grpcContentType(ctype) {
		c.refuse(st, codes.Unknown, fmt.Sprintf("invalid gRPC request content-type %q", ctype))
		return nil
	}
	if timeout != "" {
		d, ok := parseTimeout(timeout)
		if !ok {
			c.refuse(st, codes.Internal, fmt.Sprintf("malformed grpc-timeout %q", timeout))
			return nil
		}
		st.timeout = d
	}
	h := c.s.methods[path]
	if h == nil {
		c.refuse(st, codes.Unimplemented, "unknown method "+path)
		return nil
	}
	st.h = h
	if st.ended {
		c.call(st, nil)
	}
	return nil
}

// grpcContentType reports whether ct is gRPC's: application/grpc,
// alone or followed by "+codec" or ";parameters".
func grpcContentType(ct string) bool {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// parseTimeout reads grpc-timeout: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > uint64(math.MaxInt64/unit) {
		return math.MaxInt64, true
	}
	return time.Duration(n) * unit, true
}

func (c *conn) data(f *http2.DataFrame) error {
	id := f.StreamID
	n := int32(f.Length)
	if c.recv -= n; c.recv < 0 {
		return connErr(http2.ErrCodeFlowControl, "data beyond the connection window")
	}
	if c.recv < connWindow/2 {
		c.mu.Lock()
		err := c.fr.WriteWindowUpdate(0, uint32(connWindow-c.recv))
		c.dirty = true
		c.mu.Unlock()
		if err != nil {
			return err
		}
		c.recv = connWindow
	}
	c.mu.Lock()
	st := c.streams[id]
	c.mu.Unlock()
	if st == nil {
		if id > c.lastID {
			return connErr(http2.ErrCodeProtocol, "DATA on idle stream %d", id)
		}
		// A stream answered or reset already: its data is dropped.
		return nil
	}
	if st.ended {
		c.reset(id, http2.ErrCodeStreamClosed)
		return nil
	}
	if st.recv -= n; st.recv < 0 {
		c.reset(id, http2.ErrCodeFlowControl)
		return nil
	}
	st.ended = f.StreamEnded()
	if st.h == nil {
		// Refused already: wait for the end of the request.
		return nil
	}
	data := f.Data()
	if st.ended && len(st.buf) == 0 {
		// The whole request in one frame: decided from the frame itself.
		c.call(st, data)
		return nil
	}
	st.buf = append(st.buf, data...)
	if len(st.buf) >= 5 {
		l := binary.BigEndian.Uint32(st.buf[1:5])
		if int64(l) > int64(c.s.opts.MaxMessage) {
			c.refuse(st, codes.ResourceExhausted,
				fmt.Sprintf("request message of %d bytes, larger than the limit of %d", l, c.s.opts.MaxMessage))
			return nil
		}
		if len(st.buf) > 5+int(l) {
			c.refuse(st, codes.Internal, "a unary call takes exactly one request message")
			return nil
		}
	}
	if st.ended {
		c.call(st, nil)
		return nil
	}
	if st.recv < streamWindow/2 {
		c.mu.Lock()
		err := c.fr.WriteWindowUpdate(id, uint32(streamWindow-st.recv))
		c.dirty = true
		c.mu.Unlock()
		st.recv = streamWindow
		return err
	}
	return nil
}

// call decides a complete request: on this goroutine when the handler
// can, else on a goroutine of its own. frame is the request when it came
// in one DATA frame (st.buf otherwise).
func (c *conn) call(st *stream, frame []byte) {
	if st.h == nil {
		return
	}
	b := frame
	if b == nil {
		b = st.buf
	}
	if len(b) < 5 {
		c.refuse(st, codes.Internal, "no request message")
		return
	}
	l := binary.BigEndian.Uint32(b[1:5])
	switch {
	case b[0] == 1:
		c.refuse(st, codes.Unimplemented, "compressed requests are not served")
		return
	case b[0] != 0:
		c.refuse(st, codes.Internal, fmt.Sprintf("invalid message flag %d", b[0]))
		return
	case int64(l) > int64(c.s.opts.MaxMessage):
		c.refuse(st, codes.ResourceExhausted,
			fmt.Sprintf("request message of %d bytes, larger than the limit of %d", l, c.s.opts.MaxMessage))
		return
	case int(l) != len(b)-5:
		c.refuse(st, codes.Internal, "a unary call takes exactly one request message")
		return
	}
	msg := b[5:]
	out, err := st.h(c.localCtx, msg, framed(c.scratch))
	if !errors.Is(err, ErrWouldBlock) {
		c.s.inline.Add(1)
		if cap(out) <= maxScratch {
			c.scratch = out[:0]
		}
		c.answer(st, out, err)
		return
	}
	if frame != nil {
		st.buf = append([]byte(nil), b...)
	}
	ctx, cancel := c.ctx, context.CancelFunc(nil)
	if st.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, st.timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	c.mu.Lock()
	if c.streams[st.id] != st {
		c.mu.Unlock()
		cancel()
		return
	}
	st.cancel = cancel
	c.mu.Unlock()
	c.calls.Add(1)
	c.s.async.Add(1)
	h, req := st.h, st.buf[5:]
	c.s.goCall(func() {
		defer c.calls.Done()
		defer cancel()
		out, err := h(ctx, req, framed(nil))
		c.answer(st, out, err)
	})
}

// framed returns b's storage (or new storage) holding the 5 bytes of a
// gRPC message's prefix, to which a handler appends the message.
func framed(b []byte) []byte {
	if cap(b) < 5 {
		b = make([]byte, 5, 256)
	}
	return b[:5]
}

// refuse answers st with an error before its handler ran. Called on the
// reading goroutine, which alone reads and writes st.h.
func (c *conn) refuse(st *stream, code codes.Code, msg string) {
	st.h = nil
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams[st.id] != st {
		return
	}
	c.writeAnswerLocked(st, nil, code, msg)
	if !st.ended {
		// Answered before the request ended: the rest is not wanted.
		c.writeRST(st.id, http2.ErrCodeNo)
	}
	c.afterWriteLocked()
}

// answer writes the answer of a call: out is the response message (with
// nil error), err its status.
func (c *conn) answer(st *stream, out []byte, err error) {
	code, msg := statusOf(err)
	if code == codes.OK && len(out) < 5 {
		code, msg = codes.Internal, "h2grpc: the handler dropped its response's prefix"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams[st.id] != st {
		// Reset by the client meanwhile, or the connection is closed.
		return
	}
	if code != codes.OK {
		out = nil
	}
	c.writeAnswerLocked(st, out, code, msg)
	c.afterWriteLocked()
}

// afterWriteLocked flushes unless the reading goroutine will, and closes
// a connection that said GOAWAY once its last call is answered.
func (c *conn) afterWriteLocked() {
	c.strikes = 0
	c.lastPing = time.Time{}
	if !c.reading {
		c.flushLocked()
	}
	if c.goingAway && len(c.streams) == 0 {
		c.flushLocked()
		c.closeWriteLocked()
	}
}

// writeAnswerLocked writes the headers, message and trailers of st's
// answer (a trailers-only answer for an error), as far as the peer's
// windows let the message go; the rest waits for WINDOW_UPDATE.
func (c *conn) writeAnswerLocked(st *stream, out []byte, code codes.Code, msg string) {
	if c.closed || c.werr != nil {
		c.removeLocked(st)
		return
	}
	c.dirty = true
	if code != codes.OK {
		c.hbuf.Reset()
		c.field(":status", "200")
		c.field("content-type", "application/grpc")
		c.trailerFields(code, msg)
		c.writeHeaders(st.id, true, c.hbuf.Bytes())
		c.tableUpdate = false
		c.removeLocked(st)
		return
	}
	if c.tableUpdate {
		c.hbuf.Reset()
		c.field(":status", "200")
		c.field("content-type", "application/grpc")
		c.writeHeaders(st.id, false, c.hbuf.Bytes())
		c.tableUpdate = false
	} else {
		c.writeHeaders(st.id, false, okHeaders)
	}
	binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
	out[0] = 0
	st.code, st.msg = code, msg
	if !c.sendLocked(st, out) {
		// out may be the connection's scratch buffer: what waits is a copy.
		st.pending = bytes.Clone(st.pending)
		c.blocked = append(c.blocked, st)
	}
}

// okHeaders and okTrailers are the header blocks of every successful
// answer: literals that are never indexed, so that they are the same
// bytes whatever the state of the connection's HPACK table.
var okHeaders, okTrailers = constantBlock(":status", "200", "content-type", "application/grpc"),
	constantBlock("grpc-status", "0")

// constantBlock encodes fields as an HPACK block that neither reads nor
// changes the dynamic table.
func constantBlock(fields ...string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: true})
	}
	return b.Bytes()
}

// sendLocked writes as much of the framed message data as the windows
// allow, and the trailers after the last of it; it reports whether all
// went. What did not is left in st.pending, to be sent with
// sendLocked(st, st.pending) when the peer gives window.
func (c *conn) sendLocked(st *stream, data []byte) bool {
	for len(data) > 0 {
		n := int64(min(len(data), c.maxFrame))
		n = min(n, c.send, st.send)
		if n <= 0 {
			st.pending = data
			return false
		}
		if c.werr == nil {
			c.werr = c.fr.WriteData(st.id, false, data[:n])
		}
		c.send -= n
		st.send -= n
		data = data[n:]
	}
	st.pending = nil
	if st.code == codes.OK && st.msg == "" && !c.tableUpdate {
		c.writeHeaders(st.id, true, okTrailers)
	} else {
		c.hbuf.Reset()
		c.trailerFields(st.code, st.msg)
		c.writeHeaders(st.id, true, c.hbuf.Bytes())
		c.tableUpdate = false
	}
	c.removeLocked(st)
	return true
}

// sendBlockedLocked sends the answers waiting for window that now fit.
func (c *conn) sendBlockedLocked() {
	if len(c.blocked) == 0 {
		return
	}
	left := c.blocked[:0]
	for _, st := range c.blocked {
		if c.streams[st.id] == st && !c.sendLocked(st, st.pending) {
			left = append(left, st)
		}
	}
	clear(c.blocked[len(left):])
	c.blocked = left
	c.dirty = true
	if !c.reading {
		c.flushLocked()
	}
	if c.goingAway && len(c.streams) == 0 {
		c.closeWriteLocked()
	}
}

func (c *conn) field(name, value string) {
	_ = c.enc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

func (c *conn) trailerFields(code codes.Code, msg string) {
	c.field("grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		c.field("grpc-message", encodeMessage(msg))
	}
}

func (c *conn) writeHeaders(id uint32, end bool, block []byte) {
	if c.werr == nil {
		c.werr = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: end, EndHeaders: true})
	}
}

// encodeMessage percent-encodes msg for grpc-message, as gRPC asks
// (bytes outside printable ASCII, and '%'), cut to maxGRPCMessageLen.
func encodeMessage(msg string) string {
	if len(msg) > maxGRPCMessageLen {
		msg = msg[:maxGRPCMessageLen]
	}
	plain := true
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < 0x20 || b > 0x7e || b == '%' {
			plain = false
			break
		}
	}
	if plain {
		return msg
	}
	const hex = "0123456789ABCDEF"
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < 0x20 || b > 0x7e || b == '%' {
			sb.WriteByte('%')
			sb.WriteByte(hex[b>>4])
			sb.WriteByte(hex[b&15])
		} else {
			sb.WriteByte(b)
		}
	}
	return sb.String()
}

// reset ends stream id with RST_STREAM code.
func (c *conn) reset(id uint32, code http2.ErrCode) {
	c.mu.Lock()
	c.resetLocked(id, code)
	c.mu.Unlock()
}

func (c *conn) resetLocked(id uint32, code http2.ErrCode) {
	if st := c.streams[id]; st != nil {
		c.removeLocked(st)
	}
	c.writeRST(id, code)
	if c.goingAway && len(c.streams) == 0 {
		c.flushLocked()
		c.closeWriteLocked()
	}
}

func (c *conn) writeRST(id uint32, code http2.ErrCode) {
	if c.werr == nil && !c.closed {
		c.werr = c.fr.WriteRSTStream(id, code)
		c.dirty = true
	}
}

// removeLocked forgets st, cancelling its call.
func (c *conn) removeLocked(st *stream) {
	if c.streams[st.id] != st {
		return
	}
	delete(c.streams, st.id)
	if st.cancel != nil {
		st.cancel()
	}
}

func (c *conn) flushLocked() {
	if !c.dirty || c.closed {
		return
	}
	c.dirty = false
	if c.werr == nil {
		c.werr = c.bw.Flush()
	}
	if c.werr != nil {
		c.closed = true
		_ = c.nc.Close()
	}
}

// goAway starts the graceful end: GOAWAY, no more streams, the
// connection closes once its calls are answered.
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goingAway || c.closed || c.fr == nil {
		if c.fr == nil {
			// Still in its handshake: nothing to drain.
			c.closed = true
			_ = c.nc.Close()
		}
		return
	}
	c.goingAway = true
	if c.werr == nil {
		c.werr = c.fr.WriteGoAway(c.lastID, http2.ErrCodeNo, nil)
	}
	c.dirty = true
	c.flushLocked()
	if len(c.streams) == 0 {
		c.closeWriteLocked()
	}
}

// closeWrite ends the connection's writing; its reading ends within
// closeGrace (what the client still sends is read, so that the GOAWAY
// reaches it instead of a reset).
func (c *conn) closeWrite() {
	c.mu.Lock()
	c.closeWriteLocked()
	c.mu.Unlock()
}

func (c *conn) closeWriteLocked() {
	if c.closed {
		return
	}
	c.closed = true
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(closeGrace))
		return
	}
	_ = c.nc.Close()
}

// close cuts the connection: first the socket, so that a write holding
// mu fails at once.
func (c *conn) close() {
	_ = c.raw.Close()
	c.mu.Lock()
	c.closed = true
	for _, st := range c.streams {
		c.removeLocked(st)
	}
	_ = c.nc.Close()
	c.mu.Unlock()
}
