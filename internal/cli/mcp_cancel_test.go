//go:build linux

package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/internal/mcptest"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/wait"
)

// TestMCPServeHTTPCancelsAProxiedCall: a client of `timebox mcp serve
// --addr` cancels a call of an MCP entry's tool whose server goes on with
// it (internal/mcptest's stubborn tool; this test binary is the server)
// under on_ignored_cancel: restart. The cancel travels through timebox to
// the server, which ignores it, so timebox kills the server's tree; the
// next call is answered by a fresh server; the store has the call
// cancelled, with server_restarted.
func TestMCPServeHTTPCancelsAProxiedCall(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "unused"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), fmt.Appendf(nil, `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms}
tools:
  - name: slow
    mcp: {command: [%q], on_ignored_cancel: restart}
    timeout: 5m
`, exe), 0o644)
	db, pids := filepath.Join(dir, "timebox.db"), filepath.Join(dir, "pids")
	const token = "mcp-cancel-token-0123456789"
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--db", db, "--addr", "127.0.0.1:0")
	cmd.Env = append(proctest.Env(nil), "TIMEBOX_TOKEN="+token, mcptest.EnvServe+"=1", mcptest.EnvPids+"="+pids)
	srv := startMCPServeHTTP(t, cmd, `over MCP on (http://127\.0\.0\.1:\d+/mcp)`, 20*time.Second)
	url := srv.url
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	progressed := make(chan struct{}, 1)
	client := mcp.NewClient(&mcp.Implementation{Name: "cancel-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			select {
			case progressed <- struct{}{}:
			default:
			}
		},
	})
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearerTransport{token, tr}}}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, srv.stderr.String())
	}
	defer cs.Close()
	echo := func() string {
		t.Helper()
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow__echo", Arguments: map[string]any{}})
		if err != nil || r.IsError {
			t.Fatalf("echo: %v %q\n%s", err, mcpText(r), srv.stderr.String())
		}
		return mcpText(r)
	}
	first := echo()

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		p := &mcp.CallToolParams{Name: "slow__stubborn", Arguments: map[string]any{}}
		p.SetProgressToken("s1")
		_, err := cs.CallTool(ctx, p)
		errc <- err
	}()
	select {
	case <-progressed: // the server runs the call
	case <-time.After(20 * time.Second):
		t.Fatalf("no progress from the stubborn call\n%s", srv.stderr.String())
	}
	cancelled := time.Now()
	cancel()
	if err := <-errc; err == nil {
		t.Error("the cancelled call answered")
	}
	var treePids []string
	if !wait.Until(10*time.Second, func() bool {
		treePids = strings.Fields(readFile(pids))
		if len(treePids) < 2 {
			return false
		}
		for _, p := range treePids {
			if alive(p) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the stubborn server's tree %v is still running %v after the cancel\n%s", treePids, time.Since(cancelled), srv.stderr.String())
	}
	t.Logf("the server's tree was gone %v after the client's cancel (cancel grace 500ms)", time.Since(cancelled).Round(time.Millisecond))
	if again := echo(); again == first {
		t.Errorf("echo answered by the old server (pid %s)", first)
	}
	cs.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-srv.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("timebox mcp serve did not exit on SIGTERM")
	}

	r := run(t, nil, "runs", "list", "--db", db, "--json", "--status", "cancelled")
	var tu struct {
		TurnID     string `json:"turn_id"`
		StopReason string `json:"stop_reason"`
	}
	if err := json.Unmarshal([]byte(r.out), &tu); err != nil || tu.StopReason != "cancelled" {
		t.Fatalf("the cancelled call's turn: %v %q %s", err, r.out, r.err)
	}
	r = run(t, nil, "runs", "show", "--db", db, "--json", tu.TurnID)
	var rec struct {
		ToolCalls []struct {
			Tool            string `json:"tool"`
			Outcome         string `json:"outcome"`
			Phase           string `json:"phase"`
			ServerRestarted bool   `json:"server_restarted"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal([]byte(r.out), &rec); err != nil || len(rec.ToolCalls) != 1 {
		t.Fatalf("runs show: %v\n%s", err, r.out)
	}
	if c := rec.ToolCalls[0]; c.Tool != "slow__stubborn" || c.Outcome != "cancelled" || c.Phase != "cancel" || !c.ServerRestarted {
		t.Errorf("the cancelled call's record: %+v", c)
	}
}
