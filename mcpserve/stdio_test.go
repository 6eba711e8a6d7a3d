package mcpserve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/mcpserve"
	"github.com/timebox-run/timebox/tool"
)

// TestStdioAnswersWhatIsNoMessage: on stdio, a line that is not JSON, or
// JSON that is no JSON-RPC message, or a line past the longest one read
// (skipped, not held), is answered with a JSON-RPC error (id
// null, or the request's id when it can be read) and the session goes on:
// the initialize after them is answered. With the SDK's transport alone,
// the first bad line ended the session (timebox mcp serve exited 1).
func TestStdioAnswersWhatIsNoMessage(t *testing.T) {
	defer mcpserve.SetMaxLine(1 << 10)() // undone once the server is gone
	s, err := mcpserve.New(nil, mcpserve.Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, mcpserve.Stdio(inR, outW, nil)) }()
	defer func() {
		cancel()
		inW.Close()
		outR.Close()
		<-served
	}()
	go io.WriteString(inW, "garbage\n5\n\n"+`{"jsonrpc": "2.0", "id": 7, "method": 5}`+"\n"+strings.Repeat("x", 5000)+"\n"+
		`{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}`+"\n")
	type reply struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
		Result json.RawMessage `json:"result"`
	}
	sc := bufio.NewScanner(outR)
	var got []string
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("not JSON-RPC: %s", sc.Text())
		}
		switch {
		case r.Error != nil:
			got = append(got, string(r.ID)+":"+map[int]string{-32700: "parse", -32600: "invalid"}[r.Error.Code])
		case len(r.Result) > 0:
			got = append(got, string(r.ID)+":result")
		}
		if len(got) == 5 {
			break
		}
	}
	if want := "null:parse null:invalid 7:invalid null:parse 1:result"; strings.Join(got, " ") != want {
		t.Fatalf("answers %q, want %q", strings.Join(got, " "), want)
	}
}

// TestToolsThatNeedApprovalAreNotServed: a tool whose calls may need a
// person's approval is refused by New (a client would run it unasked), and
// Servable leaves it out, naming it.
func TestToolsThatNeedApprovalAreNotServed(t *testing.T) {
	ok := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil }
	free := agent.Tool{Tool: tool.NewFunc("free", "d", nil, ok)}
	asks := agent.Tool{Tool: tool.NewFunc("delete_all", "d", nil, ok), NeedsApproval: agent.ApprovalRequired}
	if _, err := mcpserve.New([]agent.Tool{free, asks}, mcpserve.Options{}); err == nil || !strings.Contains(err.Error(), "tool delete_all: its calls may need a person's approval") {
		t.Errorf("New: %v", err)
	}
	served, left := mcpserve.Servable([]agent.Tool{free, asks})
	if len(served) != 1 || served[0].Tool.Spec().Name != "free" || len(left) != 1 || left[0] != "delete_all" {
		t.Errorf("Servable: %d served, left %v", len(served), left)
	}
	if _, err := mcpserve.New(served, mcpserve.Options{}); err != nil {
		t.Errorf("New of the servable tools: %v", err)
	}
}

// TestNewChecksEachToolAsAgentNewDoes: a tool agent.New would refuse
// (agent.Tool.Check: no function, a budget the agent file would refuse)
// is refused by New too, not found out at a client's call.
func TestNewChecksEachToolAsAgentNewDoes(t *testing.T) {
	ok := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil }
	for _, c := range []struct {
		t    agent.Tool
		want string
	}{
		{agent.Tool{}, "mcpserve: a tool entry has no Tool"},
		{agent.Tool{Tool: tool.NewFunc("f", "d", nil, nil)}, "mcpserve: tool f: the tool has no function"},
		{agent.Tool{Tool: tool.NewFunc("f", "d", nil, ok), Budget: budget.ToolBudget{Timeout: budget.Duration{D: -time.Second}}}, "mcpserve: tool f: Budget.Timeout -1s is negative"},
	} {
		if _, err := mcpserve.New([]agent.Tool{c.t}, mcpserve.Options{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New: %v, want %q", err, c.want)
		}
	}
}

