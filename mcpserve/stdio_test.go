package mcpserve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/agent"
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
	go func() { served <- s.Serve(ctx, mcpserve.Stdio(inR, outW)) }()
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
