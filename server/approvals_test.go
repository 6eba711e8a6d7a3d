package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/tool"
)

// deployTool needs approval and takes d.
func deployTool(d time.Duration) agent.Tool {
	tl := goTool("deploy", budget.Cooperative, time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		select {
		case <-time.After(d):
			return "deployed", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	tl.NeedsApproval = agent.ApprovalRequired
	return tl
}

var deployThenAnswer = []string{`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "done"}`}

// waitFor reads sse until an event of type typ and returns its data.
func waitFor(t *testing.T, sse *sseReader, typ string) string {
	t.Helper()
	evs := sse.until(t, typ)
	return evs[len(evs)-1].data
}

// A call approved through the route after a 2s wait runs on its own 1s
// timeout; a second decision is refused (409), an unknown call is 404.
func TestApproveThroughTheRoute(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, deployThenAnswer...), deployTool(500*time.Millisecond))})
	resp, sse := e.stream(context.Background(), map[string]any{"input": "deploy"})
	defer resp.Body.Close()
	data := waitFor(t, sse, "approval_requested")
	var req event.ApprovalRequested
	var hdr struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.Unmarshal([]byte(data), &req); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal([]byte(data), &hdr)
	turnID := hdr.TurnID
	list := decode[server.ApprovalList](t, e.do("GET", "/v1/turns/"+turnID+"/approvals", nil), http.StatusOK)
	if len(list.Approvals) != 1 || list.Approvals[0].CallID != req.CallID || list.Approvals[0].Decision != "" {
		t.Fatalf("pending approvals: %+v", list)
	}
	time.Sleep(2 * time.Second) // a person thinking: longer than the tool's timeout
	er := decode[apiError](t, e.do("POST", "/v1/turns/"+turnID+"/approvals/call_9_9", map[string]any{"decision": "approve"}), http.StatusNotFound)
	if er.Error.Code != "not_found" {
		t.Fatalf("unknown call: %+v", er)
	}
	decode[apiError](t, e.do("POST", "/v1/turns/"+turnID+"/approvals/"+req.CallID, map[string]any{"decision": "maybe"}), http.StatusBadRequest)
	ap := decode[store.Approval](t, e.do("POST", "/v1/turns/"+turnID+"/approvals/"+req.CallID,
		map[string]any{"decision": "approve", "reason": "ship it", "by": "alice"}), http.StatusOK)
	if ap.Decision != event.Approve || ap.By != "alice" {
		t.Fatalf("decision %+v", ap)
	}
	er = decode[apiError](t, e.do("POST", "/v1/turns/"+turnID+"/approvals/"+req.CallID, map[string]any{"decision": "deny"}), http.StatusConflict)
	if er.Error.Code != "already_decided" {
		t.Fatalf("second decision: %+v", er)
	}
	var dec event.ApprovalDecided
	if err := json.Unmarshal([]byte(waitFor(t, sse, "approval_decided")), &dec); err != nil || dec.By != "alice" || dec.WaitedMS < 2000 {
		t.Fatalf("approval_decided %+v, %v", dec, err)
	}
	waitFor(t, sse, "turn_finished")
	rec := e.waitEnded(turnID)
	if len(rec.ToolCalls) != 1 {
		t.Fatalf("records %+v", rec.ToolCalls)
	}
	c := rec.ToolCalls[0]
	// ok: its 1s timeout did not count the 2s wait. Its duration does not
	// either (the tool takes 500ms; a loaded machine may stretch that,
	// never to the wait's 2s).
	if c.Outcome != event.OutcomeOK || c.ApprovalMS < 2000 || c.DurationMS >= 2000 || rec.ApprovalMS < 2000 {
		t.Fatalf("call %s in %dms after %dms waiting; turn approval_ms %d", c.Outcome, c.DurationMS, c.ApprovalMS, rec.ApprovalMS)
	}
	metrics := e.do("GET", "/metrics", nil)
	b, _ := io.ReadAll(metrics.Body)
	metrics.Body.Close()
	for _, want := range []string{`timebox_approvals_total{decision="approve"} 1`, "timebox_approval_wait_seconds_count 1"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// A call that expires is 409 expired afterwards; its record says
// approval_expired.
func TestApprovalExpiresThroughTheServer(t *testing.T) {
	dep := deployTool(0)
	dep.ApprovalTimeout = budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceTool, Knob: "tools[deploy].approval_timeout"}
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, deployThenAnswer...), dep)})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "deploy", "detach": true}), http.StatusAccepted)
	rec := e.waitEnded(acc.TurnID)
	if c := rec.ToolCalls[0]; c.Outcome != event.OutcomeApprovalExpired || c.Phase != budget.PhaseApproval {
		t.Fatalf("record %s %s", c.Outcome, c.Phase)
	}
	er := decode[apiError](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/approvals/call_1_1", map[string]any{"decision": "approve"}), http.StatusConflict)
	if er.Error.Code != "expired" {
		t.Fatalf("a decision after the expiry: %+v", er)
	}
}

