// Package script is the deterministic model provider: it plays a JSONL
// script of replies with their timings (spec §15). It stands in for a real
// model in the demo and in tests, and replays an incident recorded from a
// live model offline.
package script

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/timebox-run/timebox/internal/regular"
	"github.com/timebox-run/timebox/model"
)

// Line is one scripted reply: one model call consumes one line.
type Line struct {
	// Text is the reply's text; Chunks is the same as a list of stream
	// chunks. Text without Chunks is streamed word by word.
	Text   string   `json:"text,omitempty"`
	Chunks []string `json:"chunks,omitempty"`
	// FirstChunkDelay is waited before the first chunk, ChunkDelay before
	// each later one.
	FirstChunkDelay Duration `json:"first_chunk_delay,omitempty"`
	ChunkDelay      Duration `json:"chunk_delay,omitempty"`
	// StallAfter, when set, makes the stream go silent forever after that
	// many chunks (0: before the first), to exercise llm_first_chunk and
	// llm_idle.
	StallAfter *int `json:"stall_after,omitempty"`
	// ToolCalls are the calls the reply asks for.
	ToolCalls []Call `json:"tool_calls,omitempty"`
	// Error makes the call fail as a provider would.
	Error *Failure `json:"error,omitempty"`
	// Compaction marks a line that answers history-compaction calls (its
	// text is the summary) instead of the turn's own calls. Compaction
	// calls play the compaction lines in order and ordinary calls skip
	// them; a script without any is answered with a short deterministic
	// summary, so compaction never takes a reply meant for the turn.
	Compaction bool `json:"compaction,omitempty"`
	// ExpectInRequest are texts the request the line answers must
	// contain, anywhere in what the model is sent (system prompt, tool
	// names and descriptions, messages, tool call arguments, the time
	// note). A text that is absent fails the call as a provider's 400
	// naming it, so that the turn stops model_rejected: a test or an
	// incident replay checks what the model was told.
	ExpectInRequest []string `json:"expect_in_request,omitempty"`
}

// Call is a scripted tool call. Arguments is any JSON value; a JSON string
// is sent as the raw argument text, which lets a script send arguments that
// are not JSON.
type Call struct {
	// Name is the tool's name; required.
	Name string `json:"name"`
	// Arguments are the call's arguments; absent sends {}.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// At is where the call's name is written in the script it was read
	// from (Parse), to place a problem with it; zero for a call made in
	// code.
	At Pos `json:"-"`
}

// Failure is a scripted provider failure.
type Failure struct {
	// Status is the HTTP status, or 0 for a connection failure.
	Status int `json:"status"`
	// Message is the provider's reason.
	Message string `json:"message"`
	// RetryAfter (retry_after) is the provider's Retry-After; 0 for none.
	RetryAfter Duration `json:"retry_after,omitempty"`
}

// Duration is a time.Duration written in Go syntax ("50ms").
type Duration time.Duration

// UnmarshalJSON reads "50ms"; null leaves d as it is.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string like \"50ms\"")
	}
	v, problem := parseDuration(s)
	if problem != "" {
		return errors.New(problem)
	}
	*d = v
	return nil
}

// MarshalJSON writes "50ms".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Provider plays a script. Each conversation (model.Request.Conversation)
// has its own place in the script; after the last line it starts again from
// the first. It is safe for concurrent use.
type Provider struct {
	lines []Line
	// replies and summaries index lines: the turn's replies and the
	// compaction lines, each played in order.
	replies, summaries []int

	mu          sync.Mutex
	next        map[string]int
	nextSummary map[string]int
}

// New returns a provider that plays lines. It returns an error if there are
// no lines other than compaction lines.
func New(lines []Line) (*Provider, error) {
	if len(lines) == 0 {
		return nil, fmt.Errorf("script: no lines")
	}
	p := &Provider{lines: lines, next: map[string]int{}, nextSummary: map[string]int{}}
	for i, l := range lines {
		if l.Compaction {
			p.summaries = append(p.summaries, i)
		} else {
			p.replies = append(p.replies, i)
		}
	}
	if len(p.replies) == 0 {
		return nil, fmt.Errorf("script: every line is a compaction line; add a reply for the turn")
	}
	return p, nil
}

