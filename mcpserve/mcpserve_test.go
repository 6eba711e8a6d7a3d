//go:build linux

package mcpserve_test

// The server driven by the MCP SDK's own client over its in-memory
// transport, with real exec tools (shell scripts) built from an agent file
// by timebox.Build, as `timebox mcp serve` builds them. The stdio test of
// the built binary is internal/cli's TestMCPServeStdio.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/mcpserve"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { proctree.Close(); os.Exit(code) }))
}

// agentFile is the agent file of every test: its model is never called.
const agentFile = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms}
tools:
  - name: fast
    description: Answers at once.
    exec: [./fast.sh]
  - name: echo
    description: Echoes its text.
    input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
    exec: [./echo.sh]
    timeout: 10s
  - name: fail
    exec: [./fail.sh]
  - name: progress
    exec: [./progress.sh]
  - name: hang
    description: Never finishes, and ignores SIGTERM.
    exec: [./hang.sh]
    timeout: 1s
  - name: chatty_hang
    exec: [./chatty.sh]
    timeout: 1s
  - name: slow_hang
    exec: [./hang.sh]
    timeout: 5m
  - name: quiet
    exec: [./hang.sh]
    timeout: 10s
    idle_timeout: 300ms
  - name: overrun
    exec: [./overrun.sh]
    timeout: 200ms
    enforcement: advisory
