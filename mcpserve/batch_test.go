package mcpserve_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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
// under a protocol without batches (2025-06-18 and later) is answered
// with Invalid Request, id null, and the session goes on: a call running
// meanwhile is answered as it ends, and the next request is answered.
// Under 2025-03-26 the batch is answered as a batch. With the SDK's
// transport alone, the batch ended the session and stopped the call.
func TestStdioBatchIsAnsweredAndTheSessionGoesOn(t *testing.T) {
	for _, protocol := range []string{"2025-06-18", "2025-11-25", "2025-03-26"} {
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

// TestStdioBatchRightAfterInitialize: a batch sent right after the
// initialize, before its answer (a client writing its requests at once),
// is judged under the protocol the initialize negotiates: the transport
// waits for its answer before it reads the batch.
func TestStdioBatchRightAfterInitialize(t *testing.T) {
	ids, err := stdioSession(t, nil, []string{initialize,
		`[{"jsonrpc": "2.0", "id": 3, "method": "ping"}]`,
		`{"jsonrpc": "2.0", "id": 5, "method": "ping"}`}, make(chan struct{}), nil)
	if err != nil {
		t.Errorf("Serve: %v", err)
	}
	if got := strings.Join(ids, " "); got != "1 null 5" {
		t.Errorf("answers to %q, want to 1 null (the batch refused) 5", got)
	}
}

// TestStdioOldBatchesTheSDKWouldEndOn: under a protocol with batches
// (2025-03-26), a batch the SDK's transport cannot take — empty, with a
// member that is no message, with two requests of one id, or with a
// notification beside a request — is answered as JSON-RPC asks, and the
// session goes on. So is one whose request has the id of a call still
// running. The SDK's transport ended the session at the first
// three, and at two notifications in one batch; a notification beside a
// request left the batch's answer unwritten forever.
func TestStdioOldBatchesTheSDKWouldEndOn(t *testing.T) {
	const cancelled = `{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}`
	eof := make(chan struct{})
	slow := waitingTool("slow", func(context.Context) (any, error) {
		<-eof // running while every batch is read
		return "slow done", nil
	})
	answers, err := stdioLines(t, []agent.Tool{slow}, []string{strings.Replace(initialize, "2025-06-18", "2025-03-26", 1), initialized,
		`{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}`,
		`[{"jsonrpc": "2.0", "id": 6, "method": "ping"}]`,
		`[]`,
		`[1, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]`,
		`[{"jsonrpc": "2.0", "id": 3, "method": "ping"}, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]`,
		`[` + cancelled + `, {"jsonrpc": "2.0", "id": 4, "method": "ping"}]`,
		`[` + cancelled + `, ` + cancelled + `]`,
		`{"jsonrpc": "2.0", "id": 5, "method": "ping"}`}, eof, nil)
	if err != nil {
		t.Errorf("Serve: %v (the session ended at a batch)", err)
	}
	refused := map[string]string{
		"empty":      "Invalid Request: the batch is empty",
		"no message": "Invalid Request: the batch's member 1 is not a JSON-RPC message",
		"one id":     "Invalid Request: the batch has two requests of id 3",
		"running id": "Invalid Request: the batch's request of id 6 has the id of a request not yet answered",
	}
	var ids []string
	for _, line := range answers {
		var a rpcAnswer
		if json.Unmarshal([]byte(line), &a) == nil {
			if a.Error != nil && string(a.ID) == "null" && a.Error.Code == -32600 {
				for what, msg := range refused {
					if strings.HasPrefix(a.Error.Message, msg) {
						delete(refused, what)
					}
				}
				continue
			}
			ids = append(ids, string(a.ID))
			continue
		}
		var batch []rpcAnswer
		if json.Unmarshal([]byte(line), &batch) != nil {
			t.Fatalf("not JSON-RPC: %s", line)
		}
		for _, a := range batch {
			ids = append(ids, "["+string(a.ID)+"]")
		}
	}
	for what, msg := range refused {
		t.Errorf("the batch %s was not refused -32600, id null, %q; answers:\n%s", what, msg, strings.Join(answers, "\n"))
	}
	slices.Sort(ids)
	if got := strings.Join(ids, " "); got != "1 5 6 [4]" {
		t.Errorf("answered %q, want 1 5 6 [4] (the batch of a notification and request 4 answered as a batch of one, the call at the end of the input)", got)
	}
}

// TestHTTPBatchIsAnsweredAndTheSessionGoesOn: over streamable HTTP, a POST
// of a batch under a protocol without batches is answered 400 with the
// JSON-RPC error stdio answers (where the SDK answers a line of text), and
// the session goes on: a call running meanwhile is answered as it ends,
// and the next request is answered.
func TestHTTPBatchIsAnsweredAndTheSessionGoesOn(t *testing.T) {
	slow, started, release := blockedTool()
	s, err := mcpserve.New([]agent.Tool{slow}, mcpserve.Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/mcp"
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeStreamableHTTP(ctx, ln, nil) }()
	tr := &http.Transport{}
	defer func() {
		tr.CloseIdleConnections()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeStreamableHTTP: %v", err)
		}
	}()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "batch-test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tr}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	protocol := cs.InitializeResult().ProtocolVersion
	if protocol < "2025-06-18" {
		t.Fatalf("the SDK's client negotiated %s, which has batches", protocol)
	}
	answered := make(chan *mcp.CallToolResult, 1)
	go func() {
		r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}})
		if err != nil {
			t.Errorf("the call: %v", err)
		}
		answered <- r
	}()
	<-started
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // before the server stops, when the test fails

	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(
		` [{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, {"jsonrpc": "2.0", "id": 4, "method": "ping"}]`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", protocol)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var a rpcAnswer
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &a) != nil {
		t.Fatalf("the batch was answered %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	checkBatchRefusal(t, a, protocol)

	if err := cs.Ping(context.Background(), nil); err != nil {
		t.Errorf("the request after the batch: %v", err)
	}
	free()
	select {
	case r := <-answered:
		if r == nil || r.IsError || len(r.Content) != 1 || !strings.Contains(r.Content[0].(*mcp.TextContent).Text, "done") {
			t.Errorf("the call running during the batch was answered %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Error("the call running during the batch was not answered")
	}
}