// Load reads a JSONL script file. Errors name the file and line. The file
// must be a regular file: a FIFO or a device is an error at once, never a
// read that blocks or does not end.
func Load(path string) (*Provider, error) {
	lines, err := ParseFile(path, path)
	if err != nil {
		return nil, err
	}
	return New(lines)
}

// ParseFile reads the lines of the script file at path, named name in
// errors, as Parse does. The file must be a regular file, which is opened
// without blocking (internal/regular).
func ParseFile(path, name string) ([]Line, error) {
	f, err := regular.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(f, name)
}

// maxLine is the longest line a script may have.
const maxLine = 16 << 20

// Parse reads JSONL script lines from r; blank lines and lines starting with
// "//" are skipped. name is used in errors. It reads every line: the
// problems of the script (every one, each placed at its line and column,
// with the field and a fix) come back together as ParseErrors.
func Parse(r io.Reader, name string) ([]Line, error) {
	var lines []Line
	var problems ParseErrors
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if n == 1 {
			line = regular.TrimBOM(line)
		}
		raw := bytes.TrimSpace(line)
		if len(raw) == 0 || bytes.HasPrefix(raw, []byte("//")) {
			continue
		}
		l, ps := parseLine(name, n, line, raw)
		problems = append(problems, ps...)
		if len(ps) == 0 {
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		problems = append(problems, &ParseError{File: name, Line: n + 1, Col: 1,
			Msg: fmt.Sprintf("the line is longer than %d MiB, the longest a script line may be (one reply per line)", maxLine>>20)})
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(problems) > 0 {
		problems.Sort()
		return nil, problems
	}
	return lines, nil
}

// Stream plays the conversation's next line: its next compaction line for
// a compaction call (req.Compaction), its next other line otherwise.
func (p *Provider) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	order, next := p.replies, p.next
	if req.Compaction {
		if len(p.summaries) == 0 {
			return &stream{ctx: ctx, chunks: []string{Summary(req)}}, nil
		}
		order, next = p.summaries, p.nextSummary
	}
	p.mu.Lock()
	k := next[req.Conversation]
	next[req.Conversation] = (k + 1) % len(order)
	p.mu.Unlock()
	i := order[k]
	l := p.lines[i]
	if missing := absent(l.ExpectInRequest, req); missing != "" {
		return nil, &model.Error{Provider: "script", Status: 400, Message: fmt.Sprintf(
			"script line %d: expect_in_request: the request does not contain %q", i+1, missing)}
	}
	if l.Error != nil {
		if err := sleep(ctx, time.Duration(l.FirstChunkDelay)); err != nil {
			return nil, err
		}
		return nil, &model.Error{Provider: "script", Status: l.Error.Status, Message: l.Error.Message,
			RetryAfter: time.Duration(l.Error.RetryAfter), TooLong: model.IsTooLong(l.Error.Status, l.Error.Message)}
	}
	chunks := l.Chunks
	if len(chunks) == 0 && l.Text != "" {
		chunks = words(l.Text)
	}
	s := &stream{ctx: ctx, line: l, chunks: chunks}
	for j, c := range l.ToolCalls {
		args := string(c.Arguments)
		var str string
		if json.Unmarshal(c.Arguments, &str) == nil {
			args = str
		}
		if args == "" {
			args = "{}"
		}
		s.calls = append(s.calls, model.ToolCall{ID: fmt.Sprintf("call_%d_%d", i+1, j+1), Name: c.Name, Arguments: args})
	}
	return s, nil
}

// place is a conversation's place in the script, for Suspend and Resume.
type place struct {
	Next    int `json:"next"`
	Summary int `json:"summary"`
}

