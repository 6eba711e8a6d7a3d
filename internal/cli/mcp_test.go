//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/server"
)

// mcpAgent is the agent file of the stdio and HTTP tests: exec tools
// only (TestMCPServeProxiesAnMCPEntry serves an mcp entry's).
const mcpAgent = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms}
tools:
  - name: fast
    description: Answers at once.
    exec: [./fast.sh]
  - name: progress
    exec: [./progress.sh]
  - name: hang
    exec: [./hang.sh]
    timeout: 1s
  - name: slow_hang
    exec: [./hang.sh]
    timeout: 5m
`

func writeMCPAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{
		"fast.sh":     "#!/bin/sh\ncat >/dev/null\necho '{\"ok\": true}'\n",
		"progress.sh": "#!/bin/sh\ncat >/dev/null\nfor i in 1 2 3; do echo \"::progress:: {\\\"progress\\\": $i, \\\"total\\\": 3}\" >&2; sleep 0.15; done\necho done\n",
		"hang.sh":     "#!/bin/sh\ncat >/dev/null\ntrap '' TERM\nsetsid sleep 300 &\necho $! >> pids\necho $$ >> pids\nwhile true; do sleep 1; done\n",
	} {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "unused"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(mcpAgent), 0o644)
	return dir
}

func mcpText(r *mcp.CallToolResult) string {
	if r == nil || len(r.Content) == 0 {
		return ""
	}
	if tc, ok := r.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// waitPids waits until the hang script of a call has written its two pids
// (the pids file has want lines).
func waitPids(t *testing.T, dir string, want int) {
	t.Helper()
	if !wait.Until(10*time.Second, func() bool { return strings.Count(readFile(filepath.Join(dir, "pids")), "\n") >= want }) {
		t.Fatal("the tool never started")
	}
}

func checkPidsGone(t *testing.T, dir string) {
	t.Helper()
	for _, p := range strings.Fields(readFile(filepath.Join(dir, "pids"))) {
		if alive(p) {
			t.Errorf("process %s of a stopped call is still alive", p)
		}
	}
}

// TestMCPServeStdio drives the built `timebox mcp serve` with the MCP SDK's
// client over its stdin and stdout, as Claude Desktop would: the tool list
// (its exec tools), a fast call, a hung call's tool_timeout result,
// progress on a token, a client's cancel of a hung call (its tree gone),
// and a clean exit when the client closes stdin. The binary and every
// process it starts carry this test's marker, so a leftover is a leak.
// Then the store (--db) holds each call as a turn of the connection's
// session, which `timebox runs` and `timebox stats` read
// (checkMCPRecords).
func TestMCPServeStdio(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	db := filepath.Join(dir, "timebox.db")
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--db", db)
	cmd.Env = proctest.Env(nil)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	var mu sync.Mutex
	var notes []*mcp.ProgressNotificationParams
	client := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			notes = append(notes, r.Params)
			mu.Unlock()
		},
	})
	ctx := context.Background()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	closed := false
	defer func() {
		if !closed {
			cs.Close()
		}
	}()

	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "fast,hang,progress,slow_hang" {
		t.Errorf("tools %v: want the exec tools", names)
	}

	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fast", Arguments: map[string]any{}})
	if err != nil || r.IsError || strings.TrimSpace(mcpText(r)) != `{"ok": true}` {
		t.Fatalf("fast: %v %q", err, mcpText(r))
	}

	began := time.Now()
	r, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("hang: a protocol error: %v", err)
	}
	var e struct {
		Error struct{ Type, Tool, Limit, Knob string } `json:"error"`
	}
	json.Unmarshal([]byte(mcpText(r)), &e)
	if !r.IsError || e.Error.Type != "tool_timeout" || e.Error.Tool != "hang" || e.Error.Limit != "1s" ||
		e.Error.Knob != "tools[hang].timeout in agent.yaml" {
		t.Fatalf("hang: isError %v: %s", r.IsError, mcpText(r))
	}
	if took < time.Second || took > 6*time.Second {
		t.Errorf("hang answered after %v, want about 1.5s (1s, then kill_grace 500ms)", took)
	}
	waitPids(t, dir, 2)
	checkPidsGone(t, dir)

	p := &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{}}
	p.SetProgressToken("p1")
	if r, err := cs.CallTool(ctx, p); err != nil || r.IsError {
		t.Fatalf("progress: %v %q", err, mcpText(r))
	}
	if !wait.Until(5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(notes) == 3 }) {
		t.Errorf("%d progress notifications, want 3", len(notes))
	}
	mu.Lock()
	for i, n := range notes {
		if n.ProgressToken != "p1" || n.Progress != float64(i+1) || n.Total != 3 {
			t.Errorf("notification %d: %+v", i, n)
		}
	}
	mu.Unlock()

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "slow_hang", Arguments: map[string]any{}})
		errc <- err
	}()
	waitPids(t, dir, 4)
	cancel()
	if err := <-errc; err == nil {
		t.Error("the cancelled call answered")
	}
	// The cancel grace is min(kill_grace, 500ms); the script ignores
	// SIGTERM, so SIGKILL ends it.
	if !wait.Until(3*time.Second, func() bool {
		for _, p := range strings.Fields(readFile(filepath.Join(dir, "pids"))) {
			if alive(p) {
				return false
			}
		}
		return true
	}) {
		checkPidsGone(t, dir)
	}

	closed = true
	if err := cs.Close(); err != nil {
		t.Errorf("timebox mcp serve did not exit cleanly when the client closed stdin: %v\n%s", err, stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "serving 4 tools") {
		t.Errorf("stderr:\n%s", s)
	}
	checkMCPRecords(t, db)
}

// TestMCPServeStdioAnswersAPipeline: a client that writes its requests
// and closes stdin (a shell pipeline, a script) gets every answer, the
// call still running when stdin ended included, and timebox exits 0.
// Before, the end of stdin ended the session and only part was answered.
func TestMCPServeStdioAnswersAPipeline(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--no-store")
	cmd.Env = proctest.Env(nil)
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		`{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "sh", "version": "1"}}}`,
		`{"jsonrpc": "2.0", "method": "notifications/initialized"}`,
		`{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}`,
		`{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "fast", "arguments": {}}}`,
		// About half a second: still running when stdin ends.
		`{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "progress", "arguments": {}}}`,
	}, "\n") + "\n")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("exit: %v, want 0\n%s", err, stderr.String())
	}
	answered := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && len(r.Result) > 0 {
			answered[string(r.ID)] = string(r.Result)
		}
	}
	for _, id := range []string{"1", "2", "3", "4"} {
		if answered[id] == "" {
			t.Errorf("request %s was not answered; stdout:\n%s", id, out)
		}
	}
	if !strings.Contains(answered["4"], `"text":"done\n"`) {
		t.Errorf("the progress call answered %s, want its output", answered["4"])
	}
}

// checkMCPRecords reads the store TestMCPServeStdio's calls were recorded
// in: four turns (fast ok, hang timed out, progress ok with its 3
// reports, slow_hang cancelled by the client), all in one mcp_ session,
// each with its call's record under its budget; and stats counts them.
func checkMCPRecords(t *testing.T, db string) {
	t.Helper()
	r := run(t, nil, "runs", "list", "--db", db, "--json")
	if r.code != 0 {
		t.Fatalf("runs list: %d %s", r.code, r.err)
	}
	var turns []struct {
		TurnID, SessionID, Input, Status, StopReason string
		ToolCalls                                    int
	}
	dec := json.NewDecoder(strings.NewReader(r.out))
	for dec.More() {
		var x struct {
			TurnID     string `json:"turn_id"`
			SessionID  string `json:"session_id"`
			Input      string `json:"input"`
			Status     string `json:"status"`
			StopReason string `json:"stop_reason"`
			ToolCalls  int    `json:"tool_calls"`
		}
		if err := dec.Decode(&x); err != nil {
			t.Fatal(err)
		}
		turns = append(turns, struct {
			TurnID, SessionID, Input, Status, StopReason string
			ToolCalls                                    int
		}{x.TurnID, x.SessionID, x.Input, x.Status, x.StopReason, x.ToolCalls})
	}
	if len(turns) != 4 {
		t.Fatalf("%d turns stored, want one per call (4):\n%s", len(turns), r.out)
	}
	want := map[string]string{ // tool: status/stop_reason outcome phase
		"fast":      "completed/answered ok ",
		"hang":      "completed/answered timed_out tool",
		"progress":  "completed/answered ok ",
		"slow_hang": "cancelled/cancelled cancelled cancel",
	}
	for _, tu := range turns {
		if !strings.HasPrefix(tu.SessionID, "mcp_") || tu.SessionID != turns[0].SessionID {
			t.Errorf("turn %s: session %q, want the connection's mcp_ session, the same for every call", tu.TurnID, tu.SessionID)
		}
		if tu.ToolCalls != 1 {
			t.Errorf("turn %s: %d tool calls, want 1", tu.TurnID, tu.ToolCalls)
		}
		r := run(t, nil, "runs", "show", "--db", db, "--json", tu.TurnID)
		var rec struct {
			ToolCalls []struct {
				Tool          string `json:"tool"`
				Kind          string `json:"kind"`
				Outcome       string `json:"outcome"`
				Phase         string `json:"phase"`
				DurationMS    int64  `json:"duration_ms"`
				TimeoutMS     int64  `json:"timeout_ms"`
				TimeoutSource string `json:"timeout_source"`
				ProgressCount int    `json:"progress_count"`
			} `json:"tool_calls"`
			Events []struct {
				Type string `json:"type"`
			} `json:"events"`
		}
		if err := json.Unmarshal([]byte(r.out), &rec); err != nil || len(rec.ToolCalls) != 1 {
			t.Fatalf("runs show %s: %v %d\n%s%s", tu.TurnID, err, r.code, r.out, r.err)
		}
		c := rec.ToolCalls[0]
		if got := tu.Status + "/" + tu.StopReason + " " + c.Outcome + " " + c.Phase; got != want[c.Tool] || c.Kind != "exec" ||
			tu.Input != "tools/call "+c.Tool+" {}" {
			t.Errorf("turn %s (%q): %s, kind %s; want %s", tu.TurnID, tu.Input, got, c.Kind, want[c.Tool])
		}
		var types []string
		for _, e := range rec.Events {
			types = append(types, e.Type)
		}
		wantTypes := "turn_started tool_started tool_finished turn_finished"
		switch c.Tool {
		case "hang":
			if c.TimeoutMS != 1000 || c.TimeoutSource != "tool" || c.DurationMS < 1000 || c.DurationMS > 6000 {
				t.Errorf("hang's record: timeout %dms (%s), took %dms; want 1000ms (tool), about 1500ms", c.TimeoutMS, c.TimeoutSource, c.DurationMS)
			}
		case "progress":
			wantTypes = "turn_started tool_started tool_progress tool_progress tool_progress tool_finished turn_finished"
			if c.ProgressCount != 3 {
				t.Errorf("progress's record: progress_count %d, want 3", c.ProgressCount)
			}
		case "fast":
			if c.TimeoutMS != 60000 || c.TimeoutSource != "default" {
				t.Errorf("fast's record: timeout %dms (%s), want the default 60000ms", c.TimeoutMS, c.TimeoutSource)
			}
		}
		if got := strings.Join(types, " "); got != wantTypes {
			t.Errorf("turn %s (%s): events %s, want %s", tu.TurnID, c.Tool, got, wantTypes)
		}
	}

	r = run(t, nil, "stats", "--db", db, "--json")
	var st struct {
		Tools []struct {
			Tool      string `json:"tool"`
			Calls     int64  `json:"calls"`
			TimedOut  int64  `json:"timed_out"`
			Cancelled int64  `json:"cancelled"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(r.out), &st); err != nil {
		t.Fatalf("stats: %v %d\n%s%s", err, r.code, r.out, r.err)
	}
	got := map[string]string{}
	for _, x := range st.Tools {
		got[x.Tool] = fmt.Sprintf("%d calls, %d timed out, %d cancelled", x.Calls, x.TimedOut, x.Cancelled)
	}
	for tool, w := range map[string]string{
		"fast": "1 calls, 0 timed out, 0 cancelled", "hang": "1 calls, 1 timed out, 0 cancelled",
		"progress": "1 calls, 0 timed out, 0 cancelled", "slow_hang": "1 calls, 0 timed out, 1 cancelled",
	} {
		if got[tool] != w {
			t.Errorf("stats for %s: %q, want %q", tool, got[tool], w)
		}
	}
}

