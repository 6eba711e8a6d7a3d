package cli_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/syncbuf"
)

// `timebox mcp serve` does not serve a tool whose calls need approval —
// an MCP client cannot ask a person — and says so: on stderr when it
// starts, and to a client that calls it (not "unknown tool").
func TestMCPServeLeavesOutToolsThatNeedApproval(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tool.sh"), []byte("#!/bin/sh\ncat >/dev/null\necho ok\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "ok"}`+"\n"), 0o644)
	agentFile := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agentFile, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+
		"  - {name: read, exec: [./tool.sh]}\n"+
		"  - {name: deploy, exec: [./tool.sh], approval: required}\n"), 0o644)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var errb syncbuf.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(ctx, []string{"mcp", "serve", "-f", agentFile, "--no-store"}, cli.IO{In: inR, Out: outW, Err: &errb})
		outW.Close()
	}()
	client := mcp.NewClient(&mcp.Implementation{Name: "approval-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	_, callErr := cs.CallTool(ctx, &mcp.CallToolParams{Name: "deploy", Arguments: map[string]any{}})
	cs.Close()
	inW.Close()
	cancel()
	<-exited
	if strings.Join(names, ",") != "read" {
		t.Errorf("served %v, want only read", names)
	}
	if callErr == nil || !strings.Contains(callErr.Error(), `tool "deploy" is not served: its calls need a person's approval (approval: required`) ||
		!strings.Contains(callErr.Error(), "remove approval: required") {
		t.Errorf("calling deploy: %v, want why it is not served and how to serve it", callErr)
	}
	if !strings.Contains(errb.String(), "not serving deploy: its calls need approval") {
		t.Errorf("stderr does not say why deploy is left out:\n%s", errb.String())
	}
}