// waitEnded polls a turn's record until it has ended.
func (e *env) waitEnded(id string) rawRecord {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		rec := e.record(id)
		if rec.Status != budget.StatusRunning {
			return rec
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("turn %s did not end", id)
	return rawRecord{}
}

// waitPending polls until call id of turn waits for a decision.
func (e *env) waitPending(id string) store.Approval {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp := e.do("GET", "/v1/turns/"+id+"/approvals", nil)
		if resp.StatusCode == http.StatusOK {
			list := decode[server.ApprovalList](e.t, resp, http.StatusOK)
			if len(list.Approvals) > 0 && list.Approvals[0].Decision == "" {
				return list.Approvals[0]
			}
		} else {
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("turn %s has no call waiting for a decision", id)
	return store.Approval{}
}

// Two gateways on one PostgreSQL: a call waiting in A is denied through
// B; A hears of it at once, the call is not run, and the model is told.
func TestDecideOnAnotherGateway(t *testing.T) {
	dsn := testenv.Postgres(t)
	ran := make(chan struct{}, 1)
	dep := goTool("deploy", budget.Cooperative, time.Second, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		ran <- struct{}{}
		return "deployed", nil
	})
	dep.NeedsApproval = agent.ApprovalRequired
	a := newEnv(t, server.Config{Store: openNotified(t, dsn), Agent: newAgent(t, scripted(t, deployThenAnswer...), dep)})
	b := newEnv(t, server.Config{Store: openNotified(t, dsn), Agent: newAgent(t, scripted(t, `{"text": "never asked"}`))})
	acc := decode[server.TurnAccepted](t, a.do("POST", "/v1/turns", map[string]any{"input": "deploy", "detach": true}), http.StatusAccepted)
	p := b.waitPending(acc.TurnID)
	start := time.Now()
	ap := decode[store.Approval](t, b.do("POST", "/v1/turns/"+acc.TurnID+"/approvals/"+p.CallID,
		map[string]any{"decision": "deny", "reason": "not today", "by": "bob"}), http.StatusAccepted)
	if ap.Decision != event.Deny {
		t.Fatalf("decision %+v", ap)
	}
	rec := b.waitEnded(acc.TurnID)
	if took := time.Since(start); took > approvalHeard {
		t.Errorf("the turn took %s to hear of the decision, want under %s", took, approvalHeard)
	}
	c := rec.ToolCalls[0]
	if c.Outcome != event.OutcomeDenied || c.Approval == nil || c.Approval.By != "bob" || !strings.Contains(c.Result, "not today") {
		t.Fatalf("record %+v", c)
	}
	select {
	case <-ran:
		t.Fatal("a denied call ran")
	default:
	}
}

// approvalHeard bounds how long a gateway takes to hear of a decision
// made through another, with notifications: far less than the poll.
const approvalHeard = 1500 * time.Millisecond

// A turn cancelled while a call waits records the call as not run; a
// decision after that is refused (409 already_ended), not stored for
// nobody to act on.
func TestDecisionAfterTheTurnEnded(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, deployThenAnswer...), deployTool(0))})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "deploy", "detach": true}), http.StatusAccepted)
	p := e.waitPending(acc.TurnID)
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusOK)
	if c := rec.ToolCalls[0]; c.Outcome != event.OutcomeCancelled || c.Refused != "cancelled" || !strings.Contains(c.Result, "waited for a person's decision") {
		t.Fatalf("the waiting call: %s %q: %s", c.Outcome, c.Refused, c.Result)
	}
	er := decode[apiError](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/approvals/"+p.CallID, map[string]any{"decision": "approve"}), http.StatusConflict)
	if er.Error.Code != "already_ended" {
		t.Fatalf("a decision after the turn ended: %+v", er)
	}
}

