// Package fakellm is a scriptable fake model provider for tests: an HTTP
// server on loopback that speaks a real streaming wire format (OpenAI Chat
// Completions SSE, or Anthropic Messages SSE) and plays, per request, a scripted Reply — text and tool
// call fragments with delays, a stall before or during the stream, an HTTP
// error with Retry-After, a reset connection, a malformed or truncated
// stream. It records every request it received, and refuses, as the real
// APIs do, a request whose tool calls and results do not pair up or (with
// LimitContext) that is longer than the model's context window.
package fakellm

import (
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Format is a provider wire format.
type Format string

// The wire formats.
const (
	OpenAI Format = "openai"
	// Anthropic is the Messages API: POST /v1/messages, named SSE events.
	Anthropic Format = "anthropic"
)

// Reply is what the server does with one request.
type Reply struct {
	// Status, when not 0 or 200, answers with that HTTP status and Body (a
	// provider error object is made from Message when Body is empty).
	Status     int
	Message    string
	Body       string
	RetryAfter string
	// Reset closes the connection without an answer.
	Reset bool
	// FirstDelay is waited before the first chunk (after the headers).
	FirstDelay time.Duration
	// Chunks are streamed in order.
	Chunks []Chunk
	// Repeat streams the last of Chunks again and again, without end,
	// until the client or the server goes away: a model that never stops
	// streaming. A trickle is a Repeat of a small chunk with a Delay; an
	// endless tool call is a fragment with the call's ID and Name followed
	// by an argument fragment to repeat.
	Repeat bool
	// FinishReason, when set, is the finish reason sent at the end of the
	// stream (OpenAI finish_reason, Anthropic stop_reason) in place of the
	// natural one: "length" or "max_tokens" for a reply cut at the token
	// limit.
	FinishReason string
	// ByteDelay writes each chunk's event one byte at a time with this
	// delay between bytes: a stream that trickles bytes without ever
	// completing an event quickly.
	ByteDelay time.Duration
	// Stall stops the stream after StallAfter chunks (0: before the
	// first) and holds the connection open until the client goes away.
	Stall      bool
	StallAfter int
	// StallBeforeHeaders holds the request without sending even headers.
	StallBeforeHeaders bool
	// Truncate ends the body without a finish reason and without [DONE].
	Truncate bool
	// Malformed sends a line of broken JSON after the chunks.
	Malformed bool
	// BadData, when set, is sent after the chunks as one event's data,
	// JSON but not a chunk ("5"; for Anthropic, the data of a
	// content_block_delta event).
	BadData string
	// ErrorEvent, for Anthropic, is the data of an "error" event sent
	// after the chunks in place of the end of the message (how the
	// Messages API reports overloaded_error mid-stream).
	ErrorEvent string
	// usage: the request asked for the usage chunk (stream_options).
	usage bool
}

// Chunk is one streamed event.
type Chunk struct {
	Delay time.Duration
	Text  string
	// Tool is a tool-call fragment: the first fragment of a call carries
	// its ID and Name, later ones more of its Arguments.
	Tool *ToolFragment
	// Tools are more fragments in the same delta, after Tool (OpenAI
	// only): several calls at once, as some compatible servers send them.
	Tools []*ToolFragment
}

// ToolFragment is a piece of a streamed tool call. Index picks the call an
// OpenAI fragment belongs to; Anthropic streams one content block after
// another, so there a fragment with an ID starts a new tool_use block and
// later fragments continue it, whatever their Index.
type ToolFragment struct {
	Index     int
	ID        string
	Name      string
	Arguments string
	// NoIndex leaves "index" out of an OpenAI fragment, as some
	// compatible servers do.
	NoIndex bool
}

// Text returns a reply streaming words as chunks with delay between them.
func Text(text string, delay time.Duration) Reply {
	r := Reply{}
	for _, w := range strings.SplitAfter(text, " ") {
		r.Chunks = append(r.Chunks, Chunk{Delay: delay, Text: w})
	}
	return r
}

// ToolCall returns a reply asking for one tool call, its arguments split
// into fragments of n bytes.
func ToolCall(id, name, args string, n int) Reply {
	r := Reply{}
	r.Chunks = append(r.Chunks, Chunk{Tool: &ToolFragment{ID: id, Name: name}})
	for len(args) > 0 {
		k := min(n, len(args))
		r.Chunks = append(r.Chunks, Chunk{Tool: &ToolFragment{Arguments: args[:k]}})
		args = args[k:]
	}
	return r
}

// Request is a request the server received.
type Request struct {
	Path string
	// Authorization is the Authorization header, or for Anthropic's
	// x-api-key "Bearer " and its value.
	Authorization string
	Model         string
	Body          map[string]any
	// TraceParent is the traceparent header, when the request had one.
	TraceParent string
}

// Server is the fake provider. Its methods are safe for concurrent use.
type Server struct {
	*httptest.Server
	format Format

	mu      sync.Mutex
	replies []Reply
	next    func(n int, r Request) Reply
	reqs    []Request
	gone    []chan struct{}
	window  int // LimitContext, in estimated tokens; 0 is none
	closed  chan struct{}
	once    sync.Once
}

// New starts a server that plays replies in order, then repeats the last.
func New(format Format, replies ...Reply) *Server {
	s := &Server{format: format, replies: replies, closed: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	return s
}

// NewFunc starts a server whose reply to the nth request (from 0) is f's.
func NewFunc(format Format, f func(n int, r Request) Reply) *Server {
	s := &Server{format: format, next: f, closed: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	return s
}

// Close ends stalls and shuts the server down.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closed) })
	s.Server.CloseClientConnections()
	s.Server.Close()
}

// BaseURL returns the base URL a provider is configured with: the server's
// URL and "/v1". The OpenAI SDK appends "/chat/completions" to it; the
// Anthropic provider takes a base URL with or without "/v1" and posts to
// "/v1/messages".
func (s *Server) BaseURL() string { return s.Server.URL + "/v1" }

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Gone returns a channel closed when the client of the nth request has
// gone away (its connection was closed or the request cancelled).
func (s *Server) Gone(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.gone) <= n {
		s.gone = append(s.gone, make(chan struct{}))
	}
	return s.gone[n]
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := Request{Path: r.URL.Path, Authorization: r.Header.Get("Authorization"), TraceParent: r.Header.Get("traceparent")}
	if k := r.Header.Get("X-Api-Key"); k != "" && req.Authorization == "" {
		req.Authorization = "Bearer " + k // Anthropic's x-api-key, in the same form
	}
	_ = json.Unmarshal(body, &req.Body)
	if m, ok := req.Body["model"].(string); ok {
		req.Model = m
	}
	s.mu.Lock()
	n := len(s.reqs)
	s.reqs = append(s.reqs, req)
	for len(s.gone) <= n {
		s.gone = append(s.gone, make(chan struct{}))
	}
	gone := s.gone[n]
	var rep Reply
	switch {
	case s.next != nil:
		s.mu.Unlock()
		rep = s.next(n, req)
		s.mu.Lock()
	case n < len(s.replies):
		rep = s.replies[n]
	case len(s.replies) > 0:
		rep = s.replies[len(s.replies)-1]
	default:
		rep = Text("ok", 0)
	}
	s.mu.Unlock()
	defer close(gone)
	if ref := s.refusal(body, req.Body); ref != nil {
		rep = *ref
	}
	opts, _ := req.Body["stream_options"].(map[string]any)
	rep.usage = opts["include_usage"] == true
	s.play(w, r, rep)
}

// wait waits d, or until the client or the server goes away.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-s.closed:
		return false
	}
}

