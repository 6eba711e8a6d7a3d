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
// IOTransport but for one thing: a line that is not a JSON-RPC message is
// answered with a JSON-RPC error (-32700 Parse error for a line that is
// not JSON, -32600 Invalid Request for JSON that is no message) and the
// session goes on, as JSON-RPC 2.0 asks, where the SDK's transport ends the
// session at the first such line. Blank lines are skipped. Closing the
// transport closes neither r nor w.
func Stdio(r io.Reader, w io.Writer) mcp.Transport {
	lw := &lockedWriter{w: w}
	return &mcp.IOTransport{Reader: io.NopCloser(&messageLines{r: bufio.NewReader(r), w: lw, max: maxLine}), Writer: lw}
}

// lockedWriter writes whole writes, one at a time: the SDK's messages and
// messageLines' errors share it. Close does nothing (the stream is the
// process's).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// messageLines passes on the lines of r that are JSON-RPC messages (or
// batches of them), and answers the others on w.
type messageLines struct {
	r   *bufio.Reader
	w   io.Writer
	max int    // the longest line read (maxLine)
	buf []byte // what is left of the lines passed on
	err error  // r's error, once buf is read
}

func (m *messageLines) Read(p []byte) (int, error) {
	for len(m.buf) == 0 {
		if m.err != nil {
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
		// A batch: the SDK says what is wrong with it, if anything.
	default:
		if _, err := jsonrpc.DecodeMessage(t); err != nil {
			m.answer(idOf(t), -32600, "Invalid Request: "+err.Error())
			return
		}
	}
	m.buf = append(append(m.buf, t...), '\n')
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
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	_, _ = m.w.Write(append(b, '\n'))
}
