package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

func TestMain(m *testing.M) {
	// BenchmarkTurnWindDown/store with TB_BENCH_PG=1 starts a PostgreSQL.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.StopPostgres() }))
}

// recorder is a sink that keeps every event and checks seq order.
type recorder struct {
	mu     sync.Mutex
	events []event.Event
}

func (r *recorder) Emit(e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// deltaText joins the text of the llm_delta events.
func deltaText(r *recorder) string {
	var b strings.Builder
	for _, e := range r.ofType(event.TypeLLMDelta) {
		b.WriteString(e.Data.(*event.LLMDelta).Text)
	}
	return b.String()
}

func (r *recorder) ofType(typ event.Type) []event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event.Event
	for _, e := range r.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// requests wraps a provider and keeps every request it received.
type requests struct {
	model.Provider
	mu   sync.Mutex
	reqs []model.Request
}

func (r *requests) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return r.Provider.Stream(ctx, req)
}

func (r *requests) last() model.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

func lines(t *testing.T, jsonl ...string) *requests {
	t.Helper()
	ls, err := script.Parse(strings.NewReader(strings.Join(jsonl, "\n")), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(ls)
	if err != nil {
		t.Fatal(err)
	}
	return &requests{Provider: p}
}

func endpoint(p model.Provider, name string) model.Endpoint {
	return model.Endpoint{Provider: p, ProviderName: "script", Model: name}
}

func secs(d time.Duration, src budget.Source, knob string) budget.Duration {
	return budget.Duration{D: d, Source: src, Knob: knob}
}

type fixture struct {
	models  []model.Endpoint
	tools   []agent.Tool
	budgets budget.Budgets
	limits  budget.Limits
	late    func(event.ToolCall)
	// approver decides the calls that need a person.
	approver agent.Approver
}

func (f fixture) run(t *testing.T, ctx context.Context, text string) (*agent.Result, *recorder) {
	t.Helper()
	a, err := agent.New(agent.Config{Name: "test", Instructions: "be brief", Models: f.models, Tools: f.tools,
		Budgets: f.budgets, Limits: f.limits})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	sinks := []event.Sink{rec}
	if f.late != nil {
		sinks = append(sinks, lateSink(f.late))
	}
	res := a.Run(ctx, agent.Input{SessionID: "s1", Text: text, Approver: f.approver}, sinks...)
	checkEvents(t, res, rec)
	return res, rec
}

// lateSink is a sink that only takes late results.
type lateSink func(event.ToolCall)

func (lateSink) Emit(event.Event)                {}
func (f lateSink) LateResult(rec event.ToolCall) { f(rec) }

// checkEvents asserts what every turn must satisfy: seq strictly increasing
// from 1, turn_started first, exactly one turn_finished last, matching the
// record.
func checkEvents(t *testing.T, res *agent.Result, rec *recorder) {
	t.Helper()
	evs := rec.events
	if len(evs) < 2 {
		t.Fatalf("only %d events", len(evs))
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		if e.TurnID != res.Record.TurnID {
			t.Fatalf("event %d has turn_id %q, want %q", i, e.TurnID, res.Record.TurnID)
		}
	}
	if evs[0].Type != event.TypeTurnStarted || evs[len(evs)-1].Type != event.TypeTurnFinished {
		t.Fatalf("first %s, last %s", evs[0].Type, evs[len(evs)-1].Type)
	}
	if n := len(rec.ofType(event.TypeTurnFinished)); n != 1 {
		t.Fatalf("%d turn_finished events", n)
	}
	tf := evs[len(evs)-1].Data.(*event.TurnFinished)
	if tf.Status != res.Record.Status || tf.StopReason != res.Record.StopReason || tf.Message != res.Record.Message {
		t.Fatalf("turn_finished %+v does not match the record", tf)
	}
	if len(res.Record.Events) != len(evs) {
		t.Fatalf("record has %d events, sink saw %d", len(res.Record.Events), len(evs))
	}
	if res.Record.StopReason.Status() != res.Record.Status {
		t.Fatalf("status %s with stop reason %s", res.Record.Status, res.Record.StopReason)
	}
	if res.Record.Message == "" {
		t.Fatal("empty message")
	}
}

func goTool(name string, kind budget.Enforcement, timeout time.Duration, fn tool.Handler) agent.Tool {
	return agent.Tool{
		Tool: tool.NewFunc(name, "test tool", nil, fn),
		Budget: budget.ToolBudget{Timeout: secs(timeout, budget.SourceTool, "tools["+name+"].timeout in agent.yaml"),
			Enforcement: kind, KillGrace: budget.Duration{D: time.Second}},
	}
}

// checkRecord fails t, with a diff, unless the named fields of the record
// got are those of want.
func checkRecord(t *testing.T, got, want event.ToolCall, fields ...string) {
	t.Helper()
	only := map[string]bool{}
	for _, f := range fields {
		only[f] = true
	}
	others := cmp.FilterPath(func(p cmp.Path) bool {
		sf, ok := p.Index(1).(cmp.StructField)
		return len(p) > 1 && ok && !only[sf.Name()]
	}, cmp.Ignore())
	if diff := cmp.Diff(want, got, others); diff != "" {
		t.Fatalf("record of %s (-want +got):\n%s", got.Tool, diff)
	}
}

func errorInfo(t *testing.T, s string) tool.ErrorInfo {
	t.Helper()
	var v struct {
		Error tool.ErrorInfo `json:"error"`
	}
	if err := json.Unmarshal([]byte(s), &v); err != nil || v.Error.Type == "" {
		t.Fatalf("result is not an error object: %s", s)
	}
	return v.Error
}

func toolRecord(t *testing.T, res *agent.Result, name string) event.ToolCall {
	t.Helper()
	for _, r := range res.Record.ToolCalls {
		if r.Tool == name {
			return r
		}
	}
	t.Fatalf("no record for tool %s", name)
	return event.ToolCall{}
}

func TestAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"chunks": ["Hello", ", world"], "chunk_delay": "10ms"}`)
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}}.run(t, t.Context(), "hi")
		r := res.Record
		if r.Status != budget.StatusCompleted || r.StopReason != budget.Answered || r.Answer != "Hello, world" || r.Message != r.Answer {
			t.Fatalf("got %s/%s %q %q", r.Status, r.StopReason, r.Answer, r.Message)
		}
		if n := len(rec.ofType(event.TypeLLMDelta)); n != 2 {
			t.Fatalf("%d deltas", n)
		}
		if r.Steps != 1 || len(r.ModelCalls) != 1 || r.ModelCalls[0].Outcome != event.OutcomeOK {
			t.Fatalf("records: %+v", r.ModelCalls)
		}
		if got := len(res.Messages); got != 2 {
			t.Fatalf("%d messages", got)
		}
		if req := p.last(); req.System != "be brief" || req.Conversation != "s1" {
			t.Fatalf("request %+v", req)
		}
	})
}

func TestToolTimeoutIsReportedAndTheTurnGoesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t,
			`{"tool_calls": [{"name": "hang", "arguments": {}}]}`,
			`{"text": "the tool timed out"}`)
		hang := goTool("hang", budget.Cooperative, 30*time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			<-ctx.Done()
			return "partial", ctx.Err()
		})
		start := time.Now()
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{hang}}.run(t, t.Context(), "go")
		if res.Record.StopReason != budget.Answered {
			t.Fatalf("stop %s: %s", res.Record.StopReason, res.Record.Message)
		}
		tr := toolRecord(t, res, "hang")
		checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeTimedOut, Phase: budget.PhaseTool, DurationMS: 30000, Abandoned: false},
			"Outcome", "Phase", "DurationMS", "Abandoned")
		checkRecord(t, tr, event.ToolCall{TimeoutSource: budget.SourceTool, Enforcement: budget.Cooperative, TimeoutMS: 30000},
			"TimeoutSource", "Enforcement", "TimeoutMS")
		info := errorInfo(t, tr.Result)
		if info.Type != "tool_timeout" || info.Limit != "30s" || info.Elapsed != "30s" || info.Phase != "tool" ||
			info.Knob != "tools[hang].timeout in agent.yaml" || info.PartialOutput != "partial" ||
			!strings.Contains(info.Message, `Tool "hang" did not finish within 30s and was stopped`) {
			t.Fatalf("result %+v", info)
		}
		// The model got exactly that result.
		msgs := p.last().Messages
		if last := msgs[len(msgs)-1]; last.Role != model.RoleTool || last.Content != tr.Result || last.ToolCallID != "call_1_1" {
			t.Fatalf("model saw %+v", last)
		}
		if d := time.Since(start); d != 30*time.Second {
			t.Fatalf("turn took %s", d)
		}
		st := rec.ofType(event.TypeToolStarted)[0].Data.(*event.ToolStarted)
		if st.TimeoutMS != 30000 || st.Source != budget.SourceTool || st.Enforcement != "cooperative" || !st.Deadline.Equal(start.Add(30*time.Second).UTC()) {
			t.Fatalf("tool_started %+v", st)
		}
		fin := rec.ofType(event.TypeToolFinished)[0].Data.(*event.ToolFinished)
		if fin.Outcome != event.OutcomeTimedOut {
			t.Fatalf("tool_finished %+v", fin)
		}
	})
}

func TestToolErrorIsNotATimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "fail"}]}`, `{"text": "ok"}`)
		fail := goTool("fail", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			return nil, errors.New("disk full")
		})
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{fail}}.run(t, t.Context(), "go")
		tr := toolRecord(t, res, "fail")
		info := errorInfo(t, tr.Result)
		if tr.Outcome != event.OutcomeError || tr.Phase != "" || info.Type != "tool_error" || !strings.Contains(info.Message, "disk full") {
			t.Fatalf("record %+v", tr)
		}
	})
}

