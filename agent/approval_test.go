package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// after returns an Approver that decides every call d after it is asked.
func after(wait time.Duration, d event.Decision, by, reason string) agent.Approver {
	return agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
		select {
		case <-time.After(wait):
			return agent.Decision{Decision: d, By: by, Reason: reason}, nil
		case <-ctx.Done():
			return agent.Decision{}, ctx.Err()
		}
	})
}

// sleepy is a tool that needs approval and takes d.
func sleepy(name string, timeout, d time.Duration) agent.Tool {
	tl := goTool(name, budget.Cooperative, timeout, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		select {
		case <-time.After(d):
			return "done", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	tl.NeedsApproval = agent.ApprovalRequired
	return tl
}

func approvalBudgets() budget.Budgets {
	return budget.Budgets{Approval: secs(time.Minute, budget.SourceDefault, budget.KeyApproval)}
}

// A 1s tool approved after a 2s wait runs ok: its timeout starts when it
// starts, and its record keeps the wait apart.
func TestApprovedCallRunsOnItsOwnTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "deployed"}`)
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 900*time.Millisecond)},
			budgets: approvalBudgets(), approver: after(2*time.Second, event.Approve, "alice", "go ahead")}.run(t, t.Context(), "deploy")
		if res.Record.StopReason != budget.Answered {
			t.Fatalf("stop %s: %s", res.Record.StopReason, res.Record.Message)
		}
		tr := toolRecord(t, res, "deploy")
		checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeOK, DurationMS: 900, ApprovalMS: 2000,
			Approval: &event.Approval{Decision: event.Approve, By: "alice", Reason: "go ahead"}},
			"Outcome", "DurationMS", "ApprovalMS", "Approval")
		if res.Record.ApprovalMS != 2000 || res.Record.Totals().ApprovalMS != 2000 {
			t.Errorf("turn approval_ms %d, want 2000", res.Record.ApprovalMS)
		}
		req := rec.ofType(event.TypeApprovalRequested)
		dec := rec.ofType(event.TypeApprovalDecided)
		if len(req) != 1 || len(dec) != 1 {
			t.Fatalf("%d approval_requested, %d approval_decided", len(req), len(dec))
		}
		r := req[0].Data.(*event.ApprovalRequested)
		if r.CallID != "call_1_1" || r.Tool != "deploy" || !r.ExpiresAt.Equal(req[0].At.Add(time.Minute)) || r.Knob != budget.KeyApproval {
			t.Errorf("approval_requested %+v at %s", r, req[0].At)
		}
		d := dec[0].Data.(*event.ApprovalDecided)
		if d.Decision != event.Approve || d.By != "alice" || d.WaitedMS != 2000 {
			t.Errorf("approval_decided %+v", d)
		}
		// The order a follower sees: asked, decided, then the tool runs.
		var order []event.Type
		for _, e := range rec.events {
			switch e.Type {
			case event.TypeApprovalRequested, event.TypeApprovalDecided, event.TypeToolStarted, event.TypeToolFinished:
				order = append(order, e.Type)
			}
		}
		want := []event.Type{event.TypeApprovalRequested, event.TypeApprovalDecided, event.TypeToolStarted, event.TypeToolFinished}
		if strings.Join(typeNames(order), " ") != strings.Join(typeNames(want), " ") {
			t.Errorf("events %v, want %v", order, want)
		}
	})
}

func typeNames(ts []event.Type) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

// step: 1s does not fire while a call waits 3s for a person, and the turn's
// ceiling does not count the wait.
func TestApprovalWaitIsNotTheTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "deployed"}`)
		b := approvalBudgets()
		b.Step = secs(time.Second, budget.SourceFile, budget.KeyStep)
		b.Turn = secs(2*time.Second, budget.SourceFile, budget.KeyTurn)
		start := time.Now()
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 500*time.Millisecond)},
			budgets: b, approver: after(3*time.Second, event.Approve, "bob", "")}.run(t, t.Context(), "deploy")
		if res.Record.StopReason != budget.Answered {
			t.Fatalf("stop %s: %s", res.Record.StopReason, res.Record.Message)
		}
		if got := time.Since(start); got != 3500*time.Millisecond {
			t.Errorf("the turn took %s, want 3.5s", got)
		}
		if r := res.Record; r.WallMS != 3500 || r.ApprovalMS != 3000 || r.ToolMS != 500 {
			t.Errorf("wall %d, approval %d, tool %d ms; want 3500, 3000, 500", r.WallMS, r.ApprovalMS, r.ToolMS)
		}
	})
}

