package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
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
		p := lines(t, `{"compaction": true, "text": "They asked four questions and got long answers."}`, `{"text": "the answer"}`)
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
		// What the session keeps is the whole exchange, then the note of
		// the summary the next turn starts from.
		if len(res.Messages) != 3 || res.Messages[2].Role != model.RoleSummary ||
			res.Messages[2].Content != "They asked four questions and got long answers." || res.Messages[2].Covers != 8 {
			t.Fatalf("session messages %+v", res.Messages)
		}
	})
}

// TestTheNextTurnStartsFromTheSummary: the turn after a compaction sends
// the summary and what came after it, without summarising the session
// again (it summarised the whole session at every turn's first step, a
// call that grew with the session until it no longer fit).
func TestTheNextTurnStartsFromTheSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"compaction": true, "text": "They asked four questions."}`, `{"text": "the answer"}`, `{"text": "the second answer"}`)
		res, _ := runCompacting(t, p, []model.Endpoint{endpoint(p, "m")}, budget.Budgets{})
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, CompactAt: 500})
		if err != nil {
			t.Fatal(err)
		}
		history := append(longHistory(), res.Messages...)
		rec := &recorder{}
		next := a.Run(t.Context(), agent.Input{SessionID: "s", History: history, Text: "and then?"}, rec)
		if next.Record.StopReason != budget.Answered || len(rec.ofType(event.TypeCompactionStarted)) != 0 {
			t.Fatalf("stopped %s after %d compactions: %s", next.Record.StopReason, len(rec.ofType(event.TypeCompactionStarted)), next.Record.Message)
		}
		last := p.last()
		var roles []string
		for _, m := range last.Messages {
			roles = append(roles, string(m.Role)+": "+m.Content)
		}
		if !strings.Contains(last.System, "They asked four questions.") ||
			strings.Join(roles, " | ") != "user: and now? | assistant: the answer | user: and then?" {
			t.Fatalf("the next turn's request: system %q, messages %q", last.System, roles)
		}
		if n := len(next.Messages); n != 2 {
			t.Errorf("the next turn added %d messages (no new summary): %+v", n, next.Messages)
		}
	})
}

func TestCompactionTimeoutGoesOnUncompactedWithoutFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"compaction": true, "text": "never", "stall_after": 0}`, `{"text": "answered with the full history"}`)
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
		p := lines(t, `{"compaction": true, "text": "never", "stall_after": 0}`, `{"text": "not reached"}`)
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
		p := lines(t, `{"compaction": true, "error": {"status": 503, "message": "overloaded"}}`, `{"error": {"status": 400, "message": "context_length_exceeded"}}`)
		res, _ := runCompacting(t, p, []model.Endpoint{endpoint(p, "m")}, budget.Budgets{})
		r := res.Record
		// The refusal says the history cannot fit and compaction has just
		// failed at this size: a second attempt would not help.
		if r.StopReason != budget.CompactionFailed || r.Status != budget.StatusStopped || !strings.Contains(r.Message, "context_length_exceeded") ||
			!strings.Contains(r.Message, "History compaction had failed (overloaded)") || len(r.ModelCalls) != 2 {
			t.Fatalf("got %s: %s (%d model calls)", r.StopReason, r.Message, len(r.ModelCalls))
		}
	})
}

// compacting runs one turn of an agent with the given instructions,
// compact_at and tools over the script lines, and returns the result, the
// events and the provider (for the requests it got).
func compacting(t *testing.T, instructions string, compactAt int, history []model.Message, tools []agent.Tool, jsonl ...string) (*agent.Result, *recorder, *requests) {
	t.Helper()
	p := lines(t, jsonl...)
	a, err := agent.New(agent.Config{Instructions: instructions, Models: []model.Endpoint{endpoint(p, "m")}, Tools: tools, CompactAt: compactAt})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	res := a.Run(t.Context(), agent.Input{SessionID: "s", History: history, Text: "go"}, rec)
	checkEvents(t, res, rec)
	return res, rec, p
}

func output(s string) agent.Tool {
	return goTool("out", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return s, nil })
}

func finishedCompactions(rec *recorder) []*event.CompactionFinished {
	var out []*event.CompactionFinished
	for _, e := range rec.ofType(event.TypeCompactionFinished) {
		out = append(out, e.Data.(*event.CompactionFinished))
	}
	return out
}

