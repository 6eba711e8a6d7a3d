package mcptool

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/event"
)

// TestHTTPServerGone: a streamable HTTP server that went away fails the
// call saying it could not be reached (it said the server "refused the
// call … rejected by transport (JSON-RPC error -32005)", an error of the
// SDK's, and kept the dead session), and once it is back the next call
// connects again.
func TestHTTPServerGone(t *testing.T) {
	f := newFake()
	// The sessions the first server had when it went away are the
	// test's to end.
	defer func() {
		for ss := range f.srv.Sessions() {
			ss.Close()
		}
	}()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return f.srv }, nil)
	serve := func(addr string) (*http.Server, string) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: h}
		go hs.Serve(ln)
		return hs, ln.Addr().String()
	}
	hs, addr := serve("127.0.0.1:0")
	s, err := Open(context.Background(), Config{Name: "web", URL: "http://" + addr, Budget: tb(5*time.Second, 0), KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x, _ := call(context.Background(), t, s, "echo", `{"text": "one"}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
	hs.Close()
	x, _ = call(context.Background(), t, s, "echo", `{"text": "two"}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeError, "")
	// Refused, or the kept-alive connection closed under the request.
	if msg := x.Err.Error(); !strings.Contains(msg, `could not be reached (`) && !strings.Contains(msg, `MCP server "web" closed the connection`) {
		t.Errorf("error %q", msg)
	}
	hs, _ = serve(addr)
	defer hs.Close()
	x, _ = call(context.Background(), t, s, "echo", `{"text": "three"}`, tb(5*time.Second, 0))
	wantOutcome(t, x, event.OutcomeOK, "")
}