func (s *Server) hold(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.closed:
	}
}

func (s *Server) play(w http.ResponseWriter, r *http.Request, rep Reply) {
	if rep.Reset {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if rep.StallBeforeHeaders {
		s.hold(r)
		return
	}
	if rep.Status != 0 && rep.Status != http.StatusOK {
		if rep.RetryAfter != "" {
			w.Header().Set("Retry-After", rep.RetryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.Status)
		b := rep.Body
		if b == "" {
			msg, _ := json.Marshal(rep.Message)
			b = fmt.Sprintf(`{"error": {"message": %s, "type": "fake_error", "code": "fake"}}`, msg)
			if s.format == Anthropic {
				b = fmt.Sprintf(`{"type": "error", "error": {"type": %q, "message": %s}}`, anthropicErrorType(rep.Status), msg)
			}
		}
		io.WriteString(w, b)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	flush()
	if rep.FirstDelay > 0 && !s.wait(r, rep.FirstDelay) {
		return
	}
	if s.format == Anthropic {
		s.playAnthropic(w, r, rep, flush)
		return
	}
	hasTools := false
	rendered := make([]string, len(rep.Chunks)) // a Repeat renders each chunk once
	for i, c := range s.sequence(r, rep) {
		if rep.Stall && i >= rep.StallAfter {
			s.hold(r)
			return
		}
		if c.Delay > 0 && i > 0 && !s.wait(r, c.Delay) {
			return
		}
		hasTools = hasTools || c.Tool != nil || len(c.Tools) > 0
		k := min(i, len(rep.Chunks)-1)
		if rendered[k] == "" {
			rendered[k] = "data: " + openAIChunk(c, "") + "\n\n"
		}
		if !s.write(w, r, rep, rendered[k], flush) {
			return
		}
		flush()
	}
	if rep.Repeat {
		return // the client went away
	}
	if rep.Stall {
		s.hold(r)
		return
	}
	if rep.Malformed {
		io.WriteString(w, "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"oops\"\n\n")
		flush()
		return
	}
	if rep.BadData != "" {
		fmt.Fprintf(w, "data: %s\n\n", rep.BadData)
		flush()
		return
	}
	if rep.Truncate {
		return
	}
	finish := "stop"
	if hasTools {
		finish = "tool_calls"
	}
	if rep.FinishReason != "" {
		finish = rep.FinishReason
	}
	fmt.Fprintf(w, "data: %s\n\n", openAIChunk(Chunk{}, finish))
	if rep.usage {
		// As OpenAI sends it: one more chunk, with no choices.
		io.WriteString(w, `data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":1,"model":"fake","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`+"\n\n")
	}
	io.WriteString(w, "data: [DONE]\n\n")
	flush()
}

// write writes one event, a byte at a time when rep trickles, and reports
// whether the client is still there.
func (s *Server) write(w io.Writer, r *http.Request, rep Reply, ev string, flush func()) bool {
	if rep.ByteDelay <= 0 {
		_, err := io.WriteString(w, ev)
		return err == nil
	}
	for i := range len(ev) {
		if _, err := io.WriteString(w, ev[i:i+1]); err != nil {
			return false
		}
		flush()
		if !s.wait(r, rep.ByteDelay) {
			return false
		}
	}
	return true
}

// sequence yields rep's chunks with their place in the stream; with Repeat
// it then yields the last one again and again until the client or the
// server goes away.
func (s *Server) sequence(r *http.Request, rep Reply) iter.Seq2[int, Chunk] {
	return func(yield func(int, Chunk) bool) {
		n := len(rep.Chunks)
		for i := 0; n > 0 && (i < n || rep.Repeat); i++ {
			if rep.Repeat && (r.Context().Err() != nil || s.isClosed()) {
				return
			}
			if !yield(i, rep.Chunks[min(i, n-1)]) {
				return
			}
		}
	}
}

func (s *Server) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// openAIChunk renders one chat.completion.chunk.
func openAIChunk(c Chunk, finish string) string {
	delta := map[string]any{}
	if c.Text != "" {
		delta["content"] = c.Text
	}
	var tcs []any
	for _, t := range append([]*ToolFragment{c.Tool}, c.Tools...) {
		if t == nil {
			continue
		}
		tc := map[string]any{"function": map[string]any{"arguments": t.Arguments}}
		if !t.NoIndex {
			tc["index"] = t.Index
		}
		if t.ID != "" {
			tc["id"] = t.ID
			tc["type"] = "function"
		}
		if t.Name != "" {
			tc["function"].(map[string]any)["name"] = t.Name
		}
		tcs = append(tcs, tc)
	}
	if tcs != nil {
		delta["tool_calls"] = tcs
	}
	choice := map[string]any{"index": 0, "delta": delta, "finish_reason": nil}
	if finish != "" {
		choice["finish_reason"] = finish
	}
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk",
		"created": 1700000000, "model": "fake", "choices": []any{choice}})
	return string(b)
}
