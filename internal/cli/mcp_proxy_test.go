//go:build linux

package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
)

// everythingAgent serves an exec tool and server-everything's tools, the
// long-running one of them under a 1s timeout of its own.
const everythingAgent = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms}
tools:
  - name: fast
    exec: [./fast.sh]
  - name: everything
    mcp: {command: [EVERYTHING, stdio]}
    timeout: 10s
    overrides:
      trigger-long-running-operation: {timeout: 1s}
`

// TestMCPServeProxiesAnMCPEntry: the tools of an agent file's mcp entry
// (@modelcontextprotocol/server-everything, pinned in
// tool/mcptool/testdata) are served beside its exec tools, under the names
// a turn's model sees them by (everything__echo) and through the same
// tool.Run path with their budgets: echo answers through the proxy, and
// trigger-long-running-operation, asked for 30 s of work under a 1s
// override, sends its progress on and is answered in about a second as an
// isError tool_timeout result. The server started for the entry is stopped when the client
// closes stdin (proctest finds no leftover).
func TestMCPServeProxiesAnMCPEntry(t *testing.T) {
	bin := timeboxBinary(t)
	everything := filepath.Join(testenv.NPM(t, filepath.Join("..", "..", "tool", "mcptool", "testdata")), "node_modules", ".bin", "mcp-server-everything")
	if _, err := os.Stat(everything); err != nil {
		t.Fatal(err)
	}
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	file := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(file, []byte(strings.Replace(everythingAgent, "EVERYTHING", everything, 1)), 0o644)
	cmd := exec.Command(bin, "mcp", "serve", "-f", file, "--no-store")
	cmd.Env = proctest.Env(nil)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	var mu sync.Mutex
	var notes []*mcp.ProgressNotificationParams
	client := mcp.NewClient(&mcp.Implementation{Name: "proxy-test", Version: "1"}, &mcp.ClientOptions{
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
	tools := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	for _, want := range []string{"fast", "everything__echo", "everything__trigger-long-running-operation"} {
		if tools[want] == nil {
			t.Fatalf("no tool %s among %d: %v", want, len(res.Tools), tools)
		}
	}
	b, _ := tools["everything__trigger-long-running-operation"].Meta["timebox/budget"].(map[string]any)
	if b["timeout_ms"] != float64(1000) || !strings.Contains(b["knob"].(string), "overrides[trigger-long-running-operation]") {
		t.Errorf("the long operation's budget %v: want its override", b)
	}
	if b, _ := tools["everything__echo"].Meta["timebox/budget"].(map[string]any); b["timeout_ms"] != float64(10000) {
		t.Errorf("echo's budget %v: want its entry's", b)
	}

	echo := func() {
		t.Helper()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "everything__echo", Arguments: map[string]any{"message": "héllo through timebox"}})
		if err != nil || r.IsError || !strings.Contains(mcpText(r), "héllo through timebox") {
			t.Fatalf("echo: %v %q", err, mcpText(r))
		}
	}
	echo()

	p := &mcp.CallToolParams{Name: "everything__trigger-long-running-operation", Arguments: map[string]any{"duration": 30, "steps": 300}}
	p.SetProgressToken("long")
	began := time.Now()
	r, err := cs.CallTool(ctx, p)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("the long operation: a protocol error: %v", err)
	}
	var e struct {
		Error struct{ Type, Tool, Limit, Knob string } `json:"error"`
	}
	json.Unmarshal([]byte(mcpText(r)), &e)
	if !r.IsError || e.Error.Type != "tool_timeout" || e.Error.Tool != "everything__trigger-long-running-operation" || e.Error.Limit != "1s" ||
		!strings.Contains(e.Error.Knob, "overrides[trigger-long-running-operation].timeout") {
		t.Fatalf("the long operation: isError %v: %s", r.IsError, mcpText(r))
	}
	if took < time.Second || took > 5*time.Second {
		t.Errorf("the long operation answered after %v, want about 1 s (its override), far from its 30 s of work", took)
	}
	// The server's progress (a report every 0.1 s) reaches the client
	// through timebox, on the client's token, always going up.
	mu.Lock()
	if len(notes) == 0 {
		t.Error("no progress of the long operation reached the client")
	}
	for i, n := range notes {
		if n.ProgressToken != "long" || (i > 0 && n.Progress <= notes[i-1].Progress) {
			t.Errorf("notification %d: %+v", i, n)
		}
	}
	mu.Unlock()

	// The server is still there for the next call.
	echo()
	if r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fast", Arguments: map[string]any{}}); err != nil || r.IsError {
		t.Fatalf("fast: %v %q", err, mcpText(r))
	}

	closed = true
	if err := cs.Close(); err != nil {
		t.Errorf("timebox mcp serve did not exit cleanly when the client closed stdin: %v\n%s", err, stderr.String())
	}
}

// TestMCPServeSDKClientProxy: the official MCP TypeScript SDK's client
// (testdata/mcpclient/proxy.mjs) calls server-everything's tools through
// `timebox mcp serve` over stdio: echo answers, and the long operation,
// 30 s of work under a 1s override while the client would wait 20 s
// (reset on progress), is answered as an isError tool_timeout result in
// about a second, its progress reaching the client's onprogress.
func TestMCPServeSDKClientProxy(t *testing.T) {
	bin := timeboxBinary(t)
	everything := filepath.Join(testenv.NPM(t, filepath.Join("..", "..", "tool", "mcptool", "testdata")), "node_modules", ".bin", "mcp-server-everything")
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	file := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(file, []byte(strings.Replace(everythingAgent, "EVERYTHING", everything, 1)), 0o644)
	var r struct {
		Tools []string `json:"tools"`
		Echo  struct {
			IsError bool   `json:"isError"`
			Text    string `json:"text"`
		} `json:"echo"`
		Long struct {
			MS      float64 `json:"ms"`
			IsError bool    `json:"isError"`
			Text    string  `json:"text"`
			Error   string  `json:"error"`
			Notes   []struct {
				Progress float64 `json:"progress"`
			} `json:"notes"`
		} `json:"long"`
	}
	runNodeScript(t, "proxy.mjs", &r, "TB_BIN="+bin, "TB_AGENT="+file)
	if !slices.Contains(r.Tools, "everything__echo") || !slices.Contains(r.Tools, "fast") {
		t.Errorf("tools %v", r.Tools)
	}
	if r.Echo.IsError || !strings.Contains(r.Echo.Text, "héllo through timebox") {
		t.Errorf("echo: %+v", r.Echo)
	}
	var e struct {
		Error struct{ Type, Limit string } `json:"error"`
	}
	json.Unmarshal([]byte(r.Long.Text), &e)
	if r.Long.Error != "" || !r.Long.IsError || e.Error.Type != "tool_timeout" || e.Error.Limit != "1s" {
		t.Errorf("the long operation: want an isError tool_timeout result, got %+v", r.Long)
	}
	if r.Long.MS < 1000 || r.Long.MS > 5000 {
		t.Errorf("the long operation answered after %vms, want about 1 s, far from the client's 20 s", r.Long.MS)
	}
	if len(r.Long.Notes) == 0 {
		t.Error("no progress reached the client's onprogress")
	}
	for i := 1; i < len(r.Long.Notes); i++ {
		if r.Long.Notes[i].Progress <= r.Long.Notes[i-1].Progress {
			t.Errorf("progress went from %v to %v", r.Long.Notes[i-1].Progress, r.Long.Notes[i].Progress)
		}
	}
}
