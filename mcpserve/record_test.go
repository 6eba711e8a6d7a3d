//go:build linux

package mcpserve_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/mcpserve"
	"github.com/timebox-run/timebox/store"
)

// TestRecordsNameTheConnection: over streamable HTTP, the calls of one
// client share a session, mcp_ and its MCP session id, and two clients
// have two; each call's Turn, stored, reads back as a turn of that
// session with the call's record and events.
func TestRecordsNameTheConnection(t *testing.T) {
	h := startHTTP(t, httpToken)
	ctx := context.Background()
	a, b := connectHTTP(t, h, httpToken), connectHTTP(t, h, httpToken)
	st := store.NewMemory()
	defer st.Close()
	var got []mcpserve.Finished
	for i, client := range []*mcp.ClientSession{a, a, b} {
		if _, err := call(t, ctx, client, "echo", `{"text": "hi"}`, nil); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		f := <-h.finished
		got = append(got, f)
		if want := "mcp_" + client.ID(); f.SessionID != want {
			t.Errorf("call %d: session %q, want %q", i, f.SessionID, want)
		}
		tu := f.Turn("demo")
		if err := st.FinishTurn(ctx, tu, nil); err != nil {
			t.Fatal(err)
		}
		rec, err := st.Turn(ctx, tu.TurnID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.SessionID != f.SessionID || rec.Agent != "demo" || rec.Status != budget.StatusCompleted || rec.StopReason != budget.Answered ||
			rec.Input != `tools/call echo {"text":"hi"}` || len(rec.ToolCalls) != 1 {
			t.Fatalf("call %d stored as %+v", i, rec)
		}
		c := rec.ToolCalls[0]
		if c.Tool != "echo" || c.Kind != "exec" || c.Outcome != event.OutcomeOK || c.TimeoutMS != 10000 || c.TimeoutSource != budget.SourceTool ||
			c.CallID != f.CallID || !strings.Contains(c.Result, "hi") {
			t.Errorf("call %d's record: %+v", i, c)
		}
		evs, err := st.Events(ctx, tu.TurnID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, e := range evs {
			types = append(types, string(e.Type))
		}
		if strings.Join(types, " ") != "turn_started tool_started tool_finished turn_finished" {
			t.Errorf("call %d's events: %v", i, types)
		}
	}
	if got[0].SessionID != got[1].SessionID || got[0].SessionID == got[2].SessionID {
		t.Errorf("sessions %q %q %q: want one per client", got[0].SessionID, got[1].SessionID, got[2].SessionID)
	}
	s, err := st.Session(ctx, got[0].SessionID)
	if err != nil || len(s.Turns) != 2 {
		t.Errorf("session %s: %v, %+v", got[0].SessionID, err, s)
	}
}