// One maximal tool result (limits.max_tool_output, 1 MiB, about 262k
// estimated tokens) does not by itself put a fresh conversation over the
// default compact_at (100000): the model is sent the first 200,000 bytes
// (half of compact_at), the record and the session keep the whole result,
// and no compaction runs.
func TestOneStepsResultsAreSentWithinHalfOfCompactAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
		res, rec, p := compacting(t, "be brief", 100000, nil, []agent.Tool{output(big)},
			`{"tool_calls": [{"name": "out"}]}`, `{"text": "done"}`)
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "done" || len(rec.ofType(event.TypeCompactionStarted)) != 0 {
			t.Fatalf("got %s (%d compactions): %s", r.StopReason, len(rec.ofType(event.TypeCompactionStarted)), r.Message)
		}
		sent := p.last().Messages[2].Content
		if !strings.HasPrefix(sent, big[:200000]) || strings.HasPrefix(sent, big[:200001]) ||
			!strings.Contains(sent, "[output cut: only the first 200000 of its 1048576 bytes are sent to the model") {
			t.Fatalf("sent %d bytes: ...%s", len(sent), sent[min(len(sent), 200000):])
		}
		if toolRecord(t, res, "out").Result != big || res.Messages[2].Content != big {
			t.Fatal("the record or the session lost part of the result")
		}
	})
}

// The results of one step share the room: a small one is sent whole, the
// large ones split what is left; a cut never splits a character.
func TestResultsOfOneStepShareTheRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		small := "small result"
		big := strings.Repeat("é", 100000) // 200,000 bytes
		tools := []agent.Tool{output(big), goTool("tiny", budget.Cooperative, time.Minute,
			func(context.Context, json.RawMessage, tool.Progress) (any, error) { return small, nil })}
		_, _, p := compacting(t, "", 1000, nil, tools,
			`{"tool_calls": [{"name": "out"}, {"name": "tiny"}, {"name": "out"}]}`, `{"text": "done"}`)
		msgs := p.last().Messages
		// 1000 tokens: 2000 bytes for the step; 12 for the small one, 994
		// for each large one (rounded down to a whole character).
		if msgs[3].Content != small {
			t.Fatalf("small result sent as %q", msgs[3].Content)
		}
		for _, i := range []int{2, 4} {
			if !strings.HasPrefix(msgs[i].Content, strings.Repeat("é", 497)+"\n[output cut: only the first 994 of its 200000 bytes") {
				t.Fatalf("result %d sent as %.1100q", i, msgs[i].Content)
			}
		}
	})
}

// A compaction that cannot get under compact_at (here the instructions
// alone are over it) is recorded as insufficient, its summary is used, and
// it is not tried again on each of the following steps: the turn answers
// with the reply the script meant for it.
func TestInsufficientCompactionIsNotRetriedOnEveryStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		instructions := strings.Repeat("Follow the house rules. ", 100) // ~600 tokens
		call := `{"tool_calls": [{"name": "out", "arguments": {}}]}`
		res, rec, p := compacting(t, instructions, 500, longHistory(), []agent.Tool{output("ok")},
			call, call, call, call, `{"text": "the answer"}`)
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "the answer" || r.Steps != 5 {
			t.Fatalf("got %s after %d steps: %s", r.StopReason, r.Steps, r.Message)
		}
		fins := finishedCompactions(rec)
		if len(fins) != 1 || fins[0].Outcome != event.OutcomeInsufficient || fins[0].TokensAfter <= 500 ||
			fins[0].TokensAfter >= fins[0].TokensBefore || !strings.Contains(fins[0].Message, "still over context.compact_at (500)") {
			t.Fatalf("compactions %+v", fins)
		}
		if mc := r.ModelCalls[0]; !mc.Compaction || mc.Outcome != event.OutcomeInsufficient {
			t.Fatalf("compaction record %+v", mc)
		}
		// The summary (the script's deterministic one) replaced the history.
		if last := p.last(); !strings.Contains(last.System, "(script model summary of") || len(last.Messages) != 9 {
			t.Fatalf("last request: %d messages, system %.80q…", len(last.Messages), last.System[len(instructions):])
		}
	})
}