// The ceiling runs while another call of the batch works, and stops the
// turn there, waits or not.
func TestTurnCeilingRunsWhileACallWorks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}, {"name": "crawl", "arguments": {}}]}`, `{"text": "done"}`)
		b := approvalBudgets()
		b.Turn = secs(2*time.Second, budget.SourceFile, budget.KeyTurn)
		crawl := goTool("crawl", budget.Cooperative, time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		start := time.Now()
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 0), crawl},
			budgets: b, approver: after(time.Hour, event.Approve, "", "")}.run(t, t.Context(), "go")
		if res.Record.StopReason != budget.TurnTimeout {
			t.Fatalf("stop %s: %s", res.Record.StopReason, res.Record.Message)
		}
		if got := time.Since(start); got > 2*time.Second+budget.CancelGrace+time.Second {
			t.Errorf("the turn ended after %s", got)
		}
		d := toolRecord(t, res, "deploy")
		if d.Outcome != event.OutcomeCancelled || d.Refused != "cancelled" {
			t.Errorf("the waiting call: %s %q", d.Outcome, d.Refused)
		}
	})
}

func TestApprovalExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "could not deploy"}`)
		dep := sleepy("deploy", time.Second, 0)
		dep.ApprovalTimeout = secs(5*time.Second, budget.SourceTool, "tools[deploy].approval_timeout in agent.yaml")
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{dep},
			budgets: approvalBudgets(), approver: after(time.Hour, event.Approve, "", "")}.run(t, t.Context(), "deploy")
		if res.Record.StopReason != budget.Answered {
			t.Fatalf("stop %s: %s", res.Record.StopReason, res.Record.Message)
		}
		tr := toolRecord(t, res, "deploy")
		checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeApprovalExpired, Phase: budget.PhaseApproval, Refused: "approval_expired",
			ApprovalMS: 5000, Approval: &event.Approval{Decision: event.Expired}}, "Outcome", "Phase", "Refused", "ApprovalMS", "Approval")
		ei := errorInfo(t, tr.Result)
		if ei.Type != "approval_expired" || ei.Knob != "tools[deploy].approval_timeout in agent.yaml" || ei.Limit != "5s" {
			t.Errorf("result %s", tr.Result)
		}
		if len(rec.ofType(event.TypeToolStarted)) != 0 {
			t.Error("an expired call started")
		}
		if d := rec.ofType(event.TypeApprovalDecided); len(d) != 1 || d[0].Data.(*event.ApprovalDecided).Decision != event.Expired {
			t.Errorf("approval_decided %v", d)
		}
		if got := p.last().Messages; got[len(got)-1].Content != tr.Result {
			t.Errorf("the model was told %q", got[len(got)-1].Content)
		}
	})
}

func TestDeniedCallIsNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}, {"name": "echo", "arguments": {}}]}`, `{"text": "ok"}`)
		ran := false
		dep := sleepy("deploy", time.Second, 0)
		dep.Tool = tool.NewFunc("deploy", "test tool", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			ran = true
			return "deployed", nil
		})
		echo := goTool("echo", budget.Cooperative, time.Second, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "hi", nil })
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{dep, echo},
			budgets: approvalBudgets(), approver: after(time.Second, event.Deny, "carol", "not on a Friday")}.run(t, t.Context(), "deploy")
		if ran || res.Record.StopReason != budget.Answered {
			t.Fatalf("ran %v; stop %s", ran, res.Record.StopReason)
		}
		tr := toolRecord(t, res, "deploy")
		ei := errorInfo(t, tr.Result)
		if tr.Outcome != event.OutcomeDenied || ei.Type != "tool_denied" || !strings.Contains(ei.Message, "not on a Friday") || !strings.Contains(ei.Message, "carol") {
			t.Errorf("record %s, result %s", tr.Outcome, tr.Result)
		}
		if e := toolRecord(t, res, "echo"); e.Outcome != event.OutcomeOK || e.Approval != nil {
			t.Errorf("the other call: %+v", e)
		}
		if tot := res.Record.Totals(); tot.ToolCalls != 1 || tot.ToolCallsRefused != 1 {
			t.Errorf("totals %+v", tot)
		}
	})
}

// An Approver that panics denies the call, saying so, rather than ending
// the process; one that ignores its context is abandoned CancelGrace after
// the call's approval_timeout, and the call expires: the turn goes on.
func TestAnApproverThatMisbehaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "ok"}`)
		panics := agent.ApproverFunc(func(context.Context, agent.ApprovalRequest) (agent.Decision, error) { panic("approver") })
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 0)},
			budgets: approvalBudgets(), approver: panics}.run(t, t.Context(), "deploy")
		if tr := toolRecord(t, res, "deploy"); tr.Outcome != event.OutcomeDenied || !strings.Contains(tr.Result, "the approver panicked: approver") {
			t.Errorf("a panicking approver: %s: %s", tr.Outcome, tr.Result)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "ok"}`)
		release := make(chan struct{})
		defer close(release)
		deaf := agent.ApproverFunc(func(context.Context, agent.ApprovalRequest) (agent.Decision, error) {
			<-release
			return agent.Decision{Decision: event.Approve}, nil
		})
		dep := sleepy("deploy", time.Second, 0)
		dep.ApprovalTimeout = secs(5*time.Second, budget.SourceTool, "tools[deploy].approval_timeout in agent.yaml")
		start := time.Now()
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{dep},
			budgets: approvalBudgets(), approver: deaf}.run(t, t.Context(), "deploy")
		if tr := toolRecord(t, res, "deploy"); tr.Outcome != event.OutcomeApprovalExpired {
			t.Errorf("a deaf approver: %s: %s", tr.Outcome, tr.Result)
		}
		if took := time.Since(start); took != 5*time.Second+budget.CancelGrace {
			t.Errorf("the turn took %s, want the approval timeout and the grace", took)
		}
	})
}

// Without an Approver nobody can decide: the call is denied at once, saying
// why.
func TestNoApproverDenies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "ok"}`)
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 0)},
			budgets: approvalBudgets()}.run(t, t.Context(), "deploy")
		tr := toolRecord(t, res, "deploy")
		if tr.Outcome != event.OutcomeDenied || !strings.Contains(tr.Result, "agent.Input.Approver") {
			t.Errorf("record %s: %s", tr.Outcome, tr.Result)
		}
	})
}

// A decision made long before the call could start is not acted on: the
// call is asked for again.
func TestStaleApprovalIsAskedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "ok"}`)
		rounds := 0
		stale := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
			rounds++
			if req.Round == 1 {
				return agent.Decision{Decision: event.Approve, By: "dave", At: time.Now().Add(-time.Hour)}, nil
			}
			return agent.Decision{Decision: event.Deny, By: "dave", Reason: "changed my mind"}, nil
		})
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 0)},
			budgets: approvalBudgets(), approver: stale}.run(t, t.Context(), "deploy")
		if rounds != 2 || toolRecord(t, res, "deploy").Outcome != event.OutcomeDenied {
			t.Fatalf("%d rounds, outcome %s", rounds, toolRecord(t, res, "deploy").Outcome)
		}
		dec := rec.ofType(event.TypeApprovalDecided)
		if len(dec) != 2 || !dec[0].Data.(*event.ApprovalDecided).Stale || rec.ofType(event.TypeApprovalRequested)[1].Data.(*event.ApprovalRequested).Round != 2 {
			t.Errorf("decided %d times; first stale: %v", len(dec), dec[0].Data.(*event.ApprovalDecided).Stale)
		}
	})
}

// The channel Approver hands requests to a program; a decision after the
// call expired is refused.
func TestApprovalChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "ok"}`)
		ch := make(chan *agent.PendingApproval)
		go func() {
			pa := <-ch
			if pa.Tool != "deploy" || string(pa.Arguments) != `{"env": "prod"}` {
				t.Errorf("request %+v", pa.ApprovalRequest)
			}
			if !pa.Decide(agent.Decision{Decision: event.Approve, By: "erin"}) || pa.Decide(agent.Decision{Decision: event.Deny}) {
				t.Error("Decide: want the first to count, the second refused")
			}
		}()
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{sleepy("deploy", time.Second, 0)},
			budgets: approvalBudgets(), approver: agent.ApprovalChannel(ch)}.run(t, t.Context(), "deploy")
		if tr := toolRecord(t, res, "deploy"); tr.Outcome != event.OutcomeOK || tr.Approval.By != "erin" {
			t.Errorf("record %+v", tr)
		}
	})
}

// NeedsApproval decides per call from its arguments.
func TestNeedsApprovalDecidesPerCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {"env": "dev"}}, {"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "ok"}`)
		dep := sleepy("deploy", time.Second, 0)
		dep.NeedsApproval = func(args json.RawMessage) bool { return strings.Contains(string(args), "prod") }
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{dep},
			budgets: approvalBudgets(), approver: after(time.Second, event.Approve, "frank", "")}.run(t, t.Context(), "deploy")
		req := rec.ofType(event.TypeApprovalRequested)
		if len(req) != 1 || req[0].Data.(*event.ApprovalRequested).CallID != "call_1_2" {
			t.Fatalf("approval_requested %v", req)
		}
		if res.Record.ToolCalls[0].Approval != nil && res.Record.ToolCalls[1].Approval != nil {
			t.Error("both calls waited")
		}
	})
}