`

// scripts are the tools. hang.sh ignores SIGTERM, leaves a child in a
// session of its own and writes both pids to "pids" in its working
// directory (the test's), so that the test can check both are gone.
var scripts = map[string]string{
	"fast.sh":     "#!/bin/sh\ncat >/dev/null\necho '{\"ok\": true}'\n",
	"echo.sh":     "#!/bin/sh\ncat\n",
	"fail.sh":     "#!/bin/sh\ncat >/dev/null\necho partial\necho 'boom: connection refused' >&2\nexit 3\n",
	"progress.sh": "#!/bin/sh\ncat >/dev/null\nfor i in 1 2 3; do echo \"::progress:: {\\\"progress\\\": $i, \\\"total\\\": 3, \\\"message\\\": \\\"step $i\\\"}\" >&2; sleep 0.15; done\necho '::progress:: almost there' >&2\nsleep 0.15\necho done\n",
	"hang.sh":     "#!/bin/sh\ncat >/dev/null\ntrap '' TERM\nsetsid sleep 300 &\necho $! >> pids\necho $$ >> pids\nwhile true; do sleep 1; done\n",
	"overrun.sh":  "#!/bin/sh\ncat >/dev/null\nsleep 0.5\necho finished\n",
	"chatty.sh":   "#!/bin/sh\ncat >/dev/null\ni=0\nwhile true; do i=$((i+1)); echo \"::progress:: {\\\"progress\\\": $i}\" >&2; sleep 0.05; done\n",
}

type harness struct {
	dir      string
	cs       *mcp.ClientSession
	finished chan mcpserve.Finished

	mu       sync.Mutex
	progress []*mcp.ProgressNotificationParams
}

func (h *harness) notes() []*mcp.ProgressNotificationParams {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams(nil), h.progress...)
}

// openAgent writes the agent file and its tools' scripts to a directory
// of the test's and opens the agent, closed when the test ends.
func openAgent(t *testing.T) (dir string, a *timebox.Agent) {
	t.Helper()
	dir = t.TempDir()
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "unused"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(agentFile), 0o644)
	a, err := timebox.Open(context.Background(), filepath.Join(dir, "agent.yaml"), timebox.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return dir, a
}

// start loads the agent file, builds its tools as timebox.Build does for a
// turn, and connects an SDK client to the server over in-memory
// transports.
func start(t *testing.T) *harness {
	t.Helper()
	proctest.AfterTest(t)
	dir := t.TempDir()
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "unused"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(agentFile), 0o644)
	cfg, err := config.Load(filepath.Join(dir, "agent.yaml"), config.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := timebox.Build(context.Background(), cfg, timebox.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	h := &harness{dir: dir, finished: make(chan mcpserve.Finished, 16)}
	s, err := mcpserve.New(a.Tools(), mcpserve.Options{Version: "test", MaxOutput: a.Limits().MaxToolOutput.N,
		OnFinished: func(f mcpserve.Finished) { h.finished <- f }})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, st) }()
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			h.mu.Lock()
			h.progress = append(h.progress, r.Params)
			h.mu.Unlock()
		},
	})
	cs, err := client.Connect(ctx, ct, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h.cs = cs
	t.Cleanup(func() {
		cs.Close()
		cancel()
		if err := <-served; err != nil && err != context.Canceled {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

func call(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name, args string, token any) (*mcp.CallToolResult, error) {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)}
	if token != nil {
		p.SetProgressToken(token)
	}
	return cs.CallTool(ctx, p)
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// errorBody is the {"error": ...} result the model gets.
type errorBody struct {
	Error struct {
		Type, Tool, Phase, Limit, Source, Knob, Message, Reason, Field string
		StderrTail                                                     string `json:"stderr_tail"`
		PartialOutput                                                  string `json:"partial_output"`
	} `json:"error"`
}

func parseError(t *testing.T, s string) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal([]byte(s), &e); err != nil {
		t.Fatalf("result is not an error object: %v\n%s", err, s)
	}
	return e
}

func finished(t *testing.T, h *harness, within time.Duration) mcpserve.Finished {
	t.Helper()
	select {
	case f := <-h.finished:
		return f
	case <-time.After(within):
		t.Fatalf("no call finished within %v", within)
		return mcpserve.Finished{}
	}
}

// The tool list: every exec tool with its description, its input schema
// (an object schema when the file gives none) and its budget in _meta.
func TestListTools(t *testing.T) {
	h := start(t)
	res, err := h.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	var names []string
	for _, tl := range res.Tools {
		got[tl.Name] = tl
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "chatty_hang,echo,fail,fast,hang,overrun,progress,quiet,slow_hang" {
		t.Fatalf("tools: %v", names)
	}
	schema := func(name string) map[string]any {
		b, _ := json.Marshal(got[name].InputSchema)
		var m map[string]any
		json.Unmarshal(b, &m)
		return m
	}
	if d := got["fast"].Description; d != "Answers at once." {
		t.Errorf("fast: description %q", d)
	}
	if s := schema("fast"); len(s) != 1 || s["type"] != "object" {
		t.Errorf("fast: input schema %v, want a permissive object schema", s)
	}
	if s := schema("echo"); s["type"] != "object" || s["properties"] == nil || s["required"] == nil {
		t.Errorf("echo: input schema %v, want the file's", s)
	}
	meta, _ := got["hang"].Meta["timebox/budget"].(map[string]any)
	if meta["timeout_ms"] != float64(1000) || meta["timeout_source"] != "tool" || meta["enforcement"] != "hard" ||
		meta["kill_grace_ms"] != float64(500) || meta["knob"] != "tools[hang].timeout in agent.yaml" {
		t.Errorf("hang: _meta %v", got["hang"].Meta)
	}
	if meta, _ := got["fast"].Meta["timebox/budget"].(map[string]any); meta["timeout_ms"] != float64(60000) || meta["timeout_source"] != "default" {
		t.Errorf("fast: _meta %v, want the default timeout", got["fast"].Meta)
	}
}

func TestFastToolAnswers(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "fast", `{}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.IsError || strings.TrimSpace(text(r)) != `{"ok": true}` {
		t.Fatalf("isError %v, %q", r.IsError, text(r))
	}
	f := finished(t, h, 5*time.Second)
	if f.Execution.Outcome != event.OutcomeOK || f.Budget.Timeout.D != time.Minute || f.Budget.Timeout.Source != budget.SourceDefault {
		t.Errorf("outcome %s, budget %+v", f.Execution.Outcome, f.Budget.Timeout)
	}
	// The exec tool read its input: the arguments the client sent.
	r, err = call(t, context.Background(), h.cs, "echo", `{"text": "hi"}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var in struct {
		Tool   string          `json:"tool"`
		CallID string          `json:"call_id"`
		Input  json.RawMessage `json:"input"`
		MS     int64           `json:"timeout_ms"`
	}
	if err := json.Unmarshal([]byte(text(r)), &in); err != nil || r.IsError || in.Tool != "echo" || string(in.Input) != `{"text":"hi"}` || in.MS != 10000 {
		t.Fatalf("echo answered %q (isError %v)", text(r), r.IsError)
	}
	if f := finished(t, h, 5*time.Second); f.CallID != in.CallID {
		t.Errorf("call id %q, the tool read %q", f.CallID, in.CallID)
	}
}

// Arguments that fail the schema are refused as the agent refuses them:
// a tool_error result naming the field, the tool not run.
func TestInvalidArgumentsAreRefused(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "echo", `{"text": 3}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := parseError(t, text(r))
	if !r.IsError || e.Error.Type != "tool_error" || e.Error.Reason != "invalid_arguments" || e.Error.Field != "/text" ||
		!strings.Contains(e.Error.Message, "The tool was not run.") {
		t.Fatalf("isError %v: %s", r.IsError, text(r))
	}
	select {
	case f := <-h.finished:
		t.Errorf("a refused call ran: %+v", f)
	default:
	}
}

