package mcpserve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
)

// Stdio returns the transport of a session on a stream of newline-delimited
// JSON-RPC messages (`timebox mcp serve` on stdin and stdout), as the SDK's
// IOTransport but for two things.
//
// A line that is not a JSON-RPC message is answered with a JSON-RPC error
// (-32700 Parse error for a line that is not JSON, -32600 Invalid Request
// for JSON that is no message) and the session goes on, as JSON-RPC 2.0
// asks, where the SDK's transport ends the session at the first such line.
// Blank lines are skipped. A batch (a JSON array) under a negotiated
// protocol without batches (2025-06-18 and later) is answered with -32600
// Invalid Request, id null, saying to send the requests one by one, and
// the session and its running calls go on, where the SDK's transport ends
// the session. Under an earlier protocol, a batch the SDK's transport
// cannot take (empty, a member that is no message, two requests of one id)
// is answered so too, and its notifications are taken one by one.
//
// The end of r is the end of the requests, not of the client: every
// request read before it is answered (a call within its budget) before the
// session ends, so that a client that writes its requests and closes its
// side (a shell pipeline, a script) gets every answer. The SDK's transport
// ends the session at the end of r, and the requests still unanswered get
// no answer. The wait ends early, and the calls still running are stopped
// as the client gone, when outGone (if not nil) is closed, meaning w's
// reader has gone away, or when a write to w fails: their answers could
// not be read.
//
// Closing the transport closes neither r nor w.
func Stdio(r io.Reader, w io.Writer, outGone <-chan struct{}) mcp.Transport {
	p := &pending{ids: map[jsonrpc.ID]bool{}, changed: make(chan struct{}), closed: make(chan struct{}), outGone: outGone}
	lw := &lockedWriter{w: w, p: p}
	return &mcp.IOTransport{Reader: &messageLines{r: bufio.NewReader(r), w: lw, max: maxLine, p: p}, Writer: lw}
}

// pending are the requests passed on to the session and not yet answered.
type pending struct {
	mu      sync.Mutex
	ids     map[jsonrpc.ID]bool
	broken  bool          // a write failed: no answer can be written
	changed chan struct{} // closed, and made anew, at every change
	closed  chan struct{} // closed when the transport is
	close   sync.Once
	outGone <-chan struct{}
	// initID is the id of the initialize request read and not yet
	// answered, when initializing; protocol is the version its answer
	// negotiated ("" before).
	initID       jsonrpc.ID
	initializing bool
	protocol     string
}

// update applies f to p and wakes wait.
func (p *pending) update(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
}

// read notes the requests of msgs (calls, which are answered).
func (p *pending) read(msgs []jsonrpc.Message) {
	p.update(func() {
		for _, m := range msgs {
			if r, ok := m.(*jsonrpc.Request); ok && r.IsCall() {
				p.ids[r.ID] = true
				if r.Method == "initialize" && !p.initializing && p.protocol == "" {
					p.initID, p.initializing = r.ID, true
				}
			}
		}
	})
}

// unanswered reports whether a request of id was read and not answered.
func (p *pending) unanswered(id jsonrpc.ID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id]
}

// wrote notes the answers of msgs.
func (p *pending) wrote(msgs []jsonrpc.Message) {
	p.update(func() {
		for _, m := range msgs {
			if r, ok := m.(*jsonrpc.Response); ok {
				delete(p.ids, r.ID)
				if p.initializing && r.ID == p.initID {
					p.initializing = false
					var res struct {
						ProtocolVersion string `json:"protocolVersion"`
					}
					if r.Error == nil && json.Unmarshal(r.Result, &res) == nil {
						p.protocol = res.ProtocolVersion
					}
				}
			}
		}
	})
}

// wait returns once every request read has been answered, or no answer
// can be: a write failed, w's reader is gone, or the transport is closed
// (the session ended: a shutdown).
func (p *pending) wait() {
	for {
		p.mu.Lock()
		done, changed := len(p.ids) == 0 || p.broken, p.changed
		p.mu.Unlock()
		if done {
			return
		}
		select {
		case <-changed:
		case <-p.outGone:
			return
		case <-p.closed:
			return
		}
	}
}