// TestMCPServeSIGTERM: timebox mcp serve stopped by SIGTERM while a call
// hangs stops the call's tree before it exits. On the way, budget flags
// and variables resolve as for a turn: a tool without a timeout of its own
// gets --tool-timeout, and TIMEBOX_KILL_GRACE sets every tool's grace.
func TestMCPServeSIGTERM(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--no-store", "--tool-timeout", "7s")
	cmd.Env = append(proctest.Env(nil), "TIMEBOX_KILL_GRACE=300ms")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		b, _ := tl.Meta["timebox/budget"].(map[string]any)
		switch tl.Name {
		case "fast":
			if b["timeout_ms"] != float64(7000) || b["timeout_source"] != "flag" || b["kill_grace_ms"] != float64(300) {
				t.Errorf("fast: budget %v, want --tool-timeout's 7s and TIMEBOX_KILL_GRACE's 300ms", b)
			}
		case "slow_hang":
			if b["timeout_ms"] != float64(300000) || b["timeout_source"] != "tool" {
				t.Errorf("slow_hang: budget %v, want its own 5m", b)
			}
		}
	}
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow_hang", Arguments: map[string]any{}})
	waitPids(t, dir, 2)
	cmd.Process.Signal(syscall.SIGTERM)
	err = cs.Wait()
	if !wait.Until(5*time.Second, func() bool { return cmd.ProcessState != nil }) {
		cs.Close()
	}
	cs.Close()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 130 {
		t.Errorf("exit %v (session: %v), want 130\n%s", cmd.ProcessState, err, stderr.String())
	}
	checkPidsGone(t, dir)
}