func TestCooperativeCallThatIgnoresCancelIsAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "stubborn"}]}`, `{"text": "moved on", "first_chunk_delay": "10s"}`)
		var lateSeen atomic.Bool
		stubborn := goTool("stubborn", budget.Cooperative, 5*time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			time.Sleep(8 * time.Second) // ignores ctx
			return "finally", nil
		})
		var before int64
		stubborn.Budget.KillGrace = budget.Duration{D: 2 * time.Second}
		f := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{stubborn}}
		before = tool.AbandonedRunning()
		a, _ := agent.New(agent.Config{Models: f.models, Tools: f.tools})
		rec := &recorder{}
		done := make(chan *agent.Result)
		go func() { done <- a.Run(t.Context(), agent.Input{Text: "go"}, rec) }()
		time.Sleep(7*time.Second + time.Millisecond) // abandoned at 5s+2s
		synctest.Wait()
		if got := tool.AbandonedRunning() - before; got != 1 {
			t.Fatalf("abandoned running = %d, want 1", got)
		}
		res := <-done
		checkEvents(t, res, rec)
		if got := tool.AbandonedRunning() - before; got != 0 {
			t.Fatalf("abandoned running after return = %d", got)
		}
		tr := toolRecord(t, res, "stubborn")
		checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeAbandoned, Abandoned: true, DurationMS: 7000, Phase: budget.PhaseTool},
			"Outcome", "Abandoned", "DurationMS", "Phase")
		if !tr.LateResult || tr.LateOutput != "finally" {
			t.Fatalf("late result not recorded: %+v", tr)
		}
		info := errorInfo(t, tr.Result)
		if info.Type != "tool_timeout" || strings.Contains(p.last().Messages[2].Content, "finally") {
			t.Fatalf("model saw the late result or no timeout: %+v", p.last().Messages)
		}
		if lr := rec.ofType(event.TypeLateResult); len(lr) != 1 || lr[0].Data.(*event.LateResult).Output != "finally" {
			t.Fatalf("late_result events %+v", lr)
		}
		_ = lateSeen.Load()
	})
}

func TestLateResultAfterTheTurnGoesToTheHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "stubborn"}]}`, `{"text": "done"}`)
		stubborn := goTool("stubborn", budget.Cooperative, time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			time.Sleep(time.Hour)
			return "much later", nil
		})
		got := make(chan event.ToolCall, 1)
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{stubborn},
			late: func(r event.ToolCall) { got <- r }}.run(t, t.Context(), "go")
		if res.Record.StopReason != budget.Answered || toolRecord(t, res, "stubborn").LateResult {
			t.Fatalf("turn %s", res.Record.StopReason)
		}
		r := <-got
		checkRecord(t, r, event.ToolCall{LateResult: true, LateOutput: "much later", Abandoned: true},
			"LateResult", "LateOutput", "Abandoned")
	})
}

func TestAdvisoryOverrunResultIsUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "slowpoke"}]}`, `{"text": "used it"}`)
		slow := goTool("slowpoke", budget.Advisory, time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			time.Sleep(3 * time.Second)
			return map[string]int{"rows": 42}, nil
		})
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{slow}}.run(t, t.Context(), "go")
		tr := toolRecord(t, res, "slowpoke")
		checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeOK, Overran: true, DurationMS: 3000, Result: `{"rows":42}`},
			"Outcome", "Overran", "DurationMS", "Result")
		if msgs := p.last().Messages; msgs[len(msgs)-1].Content != `{"rows":42}` {
			t.Fatalf("model saw %q", msgs[len(msgs)-1].Content)
		}
	})
}

// ticker reports progress every interval until ctx is done or silentAfter
// has passed, then stays silent.
func ticker(interval, silentAfter time.Duration) tool.Handler {
	return func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		start := time.Now()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return fmt.Sprintf("reported %d", i), ctx.Err()
			case <-time.After(interval):
			}
			if time.Since(start) < silentAfter {
				n := float64(i + 1)
				p.Report(tool.Report{Progress: &n, Message: "working"})
			}
		}
	}
}

func TestIdleTimeout(t *testing.T) {
	cases := []struct {
		name        string
		silentAfter time.Duration
		wantPhase   budget.Phase
		wantMS      int64
	}{
		// Reports every second: idle (3s) never fires, the absolute
		// timeout (10s) does, on time.
		{"progress keeps coming, absolute timeout still fires", time.Hour, budget.PhaseTool, 10000},
		// Goes silent after 4s: the last report is at 4s, idle fires 3s later.
		{"silence stops it", 4500 * time.Millisecond, budget.PhaseToolIdle, 7000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := lines(t, `{"tool_calls": [{"name": "crawl"}]}`, `{"text": "ok"}`)
				crawl := goTool("crawl", budget.Cooperative, 10*time.Second, ticker(time.Second, tc.silentAfter))
				crawl.Budget.IdleTimeout = secs(3*time.Second, budget.SourceTool, "tools[crawl].idle_timeout in agent.yaml")
				res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{crawl}}.run(t, t.Context(), "go")
				tr := toolRecord(t, res, "crawl")
				checkRecord(t, tr, event.ToolCall{Outcome: event.OutcomeTimedOut, Phase: tc.wantPhase, DurationMS: tc.wantMS},
					"Outcome", "Phase", "DurationMS")
				if tr.ProgressCount != len(rec.ofType(event.TypeToolProgress)) || tr.ProgressCount == 0 {
					t.Fatalf("progress count %d, events %d", tr.ProgressCount, len(rec.ofType(event.TypeToolProgress)))
				}
				info := errorInfo(t, tr.Result)
				if tc.wantPhase == budget.PhaseToolIdle && (info.Knob != "tools[crawl].idle_timeout in agent.yaml" || !strings.Contains(info.Message, "no progress for 3s")) {
					t.Fatalf("idle result %+v", info)
				}
				if res.Record.StopReason != budget.Answered {
					t.Fatalf("stop %s", res.Record.StopReason)
				}
			})
		})
	}
}

func TestLLMStalls(t *testing.T) {
	cases := []struct {
		name      string
		line      string
		wantPhase budget.Phase
		wantIn    []string
	}{
		{"stall before the first chunk", `{"text": "never", "stall_after": 0}`, budget.PhaseLLMFirstChunk,
			[]string{"llm_first_chunk", "timeouts.llm_first_chunk", "no reply within 60s"}},
		{"stall mid-reply", `{"chunks": ["one", "two", "three"], "stall_after": 2}`, budget.PhaseLLMIdle,
			[]string{"llm_idle", "timeouts.llm_idle", "went silent for 90s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := lines(t, tc.line)
				b := budget.Defaults()
				b.LLMFirstChunk.D, b.LLMIdle.D = 60*time.Second, 90*time.Second // as people write them: 60s, not 1m0s
				res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, budgets: b}.run(t, t.Context(), "hi")
				r := res.Record
				if r.Status != budget.StatusFailed || r.StopReason != budget.ModelUnavailable {
					t.Fatalf("got %s/%s", r.Status, r.StopReason)
				}
				for _, want := range tc.wantIn {
					if !strings.Contains(r.Message, want) {
						t.Errorf("message %q lacks %q", r.Message, want)
					}
				}
				mc := r.ModelCalls[0]
				if mc.Phase != tc.wantPhase || mc.Outcome != event.OutcomeTimedOut {
					t.Fatalf("model record %+v", mc)
				}
				// Chunks that arrive together may go as one llm_delta; the
				// deltas carry the text as it streamed, whatever their number.
				if tc.wantPhase == budget.PhaseLLMIdle && (r.Answer != "onetwo" || deltaText(rec) != "onetwo") {
					t.Fatalf("partial answer %q not kept (deltas %q)", r.Answer, deltaText(rec))
				}
			})
		})
	}
}

func TestLLMBudgetExcludesToolTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Each reply streams for 4s; the tool takes a minute. With a 10s
		// budget the second reply (8s in total) fits; the third does not.
		p := lines(t,
			`{"chunks": ["a"], "chunk_delay": "2s", "first_chunk_delay": "2s", "tool_calls": [{"name": "slow"}]}`)
		slow := goTool("slow", budget.Cooperative, 2*time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			time.Sleep(time.Minute)
			return "ok", nil
		})
		b := budget.Defaults()
		b.LLMBudget = secs(10*time.Second, budget.SourceFile, budget.KeyLLMBudget)
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{slow}, budgets: b}.run(t, t.Context(), "go")
		r := res.Record
		if r.StopReason != budget.LLMBudgetExhausted || r.Status != budget.StatusStopped {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
		if len(r.ToolCalls) != 2 || r.LLMMS != 10000 {
			t.Fatalf("%d tool calls, llm_ms %d", len(r.ToolCalls), r.LLMMS)
		}
		if !strings.Contains(r.Message, "timeouts.llm_budget") || !strings.Contains(r.Message, "not counted") {
			t.Fatalf("message %q", r.Message)
		}
		if last := r.ModelCalls[len(r.ModelCalls)-1]; last.Phase != budget.PhaseLLMBudget || r.Failovers != 0 {
			t.Fatalf("last model call %+v", last)
		}
	})
}

// TestLLMBudgetSpentByAFailedAttempt: a first attempt that spends what is
// left of llm_budget before it fails (here on llm_first_chunk, as long as
// the budget) ends the turn llm_budget_exhausted; the next link is not
// asked. (It was, with no bound at all: a budget of 0 left read as none.)
func TestLLMBudgetSpentByAFailedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stalls := lines(t, `{"text": "x", "stall_after": 0}`)
		trickles := lines(t, `{"text": "`+strings.Repeat("word ", 100)+`", "chunk_delay": "1s"}`)
		b := budget.Defaults()
		b.LLMFirstChunk = secs(3*time.Second, budget.SourceFile, budget.KeyLLMFirstChunk)
		b.LLMBudget = secs(3*time.Second, budget.SourceFile, budget.KeyLLMBudget)
		b.Turn = secs(time.Minute, budget.SourceFile, budget.KeyTurn)
		res, _ := fixture{models: []model.Endpoint{endpoint(stalls, "a"), endpoint(trickles, "b")}, budgets: b}.run(t, t.Context(), "go")
		r := res.Record
		if r.StopReason != budget.LLMBudgetExhausted || r.LLMMS != 3000 || len(r.ModelCalls) != 1 || r.Failovers != 0 {
			t.Fatalf("stopped %s after %d ms of model time, %d model calls, %d failovers: %s",
				r.StopReason, r.LLMMS, len(r.ModelCalls), r.Failovers, r.Message)
		}
	})
}

func TestStepWatchdog(t *testing.T) {
	t.Run("a declared-long tool inside its timeout is alive", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "batch"}]}`, `{"text": "ok"}`)
			batch := goTool("batch", budget.Cooperative, 10*time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
				time.Sleep(8 * time.Minute) // silent, longer than step (5m)
				return "done", nil
			})
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{batch}}.run(t, t.Context(), "go")
			if res.Record.StopReason != budget.Answered || toolRecord(t, res, "batch").Outcome != event.OutcomeOK {
				t.Fatalf("got %s: %s", res.Record.StopReason, res.Record.Message)
			}
		})
	})
	t.Run("an advisory tool past its timeout and silent keeps the turn alive", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The case: timeout 1s, silent for 3s, step 1500ms. The
			// advisory result must be used, not thrown away by no_progress.
			p := lines(t, `{"tool_calls": [{"name": "report"}]}`, `{"text": "ok"}`)
			report := goTool("report", budget.Advisory, time.Second, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
				select {
				case <-time.After(3 * time.Second):
					return "the report", nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
			b := budget.Defaults()
			b.Step = secs(1500*time.Millisecond, budget.SourceFile, budget.KeyStep)
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{report}, budgets: b}.run(t, t.Context(), "go")
			r := res.Record
			tr := toolRecord(t, res, "report")
			if r.StopReason != budget.Answered || tr.Outcome != event.OutcomeOK || !tr.Overran || tr.DurationMS != 3000 {
				t.Fatalf("got %s, record %+v: %s", r.StopReason, tr, r.Message)
			}
		})
	})
	t.Run("a silent advisory tool is still stopped by the turn ceiling", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "drift"}]}`, `{"text": "ok"}`)
			drift := goTool("drift", budget.Advisory, time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			})
			b := budget.Defaults()
			b.Turn = secs(20*time.Minute, budget.SourceFile, budget.KeyTurn)
			start := time.Now()
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{drift}, budgets: b}.run(t, t.Context(), "go")
			r := res.Record
			// step (5m) never fires while it runs; the ceiling does.
			if r.StopReason != budget.TurnTimeout || !r.Flags.TimedOutDuringToolExecution || !r.Flags.TimedOutByTurnBudget {
				t.Fatalf("got %s %+v: %s", r.StopReason, r.Flags, r.Message)
			}
			if d := time.Since(start); d != 20*time.Minute {
				t.Fatalf("stopped after %s", d)
			}
			if tr := toolRecord(t, res, "drift"); tr.Outcome != event.OutcomeCancelled || tr.Phase != budget.PhaseTurn {
				t.Fatalf("record %+v", tr)
			}
		})
	})
	t.Run("the step window starts again when an advisory call returns", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// After the advisory call returns at 8m the model stays silent:
			// step (5m) counts from the call's end, so the turn stops at 13m.
			p := lines(t, `{"tool_calls": [{"name": "drift"}]}`, `{"text": "x", "stall_after": 0}`)
			drift := goTool("drift", budget.Advisory, time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
				time.Sleep(8 * time.Minute)
				return "done", nil
			})
			b := budget.Defaults()
			b.LLMFirstChunk.D, b.LLMIdle.D = 0, 0
			start := time.Now()
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{drift}, budgets: b}.run(t, t.Context(), "go")
			if r := res.Record; r.StopReason != budget.NoProgress || r.Flags.TimedOutDuringToolExecution ||
				!strings.Contains(r.Message, "nothing progressed for 5m (timeouts.step)") {
				t.Fatalf("got %s %+v: %s", r.StopReason, r.Flags, r.Message)
			}
			if d := time.Since(start); d != 13*time.Minute {
				t.Fatalf("stopped after %s", d)
			}
		})
	})
	t.Run("a silent model with its watchdogs off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"text": "x", "stall_after": 0}`)
			b := budget.Defaults()
			b.LLMFirstChunk.D, b.LLMIdle.D = 0, 0
			b.Step.D = time.Minute
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "gpt-x")}, budgets: b}.run(t, t.Context(), "go")
			r := res.Record
			if r.StopReason != budget.NoProgress || r.Flags.TimedOutDuringToolExecution {
				t.Fatalf("got %s %+v", r.StopReason, r.Flags)
			}
			if !strings.Contains(r.Message, "Last step: model gpt-x, waiting for its reply") || r.Failovers != 0 {
				t.Fatalf("message %q", r.Message)
			}
		})
	})
	t.Run("progress reports keep a long silent stretch alive", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "crawl"}]}`, `{"text": "ok"}`)
			// Advisory, 1m budget, runs 8m reporting every minute: past its
			// own timeout only progress keeps it alive.
			crawl := goTool("crawl", budget.Advisory, time.Minute, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
				for range 8 {
					time.Sleep(time.Minute)
					p.Report(tool.Report{Message: "page"})
				}
				return "crawled", nil
			})
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{crawl}}.run(t, t.Context(), "go")
			if tr := toolRecord(t, res, "crawl"); res.Record.StopReason != budget.Answered || !tr.Overran || tr.ProgressCount != 8 {
				t.Fatalf("got %s %+v", res.Record.StopReason, tr)
			}
		})
	})
}

func TestTurnTimeoutDuringTool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "web_fetch"}]}`, `{"text": "never"}`)
		fetch := goTool("web_fetch", budget.Cooperative, 10*time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		b := budget.Defaults()
		b.Turn = secs(2*time.Minute, budget.SourceFile, budget.KeyTurn)
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m"), endpoint(p, "fallback")}, tools: []agent.Tool{fetch}, budgets: b}.run(t, t.Context(), "go")
		r := res.Record
		if r.Status != budget.StatusStopped || r.StopReason != budget.TurnTimeout {
			t.Fatalf("got %s/%s", r.Status, r.StopReason)
		}
		if !r.Flags.TimedOutByTurnBudget || !r.Flags.TimedOutDuringToolExecution {
			t.Fatalf("flags %+v", r.Flags)
		}
		want := "Stopped after 2m0s, the limit for one turn (timeouts.turn). Last step: tool web_fetch, running for 2m0s. Try a simpler request, or raise timeouts.turn."
		if r.Message != want {
			t.Fatalf("message\n got %q\nwant %q", r.Message, want)
		}
		if n := len(rec.ofType(event.TypeFailover)); n != 0 || r.Failovers != 0 || len(r.ModelCalls) != 1 {
			t.Fatalf("%d failovers, %d model calls", n, len(r.ModelCalls))
		}
		if strings.Contains(strings.ToLower(r.Message), "model") {
			t.Fatalf("message blames the model: %q", r.Message)
		}
		if tr := toolRecord(t, res, "web_fetch"); tr.Outcome != event.OutcomeCancelled || tr.Phase != budget.PhaseTurn {
			t.Fatalf("record %+v", tr)
		}
	})
}

