package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
)

// The wire layer sits between the SDK and the transport. It exists because
// the SDK hands progress notifications to a separate goroutine while it
// delivers replies from the reading one, so a progress notification that
// arrived just before its call's reply can be handled after the call has
// returned, and be lost. Here progress is reported from the reading
// goroutine itself, in wire order. The same vantage point names the cause
// in each outgoing cancellation and counts late messages.
//
// Wrapping the connection hides the SDK's unexported session hooks from a
// streamable HTTP connection: it then opens no standalone SSE stream (which
// timebox does not need: a call's progress comes on that call's own
// stream) and sets no protocol-version header, which headerTransport adds.

const (
	methodProgress  = "notifications/progress"
	methodCancelled = "notifications/cancelled"
)

type wireTransport struct {
	t    mcp.Transport
	link *link
}

// Connect connects t and wraps the connection in the link's wireConn.
func (w *wireTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := w.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	wc := &wireConn{Connection: c, s: w.link.s, link: w.link, broken: make(chan struct{})}
	w.link.conn = wc
	return wc, nil
}

// wireConn is one link's connection as the SDK sees it.
type wireConn struct {
	mcp.Connection
	s    *Server
	link *link

	mu sync.Mutex
	// pending holds the tool calls written and not yet answered, by request
	// ID, so that a reply is matched with its call however it races the
	// call's stop: the SDK forgets a call the moment its context ends and
	// writes the cancellation a moment later, and a reply may come in
	// between. It is bounded: a server that never answers stopped calls
	// must not grow it forever.
	pending   map[jsonrpc.ID]*active
	closeOnce sync.Once
	// broken is closed when a read fails: the connection is over.
	broken    chan struct{}
	brokenOne sync.Once
	readErr   error // the failed read's error, set before broken is closed
}

// messageProblem says what was wrong with what a stdio server wrote on
// stdout, when that is what ended the connection — a message past
// MaxMessage, one that is not JSON-RPC — and "" when the connection ended
// otherwise (the server exited, or was stopped). The SDK closes the
// server's input then, and the server's exit, which follows, says nothing
// of why.
func (c *wireConn) messageProblem() string {
	if !c.isBroken() {
		return ""
	}
	err := c.readErr
	switch {
	case errors.Is(err, errMessageTooLong):
		return err.Error()
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, os.ErrClosed), errors.Is(err, io.ErrClosedPipe),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ""
	}
	return fmt.Sprintf("wrote a line on stdout that is not a JSON-RPC message (%v)", err)
}

// isBroken reports whether the connection's reading side has failed.
func (c *wireConn) isBroken() bool {
	select {
	case <-c.broken:
		return true
	default:
		return false
	}
}

// maxPending bounds pending; past it, the stopped calls are forgotten.
const maxPending = 1024

// Read reports progress notifications before handing them on, so that a
// call's progress is reported before its reply is delivered.
func (c *wireConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		c.brokenOne.Do(func() {
			c.readErr = err
			close(c.broken)
		})
		return msg, err
	}
	switch m := msg.(type) {
	case *jsonrpc.Request:
		if m.Method == methodProgress {
			c.s.progress(m.Params)
		}
	case *jsonrpc.Response:
		if c.link.version.Load() == nil && m.Error == nil {
			// The initialize result: note the version before the SDK goes
			// on to send notifications/initialized, which must carry it.
			var r struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			if json.Unmarshal(m.Result, &r) == nil && r.ProtocolVersion != "" {
				c.link.version.Store(&r.ProtocolVersion)
			}
		}
		if m.ID.IsValid() {
			c.mu.Lock()
			a, ok := c.pending[m.ID]
			delete(c.pending, m.ID)
			c.mu.Unlock()
			if ok {
				// Counted before the answer, which may let the stopped
				// call return: what it returns to has it counted.
				if a.cause() != nil { // the call was stopped: the SDK drops the reply
					c.s.stats.lateReplies.Add(1)
					c.s.log.Debug("mcp reply after the call was stopped dropped", "entry", c.s.cfg.Name, "id", m.ID.Raw())
				}
				a.answer()
			}
		}
	}
	if c.s.cfg.onRead != nil {
		c.s.cfg.onRead(msg)
	}
	return msg, nil
}