// eofReader closes eof once r has said io.EOF.
type eofReader struct {
	r    io.Reader
	eof  chan struct{}
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}

// stdioSession serves tools on a stdio transport whose input is lines, and
// whose reader of the output may go (outGone); eof is closed once the
// input has ended. It returns the answers'
// ids in the order written, and Serve's error, once Serve has returned.
func stdioSession(t *testing.T, tools []agent.Tool, lines []string, eof, outGone chan struct{}) (ids []string, err error) {
	t.Helper()
	answers, err := stdioLines(t, tools, lines, eof, outGone)
	for _, a := range answers {
		var r struct {
			ID json.RawMessage `json:"id"`
		}
		json.Unmarshal([]byte(a), &r)
		ids = append(ids, string(r.ID))
	}
	return ids, err
}

// stdioLines is stdioSession giving the lines the session wrote whole.
func stdioLines(t *testing.T, tools []agent.Tool, lines []string, eof, outGone chan struct{}) (answers []string, err error) {
	t.Helper()
	s, err := mcpserve.New(tools, mcpserve.Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	in := &eofReader{r: strings.NewReader(strings.Join(lines, "\n") + "\n"), eof: eof}
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- s.Serve(context.Background(), mcpserve.Stdio(in, outW, outGone))
		outW.Close()
	}()
	sc := bufio.NewScanner(outR)
	for sc.Scan() {
		answers = append(answers, sc.Text())
	}
	select {
	case err = <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the end of its input")
	}
	return answers, err
}

const (
	initialize  = `{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}`
	initialized = `{"jsonrpc": "2.0", "method": "notifications/initialized"}`
)

func waitingTool(name string, f func(ctx context.Context) (any, error)) agent.Tool {
	return agent.Tool{Tool: tool.NewFunc(name, "d", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) { return f(ctx) }),
		Budget: budget.ToolBudget{Timeout: budget.Duration{D: time.Minute, Source: budget.SourceDefault}, Enforcement: budget.Cooperative}}
}

// TestStdioAnswersWhatWasReadBeforeTheEnd: a client that writes its
// requests and closes its side (a shell pipeline) gets every answer, a
// call still running at the end of the input included, and Serve returns
// nil then. The SDK's transport ended the session at the end of the
// input, and nothing read but unanswered was answered.
func TestStdioAnswersWhatWasReadBeforeTheEnd(t *testing.T) {
	eof := make(chan struct{})
	slow := waitingTool("slow", func(context.Context) (any, error) {
		<-eof // the input has ended before the call answers
		return "slow done", nil
	})
	ids, err := stdioSession(t, []agent.Tool{slow}, []string{initialize, initialized,
		`{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}`,
		`{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}`}, eof, nil)
	if err != nil {
		t.Errorf("Serve: %v", err)
	}
	slices.Sort(ids)
	if got := strings.Join(ids, " "); got != "1 2 3" {
		t.Errorf("answers to %q, want to 1 2 3 (every request, the slow call's too)", got)
	}
}

// TestStdioStopsCallsWhenTheOutputsReaderIsGone: after the end of the
// input, a call still running is stopped as the client gone when the
// reader of the output goes away: its answer could not be read.
func TestStdioStopsCallsWhenTheOutputsReaderIsGone(t *testing.T) {
	eof := make(chan struct{})
	gone := make(chan struct{})
	cause := make(chan error, 1)
	hang := waitingTool("hang", func(ctx context.Context) (any, error) {
		<-eof
		close(gone)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	ids, err := stdioSession(t, []agent.Tool{hang}, []string{initialize, initialized,
		`{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "hang", "arguments": {}}}`}, eof, gone)
	if err != nil {
		t.Errorf("Serve: %v", err)
	}
	if got := strings.Join(ids, " "); got != "1" {
		t.Errorf("answers to %q, want to 1 only", got)
	}
	select {
	case c := <-cause:
		var ce *budget.CancelError
		if !errors.As(c, &ce) || ce.Reason != budget.ClientGone {
			t.Errorf("the call was stopped by %v, want client_gone", c)
		}
	default:
		t.Error("the call never ran")
	}
}