func TestStillWorking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "slow"}]}`, `{"text": "ok"}`)
		slow := goTool("slow", budget.Cooperative, 5*time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			time.Sleep(100 * time.Second)
			return "ok", nil
		})
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{slow}}.run(t, t.Context(), "go")
		var got []int64
		for _, e := range rec.ofType(event.TypeStillWorking) {
			sw := e.Data.(*event.StillWorking)
			if sw.Subject != "tool slow" || sw.CallID != "call_1_1" || sw.LimitMS != 300000 ||
				len(sw.Calls) != 1 || sw.Calls[0] != (event.SilentCall{Subject: "tool slow", CallID: "call_1_1", Tool: "slow",
				ElapsedMS: sw.ElapsedMS, LimitMS: 300000, SilentMS: sw.ElapsedMS}) {
				t.Fatalf("still_working %+v", sw)
			}
			got = append(got, sw.ElapsedMS)
		}
		if fmt.Sprint(got) != "[30000 60000 90000]" {
			t.Fatalf("still_working at %v", got)
		}
		if res.Record.StopReason != budget.Answered {
			t.Fatal(res.Record.Message)
		}
	})
}

func TestLimits(t *testing.T) {
	echo := func(name string) agent.Tool {
		return goTool(name, budget.Cooperative, time.Minute, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
			time.Sleep(time.Second)
			return string(in), nil
		})
	}
	t.Run("max_steps", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "echo"}]}`)
			l := budget.DefaultLimits()
			l.MaxSteps.N = 3
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{echo("echo")}, limits: l}.run(t, t.Context(), "go")
			r := res.Record
			if r.StopReason != budget.MaxSteps || r.Steps != 3 || len(r.ToolCalls) != 3 || !strings.Contains(r.Message, "limits.max_steps") {
				t.Fatalf("got %s steps %d: %s", r.StopReason, r.Steps, r.Message)
			}
		})
	})
	t.Run("max_tool_calls", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "echo"}, {"name": "echo"}, {"name": "echo"}]}`)
			l := budget.DefaultLimits()
			l.MaxToolCalls.N = 2
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{echo("echo")}, limits: l}.run(t, t.Context(), "go")
			r := res.Record
			if r.StopReason != budget.MaxToolCalls || !strings.Contains(r.Message, "1 more asked for were not run") {
				t.Fatalf("got %s: %s", r.StopReason, r.Message)
			}
			var ok, refused int
			for _, tr := range r.ToolCalls {
				if tr.Outcome == event.OutcomeOK {
					ok++
				} else if errorInfo(t, tr.Result).Reason == "limit" {
					refused++
				}
			}
			if ok != 2 || refused != 1 {
				t.Fatalf("ok %d refused %d", ok, refused)
			}
			// The totals count the calls that ran, and the refused apart.
			if tot := r.Totals(); tot.ToolCalls != 2 || tot.ToolCallsRefused != 1 {
				t.Fatalf("totals %+v", tot)
			}
		})
	})
	t.Run("parallel_tools", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "w"}, {"name": "w"}, {"name": "w"}, {"name": "w"}, {"name": "w"}]}`, `{"text": "ok"}`)
			var now, peak atomic.Int32
			w := goTool("w", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
				n := now.Add(1)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				time.Sleep(time.Second)
				now.Add(-1)
				return "ok", nil
			})
			l := budget.DefaultLimits()
			l.ParallelTools.N = 2
			start := time.Now()
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{w}, limits: l}.run(t, t.Context(), "go")
			if peak.Load() != 2 || time.Since(start) != 3*time.Second || res.Record.StopReason != budget.Answered {
				t.Fatalf("peak %d, took %s", peak.Load(), time.Since(start))
			}
		})
	})
	t.Run("max_tool_output", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "big"}]}`, `{"text": "ok"}`)
			big := goTool("big", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
				return strings.Repeat("é", 2000), nil // 4000 bytes
			})
			l := budget.DefaultLimits()
			l.MaxToolOutput.N = 1025 // mid-character: cut before it
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{big}, limits: l}.run(t, t.Context(), "go")
			tr := toolRecord(t, res, "big")
			if !tr.Truncated || !strings.HasPrefix(tr.Result, strings.Repeat("é", 512)+"\n[output truncated") {
				t.Fatalf("record %+v", tr)
			}
		})
	})
}

func TestBadToolCalls(t *testing.T) {
	schema := json.RawMessage(`{"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}`)
	var ran atomic.Int32
	fetch := agent.Tool{Tool: tool.NewFunc("fetch", "fetches", schema, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		ran.Add(1)
		return "page", nil
	})}
	cases := []struct {
		name, call string
		reason     string
		field      string
	}{
		{"unknown tool", `{"name": "fetchh", "arguments": {"url": "x"}}`, "unknown_tool", ""},
		{"arguments not JSON", `{"name": "fetch", "arguments": "{\"url\": "}`, "invalid_json", ""},
		{"missing field", `{"name": "fetch", "arguments": {}}`, "invalid_arguments", "/url"},
		{"wrong type", `{"name": "fetch", "arguments": {"url": 3}}`, "invalid_arguments", "/url"},
		{"not an object", `{"name": "fetch", "arguments": "[1]"}`, "invalid_arguments", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := lines(t, `{"tool_calls": [`+tc.call+`]}`, `{"text": "recovered"}`)
				res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{fetch}}.run(t, t.Context(), "go")
				if res.Record.StopReason != budget.Answered || ran.Load() != 0 {
					t.Fatalf("got %s, tool ran %d times", res.Record.StopReason, ran.Load())
				}
				info := errorInfo(t, res.Record.ToolCalls[0].Result)
				if info.Type != "tool_error" || info.Reason != tc.reason || info.Field != tc.field {
					t.Fatalf("result %+v", info)
				}
				if got := res.Record.ToolCalls[0].Refused; got != tc.reason {
					t.Fatalf("record refused %q, want %q", got, tc.reason)
				}
				fin := res.Record.Events[len(res.Record.Events)-1].Data.(*event.TurnFinished)
				if fin.Totals.ToolCalls != 0 || fin.Totals.ToolCallsRefused != 1 {
					t.Fatalf("turn_finished totals %+v: a refused call is not a call that ran", fin.Totals)
				}
				if tc.field != "" && !strings.Contains(info.Message, "url") {
					t.Fatalf("message does not name the field: %q", info.Message)
				}
				if !json.Valid(res.Record.ToolCalls[0].Arguments) {
					t.Fatalf("record arguments are not JSON: %s", res.Record.ToolCalls[0].Arguments)
				}
			})
		})
	}
}