// Write notes each tool call it writes, to match its reply, and names the
// cause in a call's cancellation. What is not a tool call's (its context
// carries none: a ping, initialize) goes through as it is.
func (c *wireConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	m, ok := msg.(*jsonrpc.Request)
	a, _ := ctx.Value(activeKey{}).(*active)
	if !ok || a == nil {
		return c.Connection.Write(ctx, msg)
	}
	if m.Method == methodCancelled {
		if c.s.cfg.onCancel != nil {
			c.s.cfg.onCancel(a.token, time.Now())
		}
		select {
		case <-a.answered: // a cancel for a finished request, which MCP allows
			a.answeredFirst.Store(true)
		default:
		}
		defer a.cancelOnce.Do(func() { close(a.cancelWritten) })
		return c.Connection.Write(ctx, c.cancelling(m, a))
	}
	if !m.ID.IsValid() {
		return c.Connection.Write(ctx, msg)
	}
	// Noted before it is written, so that no reply can come first.
	c.mu.Lock()
	if len(c.pending) >= maxPending {
		for id, p := range c.pending {
			if p.cause() != nil {
				delete(c.pending, id)
			}
		}
	}
	if c.pending == nil {
		c.pending = map[jsonrpc.ID]*active{}
	}
	c.pending[m.ID] = a
	c.mu.Unlock()
	err := c.Connection.Write(ctx, msg)
	if err != nil {
		c.mu.Lock()
		delete(c.pending, m.ID)
		c.mu.Unlock()
	}
	return err
}

// cancelling counts a tool call's outgoing cancellation and makes its
// reason the budget or stop that ended the call, so that the server's log
// says "tool timeout: … exceeded 1s" rather than "context canceled".
func (c *wireConn) cancelling(m *jsonrpc.Request, a *active) jsonrpc.Message {
	var p struct {
		RequestID any    `json:"requestId"`
		Reason    string `json:"reason,omitempty"`
	}
	c.s.stats.cancels.Add(1)
	if err := json.Unmarshal(m.Params, &p); err != nil {
		return m
	}
	if cause := a.cause(); cause != nil {
		p.Reason = reasonOf(cause)
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return m
	}
	cp := *m
	cp.Params = raw
	return &cp
}

// forceClose cuts the connection under the SDK: its reader fails, which
// retires every call in flight with an error.
func (c *wireConn) forceClose() {
	c.closeOnce.Do(func() { _ = c.Connection.Close() })
}

// Close closes the connection once.
func (c *wireConn) Close() error {
	var err error
	c.closeOnce.Do(func() { err = c.Connection.Close() })
	return err
}

// progress reports one progress notification to its call, or counts it as
// late when the call has ended.
func (s *Server) progress(raw json.RawMessage) {
	var p struct {
		Token    any      `json:"progressToken"`
		Progress *float64 `json:"progress"`
		Total    *float64 `json:"total"`
		Message  string   `json:"message"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return
	}
	token := tokenString(p.Token)
	v, ok := s.calls.Load(token)
	if !ok {
		s.stats.lateProgress.Add(1)
		s.log.Debug("mcp progress after the call ended dropped", "entry", s.cfg.Name, "token", token)
		return
	}
	a := v.(*active)
	r := toolReport(p.Progress, p.Total, p.Message)
	a.progress.Report(r)
}

// headerTransport adds the entry's headers, and the protocol version the
// SDK would have set had the connection not been wrapped, to every request.
type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
	link    *link
}

// RoundTrip sends a copy of r with the entry's headers set, and the
// protocol version the link agreed when r names none.
func (h *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	if v := h.link.version.Load(); v != nil && r.Header.Get("Mcp-Protocol-Version") == "" {
		r.Header.Set("Mcp-Protocol-Version", *v)
	}
	return h.base.RoundTrip(r)
}

// tokenString is how a numeric progress token a server echoes back is
// compared with the string token timebox sent.
func tokenString(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case float64:
		return strconv.FormatFloat(t, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

// reasonOf says why a call was cancelled, for the server's log. A timeout
// is described from the fields its creator set and nobody changes; its
// Error method would read Elapsed, which the runner fills in concurrently.
func reasonOf(cause error) string {
	if te, ok := budget.AsTimeout(cause); ok {
		s := fmt.Sprintf("%s timeout: %s exceeded %s", te.Phase, te.Subject, budget.FormatDuration(te.Limit))
		if te.Knob != "" {
			s += "; change " + te.Knob
		}
		return s
	}
	return cause.Error()
}
