package temporal_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/temporal"
)

// approvalAgent writes an agent whose deploy tool needs approval, under a
// 2s turn ceiling and a 1s step.
func approvalAgent(t *testing.T, dir string, approvalTimeout string) string {
	t.Helper()
	yaml := fmt.Sprintf(`name: temporal-approvals
model: {primary: 'script:test'}
providers: {script: {file: script.jsonl}}
timeouts: {turn: 2s, step: 1s, kill_grace: 500ms}
tools:
  - name: deploy
    description: Deploys.
    exec: [sh, -c, 'cat >/dev/null; sleep 0.5; echo deployed']
    timeout: 1s
    approval: required
    approval_timeout: %s
`, approvalTimeout)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	p := filepath.Join(dir, "agent.yaml")
	os.WriteFile(p, []byte(yaml), 0o644)
	return p
}

// On Temporal a call waits for a person in its workflow: a 3s wait under
// a 2s turn ceiling and a 1s step, then an approval stored and signalled
// (as the server's route does), and the call runs on its own 1s timeout.
// A second turn's call expires by the workflow's timer. Each wait is an
// await_approval span under the turn's, as on the embedded engine, though
// the request and the decision are units of separate activities.
func TestApprovalsOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	// The Run's own Approver (timebox run's terminal prompt): asked when
	// the call waits, its decision stored and signalled.
	denier := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
		select {
		case <-time.After(500 * time.Millisecond):
			return agent.Decision{Decision: event.Deny, By: "bob at the terminal", Reason: "not now"}, nil
		case <-ctx.Done():
			return agent.Decision{}, ctx.Err()
		}
	})
	for _, tc := range []struct {
		name, timeout string
		decide        bool
		approver      agent.Approver
		want          event.Outcome
	}{
		{"approved", "1h", true, nil, event.OutcomeOK},
		{"expired", "1500ms", false, nil, event.OutcomeApprovalExpired},
		{"the Run's approver", "1h", false, denier, event.OutcomeDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			defer tp.Shutdown(context.Background())
			a, err := timebox.Open(context.Background(), approvalAgent(t, t.TempDir(), tc.timeout), timebox.Options{TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			q := queue + "-" + tc.name
			startWorker(t, c, s, q, a.Agent)
			r, err := temporal.NewRunner(c, s, q, a.Agent)
			if err != nil {
				t.Fatal(err)
			}
			asked := make(chan event.Event, 1)
			done := make(chan *agent.Result, 1)
			go func() {
				done <- r.Run(context.Background(), agent.Input{Text: "deploy", Approver: tc.approver}, event.SinkFunc(func(e event.Event) {
					if e.Type == event.TypeApprovalRequested {
						asked <- e
					}
				}))
			}()
			var req event.Event
			select {
			case req = <-asked:
			case <-time.After(60 * time.Second):
				t.Fatal("no approval_requested")
			}
			if tc.decide {
				time.Sleep(3 * time.Second) // a person thinking: past the turn's ceiling and its step
				ap := s.(store.Approvals)
				callID := req.Data.(*event.ApprovalRequested).CallID
				if _, err := ap.Decide(context.Background(), req.TurnID, callID, store.Approval{Decision: event.Approve, By: "alice", DecidedAt: time.Now()}); err != nil {
					t.Fatal(err)
				}
				if err := r.SignalApproval(context.Background(), req.TurnID, callID); err != nil {
					t.Fatal(err)
				}
			}
			var res *agent.Result
			select {
			case res = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the turn did not end")
			}
			rec := res.Record
			if rec.Status != budget.StatusCompleted {
				t.Fatalf("turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
			}
			call := callNamed(t, rec, "deploy")
			if call.Outcome != tc.want || call.Approval == nil {
				t.Fatalf("call %s, approval %+v; want %s", call.Outcome, call.Approval, tc.want)
			}
			if tc.approver != nil && (call.Approval.By != "bob at the terminal" || call.Approval.Reason != "not now") {
				t.Errorf("decided %+v", call.Approval)
			}
			if tc.decide && (call.ApprovalMS < 3000 || call.DurationMS > 1000 || call.Approval.By != "alice" || rec.ApprovalMS < 3000) {
				t.Errorf("waited %dms (turn %dms), ran %dms, by %q", call.ApprovalMS, rec.ApprovalMS, call.DurationMS, call.Approval.By)
			}
			var turn, wait sdktrace.ReadOnlySpan
			for _, sp := range spans.Ended() {
				switch {
				case strings.HasPrefix(sp.Name(), "invoke_agent "):
					turn = sp
				case sp.Name() == "await_approval deploy":
					wait = sp
				}
			}
			if turn == nil || wait == nil {
				t.Fatalf("spans %v: no turn's or no wait's", spans.Ended())
			}
			got := map[string]any{}
			for _, kv := range wait.Attributes() {
				got[string(kv.Key)] = kv.Value.AsInterface()
			}
			took := wait.EndTime().Sub(wait.StartTime()).Milliseconds()
			if wait.Parent().SpanID() != turn.SpanContext().SpanID() || got["timebox.approval.decision"] != string(call.Approval.Decision) ||
				got["timebox.outcome"] != string(tc.want) ||
				took < call.ApprovalMS-1 || took > call.ApprovalMS+1 {
				t.Errorf("the wait's span: %v, %dms (the call waited %dms), parent %s (the turn's %s)", got, took, call.ApprovalMS,
					wait.Parent().SpanID(), turn.SpanContext().SpanID())
			}
		})
	}
}

// TestCancelWhileWaitingForAPerson: a turn cancelled (its caller's
// context, as Ctrl-C does) while its call waits for a person ends at
// once, not after the kill grace and cancelGrace its units would get (a
// wait has nothing to wind down), and says what it was waiting for.
func TestCancelWhileWaitingForAPerson(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	a, err := timebox.Open(context.Background(), approvalAgent(t, dir, "1h"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q := queue + "-cancel-waiting"
	startWorker(t, c, s, q, a.Agent)
	r, err := temporal.NewRunner(c, s, q, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	asked := make(chan struct{}, 1)
	done := make(chan *agent.Result, 1)
	go func() {
		done <- r.Run(ctx, agent.Input{Text: "deploy"}, event.SinkFunc(func(e event.Event) {
			if e.Type == event.TypeApprovalRequested {
				asked <- struct{}{}
			}
		}))
	}()
	select {
	case <-asked:
	case <-time.After(60 * time.Second):
		t.Fatal("no approval_requested")
	}
	time.Sleep(time.Second) // a person deciding
	cancelled := time.Now()
	cancel(&budget.CancelError{Reason: budget.Cancelled, By: "you (Ctrl-C)"})
	var res *agent.Result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the turn did not end")
	}
	// The kill grace (500ms) and cancelGrace (2s) are not waited.
	if took := time.Since(cancelled); took > 2*time.Second {
		t.Errorf("the turn ended %s after its cancellation", took)
	}
	rec := res.Record
	if rec.Status != budget.StatusCancelled {
		t.Fatalf("turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	if !strings.Contains(rec.Message, "Cancelled by you (Ctrl-C) after 1") ||
		!strings.Contains(rec.Message, "Last step: tool deploy, waiting for a person's decision (1") {
		t.Errorf("message %q", rec.Message)
	}
	if call := callNamed(t, rec, "deploy"); call.Outcome == event.OutcomeOK {
		t.Errorf("the call ran: %+v", call)
	}
}

// TestAStoredCancelReachesAWaitForAPerson: a cancel request stored with
// no signal to the workflow — as a gateway that found the turn's caller
// gone stores it — ends a turn waiting for a person: the workers pass it
// on. (The turn went on until its wait expired, then ran its next step.)
func TestAStoredCancelReachesAWaitForAPerson(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	a, err := timebox.Open(context.Background(), approvalAgent(t, t.TempDir(), "1h"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	q := queue + "-stored-cancel"
	startWorker(t, c, s, q, a.Agent)
	r, err := temporal.NewRunner(c, s, q, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan string, 1)
	done := make(chan *agent.Result, 1)
	go func() {
		// Detached from this Run's context: only the store says cancel.
		done <- r.Run(context.Background(), agent.Input{Text: "deploy"}, event.SinkFunc(func(e event.Event) {
			if e.Type == event.TypeApprovalRequested {
				asked <- e.TurnID
			}
		}))
	}()
	var id string
	select {
	case id = <-asked:
	case <-time.After(60 * time.Second):
		t.Fatal("no approval_requested")
	}
	if err := s.RequestCancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if rec := res.Record; rec.Status != budget.StatusCancelled {
			t.Fatalf("turn ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stored cancel request did not end the turn waiting for a person")
	}
}