// negotiated returns the session's protocol version, "" before one is
// negotiated. While an initialize read is not answered, it waits for its
// answer: the SDK takes the version on while it handles the request, before
// it answers, and a line read meanwhile is judged as the SDK will judge it.
// The wait ends, with "", when no answer can come (as wait).
func (p *pending) negotiated() string {
	for {
		p.mu.Lock()
		initializing, protocol, broken, changed := p.initializing, p.protocol, p.broken, p.changed
		p.mu.Unlock()
		if !initializing || broken {
			return protocol
		}
		select {
		case <-changed:
		case <-p.outGone:
			return ""
		case <-p.closed:
			return ""
		}
	}
}

// messages decodes a line (a message or a batch); what is not a message is
// left out.
func messages(line []byte) []jsonrpc.Message {
	t := bytes.TrimSpace(line)
	var raws []json.RawMessage
	if len(t) > 0 && t[0] == '[' {
		// Into a nil slice: unmarshalled into one that holds t, the
		// first message would be written over t itself.
		if json.Unmarshal(t, &raws) != nil {
			return nil
		}
	} else {
		raws = []json.RawMessage{t}
	}
	var msgs []jsonrpc.Message
	for _, raw := range raws {
		if m, err := jsonrpc.DecodeMessage(raw); err == nil {
			msgs = append(msgs, m)
		}
	}
	return msgs
}

// lockedWriter writes whole writes, one at a time: the SDK's messages and
// messageLines' errors share it. It notes the answers the SDK writes.
// Close does nothing (the stream is the process's).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
	p  *pending
}

// Write writes b whole, under the lock, and notes the answers it holds.
func (l *lockedWriter) Write(b []byte) (int, error) {
	n, err := l.write(b)
	if err == nil {
		l.p.wrote(messages(b))
	}
	return n, err
}

// write writes b, and notes that no answer can be written when it fails.
func (l *lockedWriter) write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(b)
	if err != nil {
		l.p.update(func() { l.p.broken = true })
	}
	return n, err
}

// Close does nothing: the stream is the process's.
func (l *lockedWriter) Close() error { return nil }

// messageLines passes on the lines of r that are JSON-RPC messages (or
// batches of them), and answers the others on w.
type messageLines struct {
	r   *bufio.Reader
	w   *lockedWriter
	max int    // the longest line read (maxLine)
	buf []byte // what is left of the lines passed on
	err error  // r's error, once buf is read
	p   *pending
}

// Read passes on the lines that are JSON-RPC messages, answering the
// others, and returns r's error once the requests read are answered.
func (m *messageLines) Read(p []byte) (int, error) {
	for len(m.buf) == 0 {
		if m.err != nil {
			// The session ends at r's error; the requests it has read
			// are answered first.
			m.p.wait()
			return 0, m.err
		}
		line, long, err := m.line()
		if long {
			m.answer(nil, -32700, fmt.Sprintf("Parse error: the line is longer than %s, the longest message this server reads", budget.FormatBytes(int64(m.max))))
		} else {
			m.take(line)
		}
		m.err = err
	}
	n := copy(p, m.buf)
	m.buf = m.buf[n:]
	return n, nil
}

// maxLine is the longest line (message) a transport made by Stdio reads;
// the rest of a longer one is skipped, not held. A variable for tests,
// read when the transport is made.
var maxLine = 64 << 20

