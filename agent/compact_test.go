package agent_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// longHistory is an earlier conversation of about 2,000 tokens.
func longHistory() []model.Message {
	var h []model.Message
	for i := range 4 {
		h = append(h, model.Message{Role: model.RoleUser, Content: strings.Repeat("question ", 100) + string(rune('a'+i))},
			model.Message{Role: model.RoleAssistant, Content: strings.Repeat("answer ", 150)})
	}
	return h
}

func runCompacting(t *testing.T, p *requests, models []model.Endpoint, b budget.Budgets) (*agent.Result, *recorder) {
	t.Helper()
	a, err := agent.New(agent.Config{Models: models, Budgets: b, CompactAt: 500})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	res := a.Run(t.Context(), agent.Input{SessionID: "s", History: longHistory(), Text: "and now?"}, rec)
	checkEvents(t, res, rec)
	return res, rec
}

func TestCompaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"text": "They asked four questions and got long answers."}`, `{"text": "the answer"}`)
		res, rec := runCompacting(t, p, []model.Endpoint{endpoint(p, "m")}, budget.Budgets{})
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "the answer" {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
		started, finished := rec.ofType(event.TypeCompactionStarted), rec.ofType(event.TypeCompactionFinished)
		if len(started) != 1 || len(finished) != 1 {
			t.Fatalf("%d started, %d finished", len(started), len(finished))
		}
		f := finished[0].Data.(*event.CompactionFinished)
		if f.Outcome != event.OutcomeOK || f.TokensAfter >= f.TokensBefore || f.TokensBefore <= 500 {
			t.Fatalf("compaction_finished %+v", f)
		}
		// The answering request carries the summary instead of the old messages.
		last := p.last()
		if len(last.Messages) != 1 || last.Messages[0].Content != "and now?" || !strings.Contains(last.System, "They asked four questions") {
			t.Fatalf("request after compaction: %d messages, system %q", len(last.Messages), last.System)
		}
		if !r.ModelCalls[0].Compaction || r.Steps != 1 {
			t.Fatalf("records %+v steps %d", r.ModelCalls, r.Steps)
		}
		// What the session keeps is the whole exchange, not the summary.
		if len(res.Messages) != 2 {
			t.Fatalf("session messages %d", len(res.Messages))
		}
	})
}

func TestCompactionTimeoutGoesOnUncompactedWithoutFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"text": "never", "stall_after": 0}`, `{"text": "answered with the full history"}`)
		backup := lines(t, `{"text": "the fallback must not be asked"}`)
		b := budget.Defaults()
		b.LLMFirstChunk.D, b.LLMIdle.D = 0, 0
		b.Compaction = budget.Duration{D: 10 * time.Second, Source: budget.SourceFile, Knob: budget.KeyCompaction}
		start := time.Now()
		res, rec := runCompacting(t, p, []model.Endpoint{endpoint(p, "m"), endpoint(backup, "backup")}, b)
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "answered with the full history" {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
		if !r.Flags.TimedOutDuringCompaction || len(rec.ofType(event.TypeFailover)) != 0 || len(backup.reqs) != 0 {
			t.Fatalf("flags %+v, failovers %d, backup asked %d times", r.Flags, len(rec.ofType(event.TypeFailover)), len(backup.reqs))
		}
		f := rec.ofType(event.TypeCompactionFinished)[0].Data.(*event.CompactionFinished)
		if f.Outcome != event.OutcomeTimedOut || f.Phase != budget.PhaseCompaction || f.DurationMS != 10000 ||
			!strings.Contains(f.Message, "timeouts.compaction") {
			t.Fatalf("compaction_finished %+v", f)
		}
		if len(p.last().Messages) != 9 || time.Since(start) != 10*time.Second {
			t.Fatalf("the answer was asked with %d messages after %s", len(p.last().Messages), time.Since(start))
		}
	})
}

func TestTurnCeilingDuringCompaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"text": "never", "stall_after": 0}`)
		b := budget.Defaults()
		b.LLMFirstChunk.D = 0
		b.Turn = budget.Duration{D: 30 * time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
		res, rec := runCompacting(t, p, []model.Endpoint{endpoint(p, "m"), endpoint(p, "backup")}, b)
		r := res.Record
		if r.StopReason != budget.TurnTimeout || !r.Flags.TimedOutDuringCompaction || !r.Flags.TimedOutByTurnBudget ||
			r.Flags.TimedOutDuringToolExecution || len(rec.ofType(event.TypeFailover)) != 0 {
			t.Fatalf("got %s %+v", r.StopReason, r.Flags)
		}
		if !strings.Contains(r.Message, "compaction") || strings.Contains(r.Message, "model m, waiting") {
			t.Fatalf("message %q", r.Message)
		}
	})
}

func TestRefusalAfterFailedCompactionSaysSo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"error": {"status": 503, "message": "overloaded"}}`, `{"error": {"status": 400, "message": "context_length_exceeded"}}`)
		res, _ := runCompacting(t, p, []model.Endpoint{endpoint(p, "m")}, budget.Budgets{})
		r := res.Record
		if r.StopReason != budget.ModelRejected || !strings.Contains(r.Message, "context_length_exceeded") ||
			!strings.Contains(r.Message, "History compaction had failed (overloaded)") {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
	})
}