// Once the conversation has grown by a tenth of compact_at since an
// insufficient compaction, compaction is tried again.
func TestCompactionIsRetriedAfterGrowth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		instructions := strings.Repeat("Follow the house rules. ", 100)
		call := `{"tool_calls": [{"name": "out", "arguments": {}}]}`
		// Each step adds about 30 tokens (a 100-byte result and its call):
		// 500/10 = 50 tokens of growth take two steps.
		res, rec, _ := compacting(t, instructions, 500, longHistory(), []agent.Tool{output(strings.Repeat("x", 100))},
			call, call, call, call, `{"text": "the answer"}`)
		if r := res.Record; r.StopReason != budget.Answered || r.Answer != "the answer" {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
		fins := finishedCompactions(rec)
		var steps []int
		for _, f := range fins {
			if f.Outcome != event.OutcomeInsufficient {
				t.Fatalf("compaction %+v", f)
			}
			steps = append(steps, f.Step)
		}
		if fmt.Sprint(steps) != "[1 3 5]" {
			t.Fatalf("compactions at steps %v", steps)
		}
	})
}

// The provider refuses the conversation as too long although the estimate
// was under compact_at: the history is compacted and the step made again.
func TestLengthRefusalCompactsAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res, rec, p := compacting(t, "be brief", 100000, longHistory(), nil,
			`{"error": {"status": 400, "message": "This model's maximum context length is 1024 tokens. However, your messages resulted in 1962 tokens."}}`,
			`{"compaction": true, "text": "Four long questions, answered."}`,
			`{"text": "the answer"}`)
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "the answer" || r.Steps != 2 {
			t.Fatalf("got %s after %d steps: %s", r.StopReason, r.Steps, r.Message)
		}
		if fins := finishedCompactions(rec); len(fins) != 1 || fins[0].Outcome != event.OutcomeOK {
			t.Fatalf("compactions %+v", fins)
		}
		if len(r.ModelCalls) != 3 || r.ModelCalls[0].Outcome != event.OutcomeError || !r.ModelCalls[1].Compaction || r.ModelCalls[2].Outcome != event.OutcomeOK {
			t.Fatalf("model calls %+v", r.ModelCalls)
		}
		if last := p.last(); len(last.Messages) != 1 || !strings.Contains(last.System, "Four long questions, answered.") {
			t.Fatalf("retried with %d messages", len(last.Messages))
		}
	})
}

// When the history cannot fit — the provider refuses it as too long and a
// compaction would not help — the turn stops with compaction_failed and a
// message naming both knobs; with compaction off it is a refusal that says
// how to turn it on.
func TestHistoryThatCannotFit(t *testing.T) {
	tooLong := `{"error": {"status": 400, "message": "prompt is too long: 210000 tokens > 200000 maximum"}}`
	instructions := strings.Repeat("Follow the house rules. ", 100)
	cases := []struct {
		name         string
		instructions string
		compactAt    int
		history      []model.Message
		jsonl        []string
		reason       budget.StopReason
		compactions  int
		says         []string
	}{
		{"nothing to summarise", "", 1000, nil, []string{tooLong}, budget.CompactionFailed, 0,
			[]string{"prompt is too long", "Nothing older than the latest step was left to summarise", "context.compact_at (now 1000)", "limits.max_tool_output, now 1MiB"}},
		{"after an insufficient compaction", instructions, 500, longHistory(), []string{tooLong}, budget.CompactionFailed, 1,
			[]string{"prompt is too long", "Compaction could not bring it under context.compact_at", "limits.max_tool_output"}},
		{"still refused after compacting", "", 100000, longHistory(), []string{tooLong, tooLong}, budget.CompactionFailed, 1,
			[]string{"prompt is too long", "Older history was summarised, and what cannot be", "context.compact_at (now 100000)"}},
		{"compaction off", "", 0, longHistory(), []string{tooLong}, budget.ModelRejected, 0,
			[]string{"prompt is too long", "history compaction is off: set context.compact_at", "limits.max_tool_output"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				res, rec, _ := compacting(t, tc.instructions, tc.compactAt, tc.history, nil, tc.jsonl...)
				r := res.Record
				if r.StopReason != tc.reason || len(finishedCompactions(rec)) != tc.compactions {
					t.Fatalf("got %s after %d compactions: %s", r.StopReason, len(finishedCompactions(rec)), r.Message)
				}
				for _, want := range tc.says {
					if !strings.Contains(r.Message, want) {
						t.Fatalf("message %q lacks %q", r.Message, want)
					}
				}
			})
		})
	}
}