// A failing tool answers isError with the tool_error the model gets.
func TestToolErrorIsAResult(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "fail", `{}`, nil)
	if err != nil {
		t.Fatalf("a tool error became a protocol error: %v", err)
	}
	f := finished(t, h, 5*time.Second)
	e := parseError(t, text(r))
	if !r.IsError || text(r) != f.Result || f.Execution.Outcome != event.OutcomeError || e.Error.Type != "tool_error" ||
		!strings.Contains(e.Error.StderrTail, "boom: connection refused") || !strings.Contains(e.Error.PartialOutput, "partial") {
		t.Fatalf("isError %v, outcome %s: %s", r.IsError, f.Execution.Outcome, text(r))
	}
}

// A hung tool with timeout: 1s, which ignores SIGTERM and left a child in
// a session of its own, answers isError with the tool_timeout text after
// its timeout plus kill_grace, and leaves no process behind.
func TestHungToolTimesOut(t *testing.T) {
	h := start(t)
	began := time.Now()
	r, err := call(t, context.Background(), h.cs, "hang", `{}`, nil)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("a timeout became a protocol error: %v", err)
	}
	f := finished(t, h, time.Second)
	e := parseError(t, text(r))
	if !r.IsError || text(r) != f.Result || f.Execution.Outcome != event.OutcomeTimedOut || e.Error.Type != "tool_timeout" ||
		e.Error.Tool != "hang" || e.Error.Limit != "1s" || e.Error.Phase != "tool" || e.Error.Source != "tool" ||
		e.Error.Knob != "tools[hang].timeout in agent.yaml" || !strings.Contains(e.Error.Message, `Tool "hang" did not finish within 1s and was stopped.`) {
		t.Fatalf("isError %v, outcome %s: %s", r.IsError, f.Execution.Outcome, text(r))
	}
	// 1s, then SIGTERM (ignored), then SIGKILL after 500ms.
	if took < time.Second || took > 6*time.Second {
		t.Errorf("answered after %v, want about 1.5s", took)
	}
	checkDead(t, h.dir)
}

// checkDead checks that every pid the hang script wrote is gone.
func checkDead(t *testing.T, dir string) {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	pids := strings.Fields(string(b))
	if len(pids) < 2 {
		t.Fatalf("the tool wrote pids %q", pids)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("process %s of the call is still alive", p)
		}
	}
}

// alive reports whether pid is a live process (a zombie is not).
func alive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] != 'Z'
}

// Progress reports reach the client as notifications/progress on its
// token, with a value that always increases; none follows the answer.
func TestProgressFlowsUpstream(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "progress", `{}`, "tok-1")
	if err != nil || r.IsError || strings.TrimSpace(text(r)) != "done" {
		t.Fatalf("%v: %v %q", err, r != nil && r.IsError, text(r))
	}
	f := finished(t, h, 5*time.Second)
	// The client handles notifications on a goroutine of its own: the last
	// may still be on its way when the answer is in.
	deadline := time.Now().Add(5 * time.Second)
	for len(h.notes()) < f.Execution.Progress && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	notes := h.notes()
	if f.Execution.Progress != 4 || len(notes) != 4 {
		t.Fatalf("%d reports, %d notifications: %+v", f.Execution.Progress, len(notes), notes)
	}
	for i, n := range notes {
		if n.ProgressToken != "tok-1" {
			t.Errorf("notification %d: token %v", i, n.ProgressToken)
		}
		if i > 0 && n.Progress <= notes[i-1].Progress {
			t.Errorf("notification %d: progress %v after %v", i, n.Progress, notes[i-1].Progress)
		}
	}
	if n := notes[0]; n.Progress != 1 || n.Total != 3 || n.Message != "step 1" {
		t.Errorf("first: %+v", n)
	}
	if n := notes[2]; n.Progress != 3 || n.Total != 3 || n.Message != "step 3" {
		t.Errorf("third: %+v", n)
	}
	// A report without a number goes up by one, without a total.
	if n := notes[3]; n.Progress != 4 || n.Total != 0 || n.Message != "almost there" {
		t.Errorf("last: %+v", n)
	}
	// Without a token, no notification.
	if _, err := call(t, context.Background(), h.cs, "progress", `{}`, nil); err != nil {
		t.Fatal(err)
	}
	finished(t, h, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	if n := len(h.notes()); n != 4 {
		t.Errorf("%d notifications after a call without a token", n)
	}
}