// TestGoToolBudgetIsBoundedByToolMax: tool_max bounds a budget given to a
// Go tool in code as it bounds one from the agent file.
func TestGoToolBudgetIsBoundedByToolMax(t *testing.T) {
	p := lines(t, `{"text": "ok"}`)
	b := budget.Defaults()
	b.ToolMax = secs(10*time.Minute, budget.SourceFile, budget.KeyToolMax)
	noop := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil }
	_, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Budgets: b,
		Tools: []agent.Tool{goTool("slow", budget.Cooperative, time.Hour, noop)}})
	want := "agent: tool slow: timeout 1h0m0s (tools[slow].timeout in agent.yaml) exceeds timeouts.tool_max (10m0s); lower it or raise timeouts.tool_max"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	if _, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Budgets: b,
		Tools: []agent.Tool{goTool("ok", budget.Cooperative, 10*time.Minute, noop)}}); err != nil {
		t.Fatalf("a timeout equal to tool_max: %v", err)
	}
}

// TestBudgetsSetInCodeSayCode: a budget given in Go code without a
// source (a Go tool's own timeout, the turn's) is recorded with source
// "code", so every record and tool_started says where its budget came
// from, as one from the agent file does.
func TestBudgetsSetInCodeSayCode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "quick"}, {"name": "plain"}]}`, `{"text": "ok"}`)
		noop := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil }
		quick := agent.Tool{Tool: tool.NewFunc("quick", "test tool", nil, noop),
			Budget: budget.ToolBudget{Timeout: budget.Duration{D: 500 * time.Millisecond}, IdleTimeout: budget.Duration{D: 100 * time.Millisecond}}}
		plain := agent.Tool{Tool: tool.NewFunc("plain", "test tool", nil, noop)}
		b := budget.Budgets{Turn: budget.Duration{D: time.Minute}}
		res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{quick, plain}, budgets: b}.run(t, t.Context(), "go")
		if r := toolRecord(t, res, "quick"); r.TimeoutSource != budget.SourceCode || r.TimeoutMS != 500 {
			t.Errorf("quick's record: timeout %dms from %q", r.TimeoutMS, r.TimeoutSource)
		}
		if r := toolRecord(t, res, "plain"); r.TimeoutSource != budget.SourceDefault {
			t.Errorf("plain's record: timeout from %q, want the default", r.TimeoutSource)
		}
		for _, e := range rec.ofType(event.TypeToolStarted) {
			if st := e.Data.(*event.ToolStarted); st.Source == "" {
				t.Errorf("tool_started of %s has no source", st.Tool)
			}
		}
		ts := rec.ofType(event.TypeTurnStarted)[0].Data.(*event.TurnStarted)
		if tb := ts.Budgets["timeouts.turn"]; tb.Source != budget.SourceCode || tb.MS != 60000 {
			t.Errorf("turn_started's turn budget %+v", tb)
		}
		if tb := ts.Tools["quick"]; tb.Source != budget.SourceCode {
			t.Errorf("turn_started's budget of quick %+v", tb)
		}
	})
}

// TestBudgetsSetInCodeAreChecked: agent.New refuses a budget or limit
// set in Go code that config.Load would refuse in a file: a turn of 0 with
// a source (it stopped every turn at once), a negative one, one past its
// bound, a tool timeout turned off.
func TestBudgetsSetInCodeAreChecked(t *testing.T) {
	p := lines(t, `{"text": "ok"}`)
	for _, c := range []struct {
		b    budget.Budgets
		l    budget.Limits
		want string
	}{
		{b: budget.Budgets{Turn: budget.Duration{Source: budget.SourceCode}}, want: "timeouts.turn cannot be off"},
		{b: budget.Budgets{Turn: budget.Duration{D: -time.Second}}, want: "timeouts.turn: -1s is negative"},
		{b: budget.Budgets{Turn: budget.Duration{D: 1000 * time.Hour}}, want: "1000h is over 168h, the most timeouts.turn accepts"},
		{b: budget.Budgets{Tool: budget.Duration{Source: budget.SourceCode}}, want: "timeouts.tool cannot be off"},
		{l: budget.Limits{MaxSteps: budget.Count{N: 1 << 40}}, want: "the most limits.max_steps accepts"},
	} {
		_, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Budgets: c.b, Limits: c.l})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %+v: %v, want %q", c.b, c.l, err, c.want)
		}
	}
	off := budget.Budgets{LLMIdle: budget.Duration{Source: budget.SourceCode}}
	if _, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Budgets: off}); err != nil {
		t.Errorf("llm_idle off, as the spec allows: %v", err)
	}
}

// TestASinkThatPanicsReachesRunsCaller: a sink that panics on an event
// emitted on a call's goroutine (a tool_progress, passed on from a
// goroutine of its own; a call of a batch running in parallel) panics out
// of Run, where its caller can recover it, as it does on the turn's own
// goroutine, instead of ending the process.
func TestASinkThatPanicsReachesRunsCaller(t *testing.T) {
	for _, typ := range []event.Type{event.TypeToolProgress, event.TypeToolFinished} {
		t.Run(string(typ), func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "a"}, {"name": "b"}]}`, `{"text": "ok"}`)
			work := func(_ context.Context, _ json.RawMessage, pr tool.Progress) (any, error) {
				pr.Report(tool.Report{Message: "half"})
				return "done", nil
			}
			a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")},
				Tools: []agent.Tool{goTool("a", budget.Cooperative, time.Minute, work), goTool("b", budget.Cooperative, time.Minute, work)}})
			if err != nil {
				t.Fatal(err)
			}
			var got any
			func() {
				defer func() { got = recover() }()
				a.Run(t.Context(), agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) {
					if e.Type == typ {
						panic("sink: " + string(typ))
					}
				}))
			}()
			if got != "sink: "+string(typ) {
				t.Fatalf("recovered %v", got)
			}
		})
	}
}

