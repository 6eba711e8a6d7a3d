package timebox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/tool"
)

// writeAgent writes an agent file and returns its path.
func writeAgent(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

type events struct {
	mu sync.Mutex
	l  []event.Event
}

func (e *events) Emit(ev event.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.l = append(e.l, ev)
}

// An agent file whose primary is an OpenAI-compatible endpoint and whose
// fallback is Anthropic: the primary stalls mid-reply, the turn falls back
// over the real wire formats of both and answers, and the records name both
// attempts with their phases and credentials, never the keys.
func TestOpenAIStallFallsBackToAnthropic(t *testing.T) {
	oa := fakellm.New(fakellm.OpenAI, fakellm.Reply{Stall: true, StallAfter: 2, Chunks: []fakellm.Chunk{{Text: "Let "}, {Text: "me "}, {Text: "see"}}})
	defer oa.Close()
	an := fakellm.New(fakellm.Anthropic, fakellm.Text("Answered by the fallback.", 0))
	defer an.Close()
	path := writeAgent(t, fmt.Sprintf(`name: mixed
model:
  primary: openai:gpt-x
  fallbacks: [anthropic:claude-x]
providers:
  openai:
    base_url: %s
    credentials: [{api_key_env: OA_KEY}]
  anthropic:
    base_url: %s
    credentials: [{api_key_env: AN_KEY}]
timeouts:
  llm_idle: 300ms
`, oa.BaseURL(), an.BaseURL()))
	keys := map[string]string{"OA_KEY": "sk-openai-secret", "AN_KEY": "sk-ant-secret"}
	a, err := timebox.Open(t.Context(), path, timebox.Options{Getenv: func(k string) string { return keys[k] }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var evs events
	res := a.Run(ctx, agent.Input{Text: "hello"}, &evs)
	rec := res.Record
	type summary struct {
		Status    budget.Status
		Answer    string
		Failovers int
	}
	if diff := cmp.Diff(summary{budget.StatusCompleted, "Answered by the fallback.", 1}, summary{rec.Status, rec.Answer, rec.Failovers}); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	if len(rec.ModelCalls) != 2 {
		t.Fatalf("model calls %+v", rec.ModelCalls)
	}
	first, second := rec.ModelCalls[0], rec.ModelCalls[1]
	if first.Provider != "openai" || first.Model != "gpt-x" || first.Phase != budget.PhaseLLMIdle || first.Outcome != event.OutcomeTimedOut || first.Profile != "OA_KEY" ||
		second.Provider != "anthropic" || second.Model != "claude-x" || second.Outcome != event.OutcomeOK || second.Profile != "AN_KEY" {
		t.Fatalf("model calls %+v", rec.ModelCalls)
	}
	var fo *event.Failover
	for _, e := range evs.l {
		if f, ok := e.Data.(*event.Failover); ok {
			fo = f
		}
	}
	if fo == nil || fo.From != "openai:gpt-x (OA_KEY)" || fo.To != "anthropic:claude-x (AN_KEY)" || fo.Phase != budget.PhaseLLMIdle {
		t.Fatalf("failover %+v", fo)
	}
	if r := an.Requests(); len(r) != 1 || r[0].Path != "/v1/messages" || r[0].Authorization != "Bearer sk-ant-secret" {
		t.Fatalf("anthropic requests %+v", r)
	}
	b, _ := json.Marshal(rec)
	eb, _ := json.Marshal(evs.l)
	for _, k := range keys {
		if strings.Contains(string(b), k) || strings.Contains(string(eb), k) {
			t.Fatalf("a key is in the record or the events")
		}
	}
}

// An agent file whose primary is Anthropic: the model asks for a tool in
// input_json_delta fragments, the tool runs and prints nothing, and the
// second request carries the call and its result in the shape the Messages
// API accepts (alternating roles, no empty text block) before the answer.
func TestAnthropicPrimaryRunsATool(t *testing.T) {
	an := fakellm.New(fakellm.Anthropic,
		fakellm.ToolCall("toolu_1", "touch", `{"path": "a.txt"}`, 4),
		fakellm.Text("Touched it.", 0))
	defer an.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "touch.sh"), []byte("#!/bin/sh\ncat >/dev/null\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`name: claude
instructions: Be brief.
model:
  primary: anthropic:claude-x
providers:
  anthropic:
    base_url: %s
    credentials: [{api_key_env: AN_KEY}]
tools:
  - name: touch
    description: Touches a file.
    input_schema: {type: object, properties: {path: {type: string}}, required: [path]}
    exec: [%s]
context: {time_notes: off}  # this test is about the wire, not the notes
`, an.BaseURL(), filepath.Join(dir, "touch.sh"))), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := timebox.Open(t.Context(), path, timebox.Options{Getenv: func(k string) string {
		if k == "AN_KEY" {
			return "sk-ant-secret"
		}
		return ""
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res := a.Run(ctx, agent.Input{Text: "touch a.txt"}, &events{})
	type summary struct {
		Status                budget.Status
		Answer                string
		ModelCalls, ToolCalls int
	}
	rec := res.Record
	if diff := cmp.Diff(summary{budget.StatusCompleted, "Touched it.", 2, 1}, summary{rec.Status, rec.Answer, len(rec.ModelCalls), len(rec.ToolCalls)}); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	reqs := an.Requests()
	if len(reqs) != 2 || reqs[1].Model != "claude-x" || reqs[1].Authorization != "Bearer sk-ant-secret" {
		t.Fatalf("requests %+v", reqs)
	}
	if sys, _ := json.Marshal(reqs[0].Body["system"]); !strings.Contains(string(sys), "Be brief.") {
		t.Errorf("system %s", sys)
	}
	if tools, _ := json.Marshal(reqs[0].Body["tools"]); !strings.Contains(string(tools), `"required":["path"]`) {
		t.Errorf("tools %s", tools)
	}
	msgs, _ := json.Marshal(reqs[1].Body["messages"])
	want := `[{"content":[{"text":"touch a.txt","type":"text"}],"role":"user"},` +
		`{"content":[{"id":"toolu_1","input":{"path":"a.txt"},"name":"touch","type":"tool_use"}],"role":"assistant"},` +
		`{"content":[{"tool_use_id":"toolu_1","type":"tool_result"}],"role":"user"}]`
	if string(msgs) != want {
		t.Fatalf("second request's messages\n got %s\nwant %s", msgs, want)
	}
}

// TestBuildChecksToolUsers: a tool's user: is looked up when the agent is
// built; one that does not exist stops the build, placed in the file as
// the loader's problems are.
func TestBuildChecksToolUsers(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeAgent(t, fmt.Sprintf(`model: {primary: "script:m"}
providers: {script: {file: %q}}
tools:
  - name: t
    exec: [/bin/true]
    user: no-such-user-tb
`, script))
	_, err := timebox.Open(context.Background(), path, timebox.Options{})
	if err == nil || !strings.Contains(err.Error(), path+`:6:11: tools[0].user: no user "no-such-user-tb"`) {
		t.Fatalf("Open: %v", err)
	}
}

// TestOpenMCPChecksItsUser: OpenMCP runs the server as the entry's user,
// so a user that does not exist is refused with the knob, and no server is
// started.
func TestOpenMCPChecksItsUser(t *testing.T) {
	tl := config.Tool{Name: "fs", User: "no-such-user-tb", MCP: &config.MCP{Command: []string{"/bin/true"}}}
	s, err := timebox.OpenMCP(context.Background(), tl, nil)
	if err == nil || !strings.Contains(err.Error(), `tools[fs].user: no user "no-such-user-tb"`) {
		t.Fatalf("OpenMCP: %v", err)
	}
	if s != nil {
		t.Fatalf("OpenMCP gave a server with its error: %v", s)
	}
}

// TestBuildAsksForApproval: a tool with approval: required is built to ask
// for every call, waiting its own approval_timeout; one without it asks
// for none, and one that takes timeouts.approval keeps its source, so the
// agent lets it follow the turn's.
func TestBuildAsksForApproval(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeAgent(t, fmt.Sprintf(`model: {primary: "script:m"}
providers: {script: {file: %q}}
tools:
  - {name: plain, exec: [/bin/true]}
  - {name: asks, exec: [/bin/true], approval: required}
  - {name: own, exec: [/bin/true], approval: required, approval_timeout: 2h}
`, script))
	a, err := timebox.Open(context.Background(), path, timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := map[string]string{}
	for _, tl := range a.Tools() {
		s := "never"
		if tl.NeedsApproval != nil && tl.NeedsApproval(json.RawMessage(`{}`)) {
			s = fmt.Sprintf("required %s %s %s", tl.ApprovalTimeout.D, tl.ApprovalTimeout.Source, tl.ApprovalTimeout.Knob)
		}
		got[tl.Tool.Spec().Name] = s
	}
	want := map[string]string{
		"plain": "never",
		"asks":  "required 24h0m0s default timeouts.approval",
		"own":   "required 2h0m0s tool tools[own].approval_timeout in agent.yaml",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("approvals (-want +got):\n%s", diff)
	}
}

// TestBuildAsksForApprovalOfMCPTools: an mcp entry's approval applies to
// every tool its server lists but those whose override says otherwise,
// each with the approval_timeout of its override or else of its entry.
func TestBuildAsksForApprovalOfMCPTools(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "fake", Version: "1"}, nil)
	for _, name := range []string{"read", "write", "delete"} {
		srv.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
			})
	}
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer ts.Close()
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeAgent(t, fmt.Sprintf(`model: {primary: "script:m"}
providers: {script: {file: %q}}
tools:
  - name: files
    mcp: {url: %q}
    approval: required
    approval_timeout: 4h
    overrides:
      read: {approval: never}
      delete: {approval_timeout: 10m}
`, script, ts.URL))
	a, err := timebox.Open(context.Background(), path, timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := map[string]string{}
	for _, tl := range a.Tools() {
		s := "never"
		if tl.NeedsApproval != nil {
			s = fmt.Sprintf("required %s %s %s", tl.ApprovalTimeout.D, tl.ApprovalTimeout.Source, tl.ApprovalTimeout.Knob)
		}
		got[tl.Tool.Spec().Name] = s
	}
	want := map[string]string{
		"files__read":   "never",
		"files__write":  "required 4h0m0s tool tools[files].approval_timeout in agent.yaml",
		"files__delete": "required 10m0s tool tools[files].overrides[delete].approval_timeout in agent.yaml",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("approvals (-want +got):\n%s", diff)
	}
}

// TestCloseFromTwoGoroutines: Close is safe to call at once from two
// goroutines (go test -race), as from a signal handler and a deferred
// call.
func TestCloseFromTwoGoroutines(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := timebox.Open(t.Context(), writeAgent(t, fmt.Sprintf("model: {primary: \"script:m\"}\nproviders: {script: {file: %q}}\n", script)), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- a.Close() }()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// TestAGoToolNamedAsAFileToolIsNamed: a Go tool of Options.Tools with
// the name of one of the file's tools is refused saying which is which,
// not "two tools are named".
func TestAGoToolNamedAsAFileToolIsNamed(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := writeAgent(t, fmt.Sprintf("model: {primary: \"script:m\"}\nproviders: {script: {file: %q}}\ntools: [{name: fetch, exec: [/bin/cat]}]\n", script))
	fetch := tool.NewFunc("fetch", "d", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "", nil })
	_, err := timebox.Open(t.Context(), path, timebox.Options{Tools: []agent.Tool{{Tool: fetch}}})
	if want := `Options.Tools[0]: "fetch" is the name of a tool of ` + path + `; give the Go tool another name`; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v, want %q", err, want)
	}
}

// TestBuildChecksTheProcessTreeStrategy: a TIMEBOX_PROCTREE that this
// platform lacks stops the build, as it stops timebox's commands, rather
// than failing every exec call of every turn.
func TestBuildChecksTheProcessTreeStrategy(t *testing.T) {
	t.Setenv("TIMEBOX_PROCTREE", "bogus")
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	if err := os.WriteFile(script, []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := timebox.Open(t.Context(), writeAgent(t, fmt.Sprintf("model: {primary: \"script:m\"}\nproviders: {script: {file: %q}}\n", script)), timebox.Options{})
	if err == nil || !strings.Contains(err.Error(), `TIMEBOX_PROCTREE="bogus"`) {
		t.Fatalf("Open: %v", err)
	}
}