// TestAStoppedReplyIsKeptInTheSession: a turn stopped while the model
// streamed its reply adds that reply to the session, as far as it got and
// said to be cut off, so that the next turn's model knows what it had
// said (the next request had two user messages in a row).
func TestAStoppedReplyIsKeptInTheSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"chunks": ["Partial ", "answer "], "stall_after": 2}`, `{"text": "going on", "expect_in_request": ["Partial answer \n[timebox: the reply was cut off here: the turn was stopped (turn_timeout)]"]}`)
		b := budget.Budgets{Turn: secs(10*time.Second, budget.SourceCode, budget.KeyTurn)}
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Budgets: b})
		if err != nil {
			t.Fatal(err)
		}
		first := a.Run(t.Context(), agent.Input{SessionID: "s", Text: "one"})
		if first.Record.StopReason != budget.TurnTimeout || first.Record.Answer != "Partial answer " {
			t.Fatalf("first turn: %s, answer %q", first.Record.StopReason, first.Record.Answer)
		}
		if n := len(first.Messages); n != 2 || first.Messages[1].Role != model.RoleAssistant {
			t.Fatalf("the first turn added %+v", first.Messages)
		}
		next := a.Run(t.Context(), agent.Input{SessionID: "s", History: first.Messages, Text: "go on"})
		if next.Record.StopReason != budget.Answered {
			t.Fatalf("the next turn: %s: %s", next.Record.StopReason, next.Record.Message)
		}
	})
}

// TestACutResultKeepsItsTime: a result cut for context keeps timebox's
// note of the time the call took (time notes on): it was cut away with
// the output's end.
func TestACutResultKeepsItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "out"}]}`, `{"text": "done"}`)
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Tools: []agent.Tool{output(strings.Repeat("x", 200000))},
			CompactAt: 1000, TimeNotes: true})
		if err != nil {
			t.Fatal(err)
		}
		if res := a.Run(t.Context(), agent.Input{Text: "go"}); res.Record.StopReason != budget.Answered {
			t.Fatalf("stopped %s: %s", res.Record.StopReason, res.Record.Message)
		}
		sent := p.last().Messages[2].Content
		if !strings.Contains(sent, "[output cut: only the first ") || !strings.HasSuffix(sent, "\n[timebox: took 0s of 60s]") {
			t.Fatalf("sent ...%q", sent[max(0, len(sent)-300):])
		}
	})
}

// Chinese, Japanese and Korean text is estimated at a token a character:
// a conversation of 2,000 such characters (6,000 bytes, which four bytes
// a token put at 1,500 tokens) passes a compact_at of 1,800 and is
// compacted, before the provider refuses it.
func TestACJKConversationIsEstimatedAtATokenACharacter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		history := []model.Message{
			{Role: model.RoleUser, Content: strings.Repeat("时间", 500)},
			{Role: model.RoleAssistant, Content: strings.Repeat("予算", 250) + strings.Repeat("시간", 250)},
		}
		res, rec, _ := compacting(t, "", 1800, history, nil,
			`{"compaction": true, "text": "They talked about time."}`, `{"text": "done"}`)
		r := res.Record
		f := finishedCompactions(rec)
		if r.StopReason != budget.Answered || len(f) != 1 {
			t.Fatalf("got %s with %d compactions: %s", r.StopReason, len(f), r.Message)
		}
		if f[0].TokensBefore < 2000 || f[0].TokensBefore > 2020 {
			t.Fatalf("estimated %d tokens before, want 2,000 and the messages' overhead", f[0].TokensBefore)
		}
	})
}

// A result in those scripts is cut by the same estimate: half of a
// compact_at of 1,000 tokens is 500 characters, whole.
func TestACJKResultIsCutByTheEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("字", 100000) // 300,000 bytes
		_, _, p := compacting(t, "", 1000, nil, []agent.Tool{output(big)},
			`{"tool_calls": [{"name": "out"}]}`, `{"text": "done"}`)
		sent := p.last().Messages[2].Content
		if !strings.HasPrefix(sent, strings.Repeat("字", 500)+"\n[output cut: only the first 1500 of its 300000 bytes") {
			t.Fatalf("sent %.1600q", sent)
		}
	})
}