func TestPanickingToolIsAToolError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "boom"}]}`, `{"text": "ok"}`)
		boom := goTool("boom", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
			panic("kaboom")
		})
		res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{boom}}.run(t, t.Context(), "go")
		tr := toolRecord(t, res, "boom")
		if tr.Outcome != event.OutcomeError || !strings.Contains(tr.Result, "tool panicked: kaboom") {
			t.Fatalf("record %+v", tr)
		}
		// The stack, with this machine's paths, is the record's, not the
		// model's.
		if strings.Contains(tr.Result, "goroutine") || strings.Contains(tr.Result, ".go:") {
			t.Errorf("the model was given the stack: %s", tr.Result)
		}
		if !strings.Contains(tr.StderrTail, "goroutine") {
			t.Errorf("the record lacks the stack: %q", tr.StderrTail)
		}
	})
}

func TestCancellation(t *testing.T) {
	for _, reason := range []budget.StopReason{budget.Cancelled, budget.ClientGone, budget.Shutdown} {
		t.Run(string(reason), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := lines(t, `{"tool_calls": [{"name": "web_fetch"}]}`, `{"text": "never"}`)
				fetch := goTool("web_fetch", budget.Cooperative, 10*time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
					<-ctx.Done()
					return nil, ctx.Err()
				})
				ctx, cancel := context.WithCancelCause(t.Context())
				time.AfterFunc(12*time.Second, func() { cancel(&budget.CancelError{Reason: reason}) })
				res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{fetch}}.run(t, ctx, "go")
				r := res.Record
				if r.Status != budget.StatusCancelled || r.StopReason != reason || r.Flags != (event.Flags{}) {
					t.Fatalf("got %s/%s %+v", r.Status, r.StopReason, r.Flags)
				}
				if !strings.Contains(r.Message, "after 12s") || !strings.Contains(r.Message, "tool web_fetch was stopped") {
					t.Fatalf("message %q", r.Message)
				}
				if tr := toolRecord(t, res, "web_fetch"); tr.Outcome != event.OutcomeCancelled || tr.Phase != budget.PhaseCancel {
					t.Fatalf("record %+v", tr)
				}
			})
		})
	}
	t.Run("bare cancel reads as cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"text": "slow", "first_chunk_delay": "1m"}`)
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(time.Second, cancel)
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}}.run(t, ctx, "go")
			if res.Record.StopReason != budget.Cancelled || !strings.Contains(res.Record.Message, "Last step: model m") {
				t.Fatalf("got %s: %s", res.Record.StopReason, res.Record.Message)
			}
		})
	})
	// The caller's own deadline is the caller's cancel, not the turn's
	// budget: nothing says timeouts.turn (30m) fired (SPEC: cancelling the
	// context cancels the turn exactly as a client would).
	t.Run("the context's deadline reads as the caller's", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := lines(t, `{"tool_calls": [{"name": "web_fetch"}]}`, `{"text": "never"}`)
			fetch := goTool("web_fetch", budget.Cooperative, 10*time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			})
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			res, _ := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: []agent.Tool{fetch}}.run(t, ctx, "go")
			r := res.Record
			if r.Status != budget.StatusCancelled || r.StopReason != budget.Cancelled || r.Flags != (event.Flags{}) {
				t.Fatalf("got %s/%s %+v: %s", r.Status, r.StopReason, r.Flags, r.Message)
			}
			if want := "Cancelled by the caller's deadline after 3s; tool web_fetch was stopped."; r.Message != want {
				t.Fatalf("message %q, want %q", r.Message, want)
			}
			if tr := toolRecord(t, res, "web_fetch"); tr.Outcome != event.OutcomeCancelled || tr.Phase != budget.PhaseCancel {
				t.Fatalf("record %+v", tr)
			}
		})
	})
}

