//go:build linux

package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
)

// inspector runs the MCP Inspector's CLI mode (pinned in
// testdata/mcpclient) with args and returns its stdout, its stderr and
// how long it took.
func inspector(t *testing.T, args ...string) (string, string, time.Duration) {
	t.Helper()
	dir := testenv.NPM(t, filepath.Join("testdata", "mcpclient"))
	bin := filepath.Join(dir, "node_modules", ".bin", "mcp-inspector")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("the MCP Inspector is not installed (an older install of testdata/mcpclient? run `npm ci --prefix internal/cli/testdata/mcpclient`): %v", err)
	}
	cmd := exec.Command(bin, append([]string{"--cli"}, args...)...)
	cmd.Env = append(proctest.Env(nil), "MCP_CATALOG_PATH="+filepath.Join(t.TempDir(), "mcp.json"))
	var stdout, stderr syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the Inspector did not finish: stdout %s stderr %s", stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String(), time.Since(began)
}

// inspectorResult decodes the first JSON value the Inspector printed (a
// tools/call's result; an isError result is followed by a line of its own).
func inspectorResult(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.NewDecoder(strings.NewReader(out)).Decode(v); err != nil {
		t.Fatalf("the Inspector printed %q: %v", out, err)
	}
}

// checkInspectorCalls runs tools/list and the hung tool's tools/call with
// the Inspector's CLI mode against target (a command or a URL and its
// options).
func checkInspectorCalls(t *testing.T, dir string, target ...string) {
	t.Helper()
	out, errOut, _ := inspector(t, append(target, "--method", "tools/list")...)
	var list struct {
		Tools []struct {
			Name string         `json:"name"`
			Meta map[string]any `json:"_meta"`
		} `json:"tools"`
	}
	inspectorResult(t, out, &list)
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
	}
	if strings.Join(names, ",") != "fast,hang,progress,slow_hang" {
		t.Errorf("tools %v (stderr %s)", names, errOut)
	}

	out, errOut, took := inspector(t, append(target, "--method", "tools/call", "--tool-name", "hang")...)
	var r struct {
		Content []struct{ Type, Text string } `json:"content"`
		IsError bool                          `json:"isError"`
	}
	inspectorResult(t, out, &r)
	var e struct {
		Error struct{ Type, Tool, Limit string } `json:"error"`
	}
	if len(r.Content) == 1 {
		json.Unmarshal([]byte(r.Content[0].Text), &e)
	}
	if !r.IsError || e.Error.Type != "tool_timeout" || e.Error.Tool != "hang" || e.Error.Limit != "1s" {
		t.Errorf("hang: want an isError tool_timeout result, got %s (stderr %s)", out, errOut)
	}
	if took > 10*time.Second {
		t.Errorf("the Inspector's call of hang took %v, want about 1.5 s and the Inspector's start", took)
	}
	checkPidsGone(t, dir)
}

// TestMCPServeInspectorCLI: the MCP Inspector's CLI mode lists the tools
// of the built `timebox mcp serve` and calls its hung tool (timeout: 1s),
// answered as an isError tool_timeout result, over stdio (the Inspector
// starts the server) and over streamable HTTP with the bearer token.
func TestMCPServeInspectorCLI(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	file := filepath.Join(dir, "agent.yaml")
	t.Run("stdio", func(t *testing.T) {
		checkInspectorCalls(t, dir, bin, "mcp", "serve", "-f", file, "--no-store")
	})
	t.Run("http", func(t *testing.T) {
		const token = "mcp-inspector-token-0123456789"
		cmd := exec.Command(bin, "mcp", "serve", "-f", file, "--no-store", "--addr", "127.0.0.1:0")
		cmd.Env = append(proctest.Env(nil), "TIMEBOX_TOKEN="+token)
		srv := startMCPServeHTTP(t, cmd, `over MCP on (http://127\.0\.0\.1:\d+/mcp)`, 10*time.Second)
		url := srv.url
		checkInspectorCalls(t, dir, url, "--transport", "http", "--header", "Authorization: Bearer "+token)
	})
}
