package mcpserve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/mcpserve"
)

// rpcAnswer is a JSON-RPC response, as a client reads it.
type rpcAnswer struct {
	ID    json.RawMessage `json:"id"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Result json.RawMessage `json:"result"`
}

// blockedTool is a tool whose calls say when they start and answer "done"
// once release is closed.
func blockedTool() (t agent.Tool, started, release chan struct{}) {
	started, release = make(chan struct{}, 8), make(chan struct{})
	return waitingTool("slow", func(ctx context.Context) (any, error) {
		started <- struct{}{}
		select {
		case <-release:
			return "done", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}), started, release
}

// checkBatchRefusal fails t unless a is the answer to a batch refused
// under protocol.
func checkBatchRefusal(t *testing.T, a rpcAnswer, protocol string) {
	t.Helper()
	if string(a.ID) != "null" || a.Error == nil || a.Error.Code != -32600 ||
		!strings.Contains(a.Error.Message, "batches are not supported under MCP protocol "+protocol) ||
		!strings.Contains(a.Error.Message, "send the requests one by one") {
		t.Errorf("the batch was answered id %s, error %+v; want id null, -32600 saying batches are not supported under %s, one by one", a.ID, a.Error, protocol)
	}
}

// TestStdioBatchIsAnsweredAndTheSessionGoesOn: on stdio, a JSON-RPC batch
// under 2025-03-26 is answered as a batch and the session goes on: a call
// running meanwhile is answered as it ends, and the next request is
// answered. Until 2026-11-28 the transport wrote the batch's first message
// over the line it passed on, and the SDK ended the session at it.
func TestStdioBatchIsAnsweredAndTheSessionGoesOn(t *testing.T) {
	for _, protocol := range []string{"2025-03-26"} {
		t.Run(protocol, func(t *testing.T) {
			slow, started, release := blockedTool()
			s, err := mcpserve.New([]agent.Tool{slow}, mcpserve.Options{Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			served := make(chan error, 1)
			go func() {
				served <- s.Serve(context.Background(), mcpserve.Stdio(inR, outW, nil))
				outW.Close()
			}()
			answers := make(chan string)
			go func() {
				defer close(answers)
				sc := bufio.NewScanner(outR)
				for sc.Scan() {
					answers <- sc.Text()
				}
			}()
			defer func() {
				inW.Close() // the end of the requests: Serve returns once all are answered
				for range answers {
				}
				select {
				case err := <-served:
					if err != nil {
						t.Errorf("Serve: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Error("Serve did not return after the end of its input")
				}
			}()
			send := func(lines ...string) {
				t.Helper()
				if _, err := io.WriteString(inW, strings.Join(lines, "\n")+"\n"); err != nil {
					t.Fatal(err)
				}
			}
			next := func() string {
				t.Helper()
				select {
				case line, ok := <-answers:
					if !ok {
						t.Fatal("the session ended")
					}
					return line
				case <-time.After(10 * time.Second):
					t.Fatal("no answer in 10s")
				}
				return ""
			}
			answer := func() (a rpcAnswer) {
				t.Helper()
				line := next()
				if err := json.Unmarshal([]byte(line), &a); err != nil {
					t.Fatalf("not one JSON-RPC response: %s", line)
				}
				return a
			}

			send(strings.Replace(initialize, "2025-06-18", protocol, 1), initialized)
			if a := answer(); string(a.ID) != "1" || !strings.Contains(string(a.Result), `"protocolVersion":"`+protocol+`"`) {
				t.Fatalf("initialize answered %s %s", a.ID, a.Result)
			}
			send(`{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}`)
			<-started
			send(`[{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 4, "method": "ping"}]`)
			if protocol < "2025-06-18" {
				var batch []rpcAnswer
				if line := next(); json.Unmarshal([]byte(line), &batch) != nil || len(batch) != 2 {
					t.Fatalf("the batch was answered %s, want a batch of two answers", line)
				}
			} else {
				checkBatchRefusal(t, answer(), protocol)
			}
			send(`{"jsonrpc": "2.0", "id": 5, "method": "ping"}`)
			if a := answer(); string(a.ID) != "5" || a.Error != nil {
				t.Errorf("the request after the batch was answered %s %+v", a.ID, a.Error)
			}
			close(release)
			if a := answer(); string(a.ID) != "2" || a.Error != nil || !strings.Contains(string(a.Result), `"text":"done"`) || strings.Contains(string(a.Result), `"isError":true`) {
				t.Errorf("the call running during the batch was answered %s %s %+v", a.ID, a.Result, a.Error)
			}
		})
	}
}