func TestFailover(t *testing.T) {
	t.Run("stall falls back and answers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			bad := lines(t, `{"chunks": ["par", "tial"], "stall_after": 1}`)
			good := lines(t, `{"text": "fallback answer"}`)
			res, rec := fixture{models: []model.Endpoint{endpoint(bad, "primary"), endpoint(good, "backup")}}.run(t, t.Context(), "hi")
			r := res.Record
			if r.StopReason != budget.Answered || r.Answer != "fallback answer" || r.Failovers != 1 {
				t.Fatalf("got %s %q", r.StopReason, r.Answer)
			}
			fo := rec.ofType(event.TypeFailover)
			if len(fo) != 1 || fo[0].Data.(*event.Failover).Phase != budget.PhaseLLMIdle || fo[0].Data.(*event.Failover).From != "script:primary" {
				t.Fatalf("failover events %+v", fo)
			}
			if len(r.ModelCalls) != 2 || r.ModelCalls[0].Phase != budget.PhaseLLMIdle || r.ModelCalls[1].Attempt != 2 {
				t.Fatalf("model calls %+v", r.ModelCalls)
			}
		})
	})
	t.Run("a refusal is not retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			bad := lines(t, `{"error": {"status": 400, "message": "the model name is unknown."}}`)
			good := lines(t, `{"text": "never"}`)
			res, rec := fixture{models: []model.Endpoint{endpoint(bad, "primary"), endpoint(good, "backup")}}.run(t, t.Context(), "hi")
			r := res.Record
			if r.Status != budget.StatusFailed || r.StopReason != budget.ModelRejected || len(rec.ofType(event.TypeFailover)) != 0 {
				t.Fatalf("got %s", r.StopReason)
			}
			if !strings.Contains(r.Message, "HTTP 400): the model name is unknown. This is not a timeout") || strings.Contains(r.Message, "..") {
				t.Fatalf("message %q", r.Message)
			}
		})
	})
	t.Run("idle breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var eps []model.Endpoint
			for i := range 5 {
				eps = append(eps, endpoint(lines(t, `{"text": "x", "stall_after": 0}`), fmt.Sprint("m", i)))
			}
			res, _ := fixture{models: eps}.run(t, t.Context(), "hi")
			r := res.Record
			if r.StopReason != budget.ModelUnresponsive || len(r.ModelCalls) != 3 || !strings.Contains(r.Message, "limits.idle_breaker") {
				t.Fatalf("got %s after %d calls: %s", r.StopReason, len(r.ModelCalls), r.Message)
			}
		})
	})
}

func TestHistoryCarriesOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}`, `{"text": "first"}`, `{"text": "second"}`)
		echo := goTool("echo", budget.Cooperative, time.Minute, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
			return string(in), nil
		})
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Tools: []agent.Tool{echo}})
		if err != nil {
			t.Fatal(err)
		}
		r1 := a.Run(t.Context(), agent.Input{SessionID: "s", Text: "one"})
		r2 := a.Run(t.Context(), agent.Input{SessionID: "s", Text: "two", History: r1.Messages})
		if r2.Record.Answer != "second" {
			t.Fatalf("answer %q", r2.Record.Answer)
		}
		msgs := p.last().Messages
		if len(msgs) != 5 || msgs[2].Content != `{"x": 1}` || msgs[4].Content != "two" {
			t.Fatalf("history %+v", msgs)
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	p := lines(t, `{"text": "x"}`)
	f := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return nil, nil }
	var nilTyped func(context.Context, struct{}, tool.Progress) (string, error)
	ms := []model.Endpoint{endpoint(p, "m")}
	withBudget := func(b budget.ToolBudget) agent.Config {
		return agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a", "", nil, f), Budget: b}}}
	}
	cases := map[string]struct {
		cfg  agent.Config
		want string // in the error: what is wrong and what to do
	}{
		"no model":       {agent.Config{}, "give at least one model.Endpoint"},
		"bad tool name":  {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a b", "", nil, f)}}}, `tool name "a b": use 1 to 64`},
		"duplicate tool": {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a", "", nil, f)}, {Tool: tool.NewFunc("a", "", nil, f)}}}, `two tools are named "a"`},
		"bad schema":     {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a", "", json.RawMessage(`{"type": 3}`), f)}}}, "input_schema is not a JSON Schema"},
		// A tool that cannot run, or a budget the agent file would refuse,
		// is refused when the agent is built, not found out at a call
		// or silently replaced by the default.
		"no tool":             {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a", "", nil, f)}, {}}}, "a tool entry has no Tool (give it one"},
		"nil handler":         {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.NewFunc("a", "", nil, nil)}}}, "tool a: the tool has no function"},
		"nil typed function":  {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.Typed("a", "", nilTyped)}}}, "tool a: the tool has no function"},
		"negative timeout":    {withBudget(budget.ToolBudget{Timeout: budget.Duration{D: -time.Second}}), "tool a: Budget.Timeout -1s is negative"},
		"timeout off":         {withBudget(budget.ToolBudget{Timeout: budget.Duration{Source: budget.SourceCode}}), "every tool call needs a time limit"},
		"negative idle":       {withBudget(budget.ToolBudget{IdleTimeout: budget.Duration{D: -time.Second}}), "Budget.IdleTimeout -1s is negative"},
		"negative kill grace": {withBudget(budget.ToolBudget{KillGrace: budget.Duration{D: -time.Second}}), "Budget.KillGrace -1s is negative"},
		"input not an object": {agent.Config{Models: ms, Tools: []agent.Tool{{Tool: tool.Typed("a", "", func(context.Context, string, tool.Progress) (string, error) { return "", nil })}}}, `tool a: input_schema.type is "string", but a tool's arguments are always a JSON object`},
		"unknown enforcement": {withBudget(budget.ToolBudget{Enforcement: "soft"}), `Budget.Enforcement "soft" is not an enforcement mode (use budget.Hard`},
	}
	for name, c := range cases {
		if _, err := agent.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