// A turn waiting for nothing but a person suspends when asked to; resumed
// from its checkpoint (through JSON, as a server stores it), its call waits
// again, runs once approved, and the turn ends as if never suspended: its
// seqs go on, its other call is not run again, and the suspended time is a
// wait for people.
func TestSuspendAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "echo", "arguments": {}}, {"name": "deploy", "arguments": {}}]}`, `{"text": "deployed"}`)
		echoes := 0
		echo := goTool("echo", budget.Cooperative, time.Second, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			echoes++
			return "hi", nil
		})
		a, err := agent.New(agent.Config{Name: "test", Models: []model.Endpoint{endpoint(p, "m")},
			Tools: []agent.Tool{echo, sleepy("deploy", time.Second, 100*time.Millisecond)}, Budgets: approvalBudgets()})
		if err != nil {
			t.Fatal(err)
		}
		suspend := make(chan struct{})
		waiting := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
			close(suspend) // the server stops while the call waits
			<-ctx.Done()
			return agent.Decision{}, ctx.Err()
		})
		rec1 := &recorder{}
		res := a.Run(t.Context(), agent.Input{TurnID: "t_s", Text: "deploy", Approver: waiting, Suspend: suspend}, rec1)
		if res.Suspended == nil || res.Record != nil {
			t.Fatalf("not suspended: %+v", res.Record)
		}
		if n := len(rec1.ofType(event.TypeTurnFinished)); n != 0 {
			t.Fatalf("%d turn_finished before the suspension", n)
		}
		b, err := json.Marshal(res.Suspended)
		if err != nil {
			t.Fatal(err)
		}
		var cp agent.Checkpoint
		if err := json.Unmarshal(b, &cp); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // the server is down
		rec2 := &recorder{}
		res, err = a.Resume(t.Context(), &cp, agent.Input{Approver: after(time.Second, event.Approve, "alice", "")}, rec2)
		if err != nil {
			t.Fatal(err)
		}
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "deployed" {
			t.Fatalf("resumed turn: %s %s", r.StopReason, r.Message)
		}
		if echoes != 1 || len(r.ToolCalls) != 2 {
			t.Fatalf("echo ran %d times; %d records", echoes, len(r.ToolCalls))
		}
		d := toolRecord(t, res, "deploy")
		if d.Outcome != event.OutcomeOK || d.ApprovalMS < 11000 || d.Approval.By != "alice" {
			t.Errorf("deploy: %s after %dms by %+v", d.Outcome, d.ApprovalMS, d.Approval)
		}
		if r.ApprovalMS < 11000 {
			t.Errorf("the turn's approval_ms %d: the suspended time is a wait for people", r.ApprovalMS)
		}
		first := rec2.events[0]
		if last := rec1.events[len(rec1.events)-1]; first.Seq != last.Seq+1 {
			t.Errorf("resumed at seq %d after %d", first.Seq, last.Seq)
		}
		if n := len(rec2.ofType(event.TypeApprovalRequested)); n != 0 {
			t.Errorf("the call was asked again (%d) though its request still waited", n)
		}
	})
}

// The model is told the turn's own time left: a wait for a person is not
// taken from it.
func TestTimeNoteLeavesOutTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`,
			`{"text": "done", "expect_in_request": ["Time left in this turn: 10m of 10m."]}`)
		b := approvalBudgets()
		b.Approval = secs(time.Hour, budget.SourceFile, budget.KeyApproval)
		b.Turn = secs(10*time.Minute, budget.SourceFile, budget.KeyTurn)
		a, err := agent.New(agent.Config{TimeNotes: true, Models: []model.Endpoint{endpoint(p, "m")},
			Tools: []agent.Tool{sleepy("deploy", time.Second, 0)}, Budgets: b})
		if err != nil {
			t.Fatal(err)
		}
		res := a.Run(t.Context(), agent.Input{Text: "deploy", Approver: after(5*time.Minute, event.Approve, "alice", "")})
		if res.Record.StopReason != budget.Answered {
			t.Fatalf("stopped %s: %s", res.Record.StopReason, res.Record.Message)
		}
	})
}