// A restart of serve while a call waits for a person: the stopping server
// suspends the turn (it waits for nothing but people), the next one on the
// same store resumes it, and a decision through it runs the call once. The
// turn ends as if never interrupted: one record per call, its events
// numbered without a gap, the time it was down counted as a wait for
// people.
func TestRestartWhileWaitingForApproval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	open := func() store.Store {
		st, err := sqlite.Open(path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	ran := make(chan struct{}, 2)
	newDeploy := func() agent.Tool {
		dep := goTool("deploy", budget.Cooperative, time.Second, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			ran <- struct{}{}
			return "deployed", nil
		})
		dep.NeedsApproval = agent.ApprovalRequired
		return dep
	}
	stA := open()
	// The bare script provider (not wrapped): it keeps each conversation's
	// place in its script (model.Resumable).
	a := newEnv(t, server.Config{Store: stA, Agent: newAgent(t, scripted(t, deployThenAnswer...).Provider, newDeploy())})
	acc := decode[server.TurnAccepted](t, a.do("POST", "/v1/turns", map[string]any{"input": "deploy", "detach": true, "session_id": "s_restart"}), http.StatusAccepted)
	p := a.waitPending(acc.TurnID)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	stA.Close()

	stB := open()
	if rec, err := stB.Turn(context.Background(), acc.TurnID); err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("after the first server stopped: %+v, %v", rec, err)
	}
	time.Sleep(time.Second) // the server is down a while
	// The same agent file: its script model goes on from where the first
	// server left it (the conversation's provider state is in the
	// checkpoint), not from its first line.
	b := newEnv(t, server.Config{Store: stB, Agent: newAgent(t, scripted(t, deployThenAnswer...).Provider, newDeploy())})
	ap := decode[store.Approval](t, b.do("POST", "/v1/turns/"+acc.TurnID+"/approvals/"+p.CallID,
		map[string]any{"decision": "approve", "by": "alice"}), http.StatusOK)
	if ap.Decision != event.Approve {
		t.Fatalf("decision %+v", ap)
	}
	rec := b.waitEnded(acc.TurnID)
	if rec.Status != budget.StatusCompleted || rec.Answer != "done" {
		t.Fatalf("the resumed turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	if len(ran) != 1 || len(rec.ToolCalls) != 1 {
		t.Fatalf("the call ran %d times; %d records", len(ran), len(rec.ToolCalls))
	}
	c := rec.ToolCalls[0]
	if c.Outcome != event.OutcomeOK || c.ApprovalMS < 1000 || rec.ApprovalMS < 1000 || c.Approval.By != "alice" {
		t.Fatalf("call %s after %dms (turn %dms) by %+v", c.Outcome, c.ApprovalMS, rec.ApprovalMS, c.Approval)
	}
	asked := 0
	for i, raw := range rec.Events {
		var e struct {
			Seq  int64  `json:"seq"`
			Type string `json:"type"`
		}
		json.Unmarshal(raw, &e)
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d: a gap across the restart", i, e.Seq)
		}
		if e.Type == "approval_requested" {
			asked++
		}
	}
	if asked != 1 {
		t.Errorf("asked %d times, want once", asked)
	}
	// The session is free again.
	decode[server.TurnAccepted](t, b.do("POST", "/v1/turns", map[string]any{"input": "again", "detach": true, "session_id": "s_restart"}), http.StatusAccepted)
}

// TestADecisionForAnEngineTurnIsAccepted: a decision for a call that
// waits on an engine's worker is 202, as the docs say, even through the
// gateway that follows its turn (it was 200 there: the call does not
// wait in that server).
func TestADecisionForAnEngineTurnIsAccepted(t *testing.T) {
	st := openStore(t)
	e := newEnv(t, server.Config{Store: st, Agent: engineRunner{a: newAgent(t, scripted(t, deployThenAnswer...), deployTool(0)), st: st}})
	resp, sse := e.stream(context.Background(), map[string]any{"input": "deploy"})
	defer resp.Body.Close()
	var req event.ApprovalRequested
	if err := json.Unmarshal([]byte(waitFor(t, sse, "approval_requested")), &req); err != nil {
		t.Fatal(err)
	}
	turnID := resp.Header.Get("Timebox-Turn-Id")
	decode[store.Approval](t, e.do("POST", "/v1/turns/"+turnID+"/approvals/"+req.CallID, map[string]any{"decision": "approve", "by": "alice"}), http.StatusAccepted)
	waitFor(t, sse, "turn_finished")
}