// Suspend implements model.Resumable: the conversation's place in the
// script.
func (p *Provider) Suspend(conversation string) json.RawMessage {
	p.mu.Lock()
	pl := place{Next: p.next[conversation], Summary: p.nextSummary[conversation]}
	p.mu.Unlock()
	b, _ := json.Marshal(pl)
	return b
}

// Resume implements model.Resumable: the conversation goes on from a
// place Suspend returned, here or in another process playing the same
// script.
func (p *Provider) Resume(conversation string, state json.RawMessage) {
	var pl place
	if json.Unmarshal(state, &pl) != nil || pl.Next < 0 || pl.Summary < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next[conversation] = pl.Next % len(p.replies)
	if len(p.summaries) > 0 {
		p.nextSummary[conversation] = pl.Summary % len(p.summaries)
	}
}

// summaryHead is how much of the transcript a deterministic summary
// quotes.
const summaryHead = 160

// Summary returns the script provider's answer to a compaction call when
// the script has no compaction line: one short line that depends only on
// the request, so that a compacted history stays small and a replay is
// exact.
func Summary(req model.Request) string {
	var text strings.Builder
	for _, m := range req.Messages {
		text.WriteString(m.Content)
	}
	all := strings.Join(strings.Fields(text.String()), " ")
	head := all
	if len(head) > summaryHead {
		head = strings.ToValidUTF8(head[:summaryHead], "") + "…"
	}
	return fmt.Sprintf("(script model summary of %d bytes of earlier conversation) %s", text.Len(), head)
}

type stream struct {
	ctx    context.Context
	line   Line
	chunks []string
	calls  []model.ToolCall
	sent   int
	text   strings.Builder
	done   bool
}

// Recv plays the next chunk with its delay. Tool calls come as one last
// chunk after the text.
func (s *stream) Recv() (model.Chunk, error) {
	if s.done {
		return model.Chunk{}, io.EOF
	}
	total := len(s.chunks)
	if len(s.calls) > 0 {
		total++
	}
	if s.line.StallAfter != nil && s.sent >= *s.line.StallAfter {
		<-s.ctx.Done()
		return model.Chunk{}, context.Cause(s.ctx)
	}
	if s.sent >= total {
		s.done = true
		return model.Chunk{}, io.EOF
	}
	d := s.line.ChunkDelay
	if s.sent == 0 {
		d = s.line.FirstChunkDelay
	}
	if err := sleep(s.ctx, time.Duration(d)); err != nil {
		return model.Chunk{}, err
	}
	var c model.Chunk
	if s.sent < len(s.chunks) {
		c.Text = s.chunks[s.sent]
		s.text.WriteString(c.Text)
	}
	s.sent++
	return c, nil
}

// Response returns the text streamed and the line's tool calls, with
// finish reason tool_calls when there are any, else stop.
func (s *stream) Response() model.Response {
	r := model.Response{Text: s.text.String(), ToolCalls: s.calls, FinishReason: "stop"}
	if len(s.calls) > 0 {
		r.FinishReason = "tool_calls"
	}
	return r
}

// Close does nothing: a scripted stream has nothing to release.
func (s *stream) Close() error { return nil }

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// words splits text into stream chunks of one word each, spaces kept.
func words(text string) []string {
	var out []string
	start := 0
	for i := 1; i < len(text); i++ {
		if text[i] == ' ' && text[i-1] != ' ' {
			out = append(out, text[start:i])
			start = i
		}
	}
	return append(out, text[start:])
}

// absent returns the first of texts that req does not contain, or "".
func absent(texts []string, req model.Request) string {
	if len(texts) == 0 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString(req.System)
	for _, d := range req.Tools {
		sb.WriteString("\n" + d.Name + "\n" + d.Description)
	}
	for _, m := range req.Messages {
		sb.WriteString("\n" + m.Content)
		for _, c := range m.ToolCalls {
			sb.WriteString("\n" + c.Name + "\n" + c.Arguments)
		}
	}
	sb.WriteString("\n" + req.TimeNote)
	all := sb.String()
	for _, t := range texts {
		if !strings.Contains(all, t) {
			return t
		}
	}
	return ""
}