// TestMCPServeHTTP drives the built `timebox mcp serve --addr` with the MCP
// SDK's streamable HTTP client on the address it printed, with the bearer
// token from TIMEBOX_TOKEN: the tool list, a fast call, a hung call's
// tool_timeout result with its tree gone; a plain request without the
// token is answered 401, one from another origin 403; SIGTERM while a call
// hangs stops its tree before timebox exits 130.
func TestMCPServeHTTP(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	const token = "mcp-http-token-0123456789"
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--no-store", "--addr", "127.0.0.1:0")
	cmd.Env = append(proctest.Env(nil), "TIMEBOX_TOKEN="+token)
	srv := startMCPServeHTTP(t, cmd, `timebox serving 4 tools of \S+ over MCP on (http://127\.0\.0\.1:\d+/mcp)`, 10*time.Second)
	url := srv.url

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	plain := func(header map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := plain(nil); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code := plain(map[string]string{"Authorization": "Bearer " + token, "Origin": "https://evil.example"}); code != http.StatusForbidden {
		t.Errorf("from another origin: %d, want 403", code)
	}

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
			HTTPClient: &http.Client{Transport: bearerTransport{token, tr}}}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, srv.stderr.String())
	}
	defer cs.Close()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "fast,hang,progress,slow_hang" {
		t.Errorf("tools %v", names)
	}
	r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fast", Arguments: map[string]any{}})
	if err != nil || r.IsError || strings.TrimSpace(mcpText(r)) != `{"ok": true}` {
		t.Fatalf("fast: %v %q", err, mcpText(r))
	}
	began := time.Now()
	r, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}})
	took := time.Since(began)
	if err != nil {
		t.Fatalf("hang: a protocol error: %v", err)
	}
	var e struct {
		Error struct{ Type, Tool, Limit string } `json:"error"`
	}
	json.Unmarshal([]byte(mcpText(r)), &e)
	if !r.IsError || e.Error.Type != "tool_timeout" || e.Error.Tool != "hang" || e.Error.Limit != "1s" {
		t.Fatalf("hang: isError %v: %s", r.IsError, mcpText(r))
	}
	if took < time.Second || took > 6*time.Second {
		t.Errorf("hang answered after %v, want about 1.5s", took)
	}
	waitPids(t, dir, 2)
	checkPidsGone(t, dir)

	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow_hang", Arguments: map[string]any{}})
	waitPids(t, dir, 4)
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("timebox did not exit after SIGTERM\n%s", srv.stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d, want 130\n%s", code, srv.stderr.String())
	}
	checkPidsGone(t, dir)
}

