package budget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
)

func TestGraceFor(t *testing.T) {
	kg := 2 * time.Second
	cases := []struct {
		cause error
		want  time.Duration
	}{
		{&budget.TimeoutError{Phase: budget.PhaseTool}, kg},
		{&budget.TimeoutError{Phase: budget.PhaseToolIdle}, kg},
		{&budget.TimeoutError{Phase: budget.PhaseTurn}, budget.CancelGrace},
		{&budget.CancelError{Reason: budget.ClientGone}, budget.CancelGrace},
		{context.Canceled, budget.CancelGrace},
	}
	for _, tc := range cases {
		if got := budget.GraceFor(tc.cause, kg); got != tc.want {
			t.Errorf("GraceFor(%v) = %s, want %s", tc.cause, got, tc.want)
		}
	}
	if got := budget.GraceFor(&budget.CancelError{}, 100*time.Millisecond); got != 100*time.Millisecond {
		t.Errorf("a shorter kill grace must win, got %s", got)
	}
}

func TestCause(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if budget.Cause(ctx) != nil {
		t.Fatal("live context has a cause")
	}
	cancel()
	if ce, ok := budget.AsCancel(budget.Cause(ctx)); !ok || ce.Reason != budget.Cancelled {
		t.Fatalf("bare cancel: %v", budget.Cause(ctx))
	}
	te := &budget.TimeoutError{Phase: budget.PhaseTool, Limit: time.Second}
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	cancel2(te)
	if got := budget.Cause(ctx2); got != te || !errors.Is(got, context.DeadlineExceeded) {
		t.Fatalf("typed cause lost: %v", got)
	}
	re := &budget.ReplyTooLongError{Limit: 1 << 20, Knob: budget.KeyMaxReply}
	ctx3, cancel3 := context.WithCancelCause(context.Background())
	cancel3(re)
	if got := budget.Cause(ctx3); got != re {
		t.Fatalf("reply cap cause lost: %v", got)
	}
}

func TestPhasesThatRotate(t *testing.T) {
	for _, p := range []budget.Phase{budget.PhaseLLMFirstChunk, budget.PhaseLLMIdle, budget.PhaseLLMHTTP, budget.PhaseLLMEmpty} {
		if !p.IsLLM() {
			t.Errorf("%s should rotate", p)
		}
	}
	for _, p := range []budget.Phase{budget.PhaseTool, budget.PhaseToolIdle, budget.PhaseStep, budget.PhaseTurn,
		budget.PhaseCompaction, budget.PhaseCancel, budget.PhaseLLMBudget, budget.PhaseLLMReplyCap} {
		if p.IsLLM() {
			t.Errorf("%s must never rotate credentials or models", p)
		}
	}
}

func TestStatusOfStopReasons(t *testing.T) {
	want := map[budget.StopReason]budget.Status{
		budget.Answered: budget.StatusCompleted, budget.TurnTimeout: budget.StatusStopped, budget.NoProgress: budget.StatusStopped,
		budget.LLMBudgetExhausted: budget.StatusStopped, budget.MaxSteps: budget.StatusStopped, budget.MaxToolCalls: budget.StatusStopped,
		budget.ModelUnresponsive: budget.StatusStopped, budget.ReplyTooLong: budget.StatusStopped, budget.ModelUnavailable: budget.StatusFailed, budget.ModelRejected: budget.StatusFailed, budget.AgentMismatch: budget.StatusFailed,
		budget.Interrupted: budget.StatusInterrupted, budget.EngineLost: budget.StatusInterrupted,
		budget.Cancelled: budget.StatusCancelled, budget.ClientGone: budget.StatusCancelled, budget.Shutdown: budget.StatusCancelled,
	}
	for r, s := range want {
		if r.Status() != s {
			t.Errorf("%s → %s, want %s", r, r.Status(), s)
		}
	}
}

func TestDefaultsMatchTheSpec(t *testing.T) {
	d := budget.Defaults()
	got := []time.Duration{d.Tool.D, d.ToolMax.D, d.LLMFirstChunk.D, d.LLMIdle.D, d.LLMBudget.D, d.Step.D, d.Turn.D, d.ProgressNotice.D, d.KillGrace.D, d.Compaction.D}
	want := []time.Duration{60 * time.Second, time.Hour, 60 * time.Second, 120 * time.Second, 0, 5 * time.Minute, 30 * time.Minute, 30 * time.Second, 2 * time.Second, 60 * time.Second}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("default %d = %s, want %s", i, got[i], want[i])
		}
	}
	l := budget.DefaultLimits()
	if l.MaxSteps.N != 25 || l.MaxToolCalls.N != 50 || l.ParallelTools.N != 4 || l.MaxToolOutput.N != 1<<20 || l.IdleBreaker.N != 3 ||
		l.MaxReply.N != 1<<20 {
		t.Errorf("limits %+v", l)
	}
	if p := budget.DefaultProfiles(); p["fast"] != 5*time.Second || p["standard"] != time.Minute || p["slow"] != 10*time.Minute {
		t.Errorf("profiles %v", p)
	}
}