// line reads the next line, or skips it and reports it long when it is
// longer than maxLine.
func (m *messageLines) line() (line []byte, long bool, err error) {
	for {
		chunk, err := m.r.ReadSlice('\n')
		if !long {
			if len(line)+len(chunk) > m.max {
				long, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err != bufio.ErrBufferFull {
			return line, long, err
		}
	}
}

// take passes line on, or answers it with an error.
func (m *messageLines) take(line []byte) {
	t := bytes.TrimSpace(line)
	switch {
	case len(t) == 0:
		return
	case !json.Valid(t):
		m.answer(nil, -32700, "Parse error: the line is not JSON (one JSON-RPC message per line)")
		return
	case t[0] == '[':
		// A batch: the SDK says what is wrong with it, if anything, but
		// under a protocol without batches it would end the session.
		msg := batchRefusal(m.p.negotiated())
		var lines [][]byte
		if msg == "" {
			lines, msg = m.oldBatch(t)
		}
		if msg != "" {
			m.answer(nil, -32600, msg)
			return
		}
		m.p.read(messages(t))
		for _, l := range lines {
			m.buf = append(append(m.buf, l...), '\n')
		}
		return
	default:
		if _, err := jsonrpc.DecodeMessage(t); err != nil {
			m.answer(idOf(t), -32600, "Invalid Request: "+err.Error())
			return
		}
	}
	m.p.read(messages(t))
	m.buf = append(append(m.buf, t...), '\n')
}

// oldBatch checks a batch read under a protocol with batches, and returns
// it as lines the SDK's transport takes, or the message to refuse it with.
// The SDK's transport ends the session at a batch that is empty, has a
// member that is no message, or has two requests of one id (two
// notifications count as such); and it never writes the answer to a batch
// whose notifications or responses sit beside its requests, waiting for
// an answer to them too. So such a batch is refused whole, as JSON-RPC
// asks (-32600, id null), and none of it runs; a request whose id another
// request not yet answered has is refused so too. What is not a request
// is passed on as a line of its own (those before the first request
// before it, the others after it), and the requests as one batch, which
// is answered as one.
func (m *messageLines) oldBatch(t []byte) (lines [][]byte, refusal string) {
	var raws []json.RawMessage
	if json.Unmarshal(t, &raws) != nil || len(raws) == 0 {
		return nil, "Invalid Request: the batch is empty (a batch holds one message or more); send at least one request"
	}
	var calls [][]byte
	var before, after [][]byte
	ids := map[jsonrpc.ID]bool{}
	for i, raw := range raws {
		msg, err := jsonrpc.DecodeMessage(raw)
		if err != nil {
			return nil, fmt.Sprintf(`Invalid Request: the batch's member %d is not a JSON-RPC message (an object with "jsonrpc": "2.0" and a method, or a result or an error); none of the batch was run`, i+1)
		}
		r, ok := msg.(*jsonrpc.Request)
		if !ok || !r.IsCall() {
			if len(calls) == 0 {
				before = append(before, raw)
			} else {
				after = append(after, raw)
			}
			continue
		}
		id, _ := json.Marshal(r.ID.Raw())
		if ids[r.ID] {
			return nil, fmt.Sprintf("Invalid Request: the batch has two requests of id %s; none of the batch was run (give each request an id of its own)", id)
		}
		if m.p.unanswered(r.ID) {
			return nil, fmt.Sprintf("Invalid Request: the batch's request of id %s has the id of a request not yet answered; none of the batch was run (give each request an id of its own)", id)
		}
		ids[r.ID] = true
		calls = append(calls, raw)
	}
	lines = before
	if len(calls) > 0 {
		lines = append(lines, append(append([]byte{'['}, bytes.Join(calls, []byte{','})...), ']'))
	}
	return append(lines, after...), ""
}

// Close ends a wait for the answers (the session is over); r is not
// closed.
func (m *messageLines) Close() error {
	m.p.close.Do(func() { close(m.p.closed) })
	return nil
}

// idOf returns the id of a request that could not be read, when it has
// one that is a string or a number.
func idOf(t []byte) json.RawMessage {
	var v struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(t, &v) != nil || len(v.ID) == 0 || (v.ID[0] != '"' && v.ID[0] != '-' && (v.ID[0] < '0' || v.ID[0] > '9')) {
		return nil
	}
	return v.ID
}

// answer writes a JSON-RPC error response; a nil id is null.
func (m *messageLines) answer(id json.RawMessage, code int, msg string) {
	// Not noted as an answer: the request was not passed on, and its id
	// may be one a request that was is still waiting for.
	_, _ = m.w.write(append(errorAnswer(id, code, msg), '\n'))
}