// bearerTransport sends a bearer token with every request.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// TestMCPServeHTTPRefusesAPublicAddressWithoutAToken: as serve does, and
// with its message, before anything starts.
func TestMCPServeHTTPRefusesAPublicAddressWithoutAToken(t *testing.T) {
	dir := writeMCPAgent(t)
	file := filepath.Join(dir, "agent.yaml")
	for _, addr := range []string{"0.0.0.0:0", ":8080"} {
		var out, errb bytes.Buffer
		code := cli.Run(t.Context(), []string{"mcp", "serve", "-f", file, "--addr", addr},
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb})
		want := "timebox mcp serve: " + server.CheckAddr(addr, "").Error()
		if code != cli.ExitUsage || !strings.Contains(errb.String(), want) || !strings.Contains(errb.String(), "TIMEBOX_TOKEN") || out.Len() != 0 {
			t.Errorf("--addr %s: %d %q", addr, code, errb.String())
		}
	}
	// --token without --addr is a mistake, not a stdio server with a token.
	var errb bytes.Buffer
	code := cli.Run(t.Context(), []string{"mcp", "serve", "-f", file, "--token", "abcdefghijklmnopqrstuvwxyz"},
		cli.IO{In: strings.NewReader(""), Out: &bytes.Buffer{}, Err: &errb})
	if code != cli.ExitUsage || !strings.Contains(errb.String(), "--token is for --addr") {
		t.Errorf("--token without --addr: %d %q", code, errb.String())
	}
}

// mcpServe is a `timebox mcp serve --addr` process a test started.
type mcpServe struct {
	url            string
	stdout, stderr *syncbuf.Buffer
	exited         chan struct{} // closed once it exited
}

// startMCPServeHTTP starts cmd, a `timebox mcp serve --addr
// 127.0.0.1:0`, and waits up to within for the line matching serving, whose
// group is the address it serves. The process is killed when the test
// ends, if it has not exited.
func startMCPServeHTTP(t *testing.T, cmd *exec.Cmd, serving string, within time.Duration) *mcpServe {
	t.Helper()
	srv := &mcpServe{stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = srv.stdout, srv.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(srv.exited) }()
	t.Cleanup(func() {
		select {
		case <-srv.exited:
		default:
			cmd.Process.Kill()
			<-srv.exited
		}
	})
	re := regexp.MustCompile(serving)
	if !wait.Until(within, func() bool {
		m := re.FindStringSubmatch(srv.stdout.String())
		if m != nil {
			srv.url = m[1]
		}
		return m != nil
	}) {
		t.Fatalf("no address printed; stdout %q stderr %q", srv.stdout.String(), srv.stderr.String())
	}
	return srv
}
