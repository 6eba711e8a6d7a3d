//go:build linux

package cli_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/testenv"
)

// sdkClientResult is what testdata/mcpclient/client.mjs prints.
type sdkClientResult struct {
	Server struct{ Name, Version string } `json:"server"`
	Tools  []string                       `json:"tools"`
	Budget struct {
		TimeoutMS     int64  `json:"timeout_ms"`
		TimeoutSource string `json:"timeout_source"`
	} `json:"budget"`
	Hang struct {
		MS      float64  `json:"ms"`
		IsError bool     `json:"isError"`
		Text    string   `json:"text"`
		Error   string   `json:"error"`
		Pids    []string `json:"pids"`
		Gone    bool     `json:"gone"`
	} `json:"hang"`
	Progress struct {
		IsError bool   `json:"isError"`
		Text    string `json:"text"`
		Error   string `json:"error"`
		Notes   []struct {
			Progress float64 `json:"progress"`
			Total    float64 `json:"total"`
		} `json:"notes"`
	} `json:"progress"`
	Cancel struct {
		Started  bool     `json:"started"`
		Answered bool     `json:"answered"`
		Error    string   `json:"error"`
		Pids     []string `json:"pids"`
		Gone     bool     `json:"gone"`
		MS       float64  `json:"ms"`
	} `json:"cancel"`
	Fast struct {
		IsError bool   `json:"isError"`
		Text    string `json:"text"`
	} `json:"fast"`
}

// runSDKClient runs client.mjs, the official MCP TypeScript SDK's client
// (pinned in testdata/mcpclient/package-lock.json), with env, and returns
// what it saw. Node.js carries the test's process marker, as does the
// timebox it starts over stdio, so what either leaves running is a leak.
func runSDKClient(t *testing.T, env ...string) sdkClientResult {
	t.Helper()
	var r sdkClientResult
	runNodeScript(t, "client.mjs", &r, env...)
	return r
}

// runNodeScript runs a script of testdata/mcpclient with env and decodes
// the JSON it prints into v.
func runNodeScript(t *testing.T, script string, v any, env ...string) {
	t.Helper()
	dir := testenv.NPM(t, filepath.Join("testdata", "mcpclient"))
	cmd := exec.Command("node", filepath.Join(dir, script))
	cmd.Env = append(proctest.Env(nil), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\nstdout %s\nstderr %s", script, err, stdout.String(), stderr.String())
		}
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not finish\nstdout %s\nstderr %s", script, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), v); err != nil {
		t.Fatalf("%s printed %q: %v\nstderr %s", script, stdout.String(), err, stderr.String())
	}
	t.Logf("%s: %s", script, stdout.String())
}

// checkSDKClient asserts what a real MCP client saw of the agent file of
// mcp_test.go, over either transport.
func checkSDKClient(t *testing.T, r sdkClientResult) {
	t.Helper()
	if r.Server.Name != "timebox" {
		t.Errorf("server %+v", r.Server)
	}
	if strings.Join(r.Tools, ",") != "fast,hang,progress,slow_hang" {
		t.Errorf("tools %v: want the exec tools", r.Tools)
	}
	if r.Budget.TimeoutMS != 1000 || r.Budget.TimeoutSource != "tool" {
		t.Errorf("hang's _meta budget %+v", r.Budget)
	}

	// The hung tool: a tool result with isError in about 1 s (its timeout,
	// then at most kill_grace 500ms), while the client would wait 20 s.
	var e struct {
		Error struct{ Type, Tool, Limit string } `json:"error"`
	}
	json.Unmarshal([]byte(r.Hang.Text), &e)
	if r.Hang.Error != "" || !r.Hang.IsError || e.Error.Type != "tool_timeout" || e.Error.Tool != "hang" || e.Error.Limit != "1s" {
		t.Errorf("hang: want an isError tool_timeout result, got %+v", r.Hang)
	}
	if r.Hang.MS < 1000 || r.Hang.MS > 5000 {
		t.Errorf("hang answered after %vms, want about 1.5 s (its 1s timeout, then kill_grace 500ms), far from the client's 20 s", r.Hang.MS)
	}
	if len(r.Hang.Pids) != 2 || !r.Hang.Gone {
		t.Errorf("hang's processes %v: gone %v", r.Hang.Pids, r.Hang.Gone)
	}

	if r.Progress.Error != "" || r.Progress.IsError || strings.TrimSpace(r.Progress.Text) != "done" {
		t.Errorf("progress: %+v", r.Progress)
	}
	if len(r.Progress.Notes) != 3 {
		t.Errorf("%d progress notifications reached onprogress, want 3: %+v", len(r.Progress.Notes), r.Progress.Notes)
	}
	for i, n := range r.Progress.Notes {
		if n.Progress != float64(i+1) || n.Total != 3 {
			t.Errorf("notification %d: %+v", i, n)
		}
	}

	// The AbortController's cancel: the SDK rejects the call and sends
	// notifications/cancelled; the tree (which ignores SIGTERM) is gone
	// after the cancel grace, min(kill_grace, 500ms).
	if !r.Cancel.Started || r.Cancel.Answered || len(r.Cancel.Pids) != 2 || !r.Cancel.Gone {
		t.Errorf("cancel: %+v", r.Cancel)
	}
	if r.Fast.IsError || strings.TrimSpace(r.Fast.Text) != `{"ok": true}` {
		t.Errorf("fast after the cancel: %+v", r.Fast)
	}
}

// TestMCPServeSDKClientStdio: the official MCP TypeScript SDK's client
// starts the built `timebox mcp serve` as a stdio server (as Claude
// Desktop does) and lists its tools, gets a hung tool's tool_timeout as a
// tool result, receives progress, and cancels a call with an
// AbortController, its process tree stopped.
func TestMCPServeSDKClientStdio(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	r := runSDKClient(t, "TB_TRANSPORT=stdio", "TB_BIN="+bin, "TB_AGENT="+filepath.Join(dir, "agent.yaml"),
		"TB_PIDS="+filepath.Join(dir, "pids"))
	checkSDKClient(t, r)
	checkPidsGone(t, dir)
}

// TestMCPServeSDKClientHTTP: the same over streamable HTTP, the client
// connecting to the URL with the bearer token.
func TestMCPServeSDKClientHTTP(t *testing.T) {
	bin := timeboxBinary(t)
	proctest.AfterTest(t)
	dir := writeMCPAgent(t)
	const token = "mcp-sdk-http-token-0123456789"
	cmd := exec.Command(bin, "mcp", "serve", "-f", filepath.Join(dir, "agent.yaml"), "--no-store", "--addr", "127.0.0.1:0")
	cmd.Env = append(proctest.Env(nil), "TIMEBOX_TOKEN="+token)
	srv := startMCPServeHTTP(t, cmd, `over MCP on (http://127\.0\.0\.1:\d+/mcp)`, 10*time.Second)
	url := srv.url
	r := runSDKClient(t, "TB_TRANSPORT=http", "TB_URL="+url, "TB_TOKEN="+token, "TB_PIDS="+filepath.Join(dir, "pids"))
	checkSDKClient(t, r)
	checkPidsGone(t, dir)
	if s := srv.stderr.String(); strings.Contains(s, "panic") {
		t.Errorf("stderr:\n%s", s)
	}
}