// A tool that reports progress until its timeout stops it: the
// notifications stop with it.
func TestProgressStopsWithTheTool(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "chatty_hang", `{}`, 7)
	if err != nil || !r.IsError || parseError(t, text(r)).Error.Type != "tool_timeout" {
		t.Fatalf("%v: %s", err, text(r))
	}
	finished(t, h, time.Second)
	time.Sleep(100 * time.Millisecond) // the client's handler goroutine
	n := len(h.notes())
	if n < 5 {
		t.Errorf("only %d notifications in a second of reports every 50ms", n)
	}
	for _, p := range h.notes() {
		if p.ProgressToken != float64(7) && p.ProgressToken != int64(7) && p.ProgressToken != 7 {
			t.Fatalf("token %v (%T)", p.ProgressToken, p.ProgressToken)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if m := len(h.notes()); m != n {
		t.Errorf("%d notifications after the call ended", m-n)
	}
}

// A client's cancellation (notifications/cancelled, sent by the SDK when
// the call's context is cancelled) stops a hung call's whole tree within
// the cancel grace (min(kill_grace, budget.CancelGrace)) plus a margin;
// the call ends cancelled, not timed out.
func TestClientCancelStopsTheTree(t *testing.T) {
	h := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := call(t, ctx, h.cs, "slow_hang", `{}`, nil)
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(h.dir, "pids"))
		if strings.Count(string(b), "\n") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("the tool never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancelled := time.Now()
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled call answered")
	}
	f := finished(t, h, 5*time.Second)
	took := time.Since(cancelled)
	ce, _ := budget.AsCancel(f.Execution.Cause)
	if f.Execution.Outcome != event.OutcomeCancelled || ce == nil || ce.Reason != budget.Cancelled ||
		parseError(t, f.Result).Error.Type != "tool_cancelled" {
		t.Fatalf("outcome %s, cause %v: %s", f.Execution.Outcome, f.Execution.Cause, f.Result)
	}
	if grace := min(500*time.Millisecond, budget.CancelGrace); took > grace+2*time.Second {
		t.Errorf("the call ended %v after the cancel, want within %v and a margin", took, grace)
	}
	checkDead(t, h.dir)
}

// The other budgets of a tool apply as in a turn: idle_timeout stops a
// silent call (phase tool_idle, naming its knob); an advisory tool is
// never stopped by its own timeout, and its result is answered.
func TestIdleAndAdvisoryBudgets(t *testing.T) {
	h := start(t)
	r, err := call(t, context.Background(), h.cs, "quiet", `{}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := finished(t, h, time.Second)
	e := parseError(t, text(r))
	if !r.IsError || f.Execution.Outcome != event.OutcomeTimedOut || e.Error.Type != "tool_timeout" || e.Error.Phase != "tool_idle" ||
		e.Error.Limit != "300ms" || e.Error.Knob != "tools[quiet].idle_timeout in agent.yaml" || f.Execution.Elapsed() > 5*time.Second {
		t.Fatalf("quiet: isError %v after %v: %s", r.IsError, f.Execution.Elapsed(), text(r))
	}
	checkDead(t, h.dir)

	r, err = call(t, context.Background(), h.cs, "overrun", `{}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	f = finished(t, h, time.Second)
	if r.IsError || strings.TrimSpace(text(r)) != "finished" || f.Execution.Outcome != event.OutcomeOK || !f.Execution.Overran {
		t.Fatalf("overrun: isError %v, outcome %s, overran %v: %s", r.IsError, f.Execution.Outcome, f.Execution.Overran, text(r))
	}
}

// When Serve's context ends (timebox mcp serve's SIGTERM), a running call
// is stopped as a shutdown, its tree gone, before Serve returns.
func TestServeEndStopsRunningCalls(t *testing.T) {
	proctest.AfterTest(t)
	dir, a := openAgent(t)
	fin := make(chan mcpserve.Finished, 1)
	s, err := mcpserve.New(a.Tools(), mcpserve.Options{OnFinished: func(f mcpserve.Finished) { fin <- f }})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow_hang", Arguments: map[string]any{}})
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(readPids(dir), "\n") < 2 {
		if time.Now().After(deadline) {
			stop()
			t.Fatal("the tool never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	select {
	case err := <-served:
		if err != context.Canceled {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	f := <-fin
	if ce, _ := budget.AsCancel(f.Execution.Cause); f.Execution.Outcome != event.OutcomeCancelled || ce == nil || ce.Reason != budget.Shutdown {
		t.Errorf("outcome %s, cause %v", f.Execution.Outcome, f.Execution.Cause)
	}
	checkDead(t, dir)
}

func readPids(dir string) string {
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	return string(b)
}
