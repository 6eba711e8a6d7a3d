package temporal_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	timebox "github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/temporal"
)

// TestTracesOnTemporal: a turn run on Temporal is one trace, as on the
// embedded engine: the runner's invoke_agent span, and under it the chat
// and execute_tool spans the worker makes, by the traceparent the turn's
// state carries to it.
func TestTracesOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	file := agentFile(t, dir, "echo slow done")
	// The worker and the runner are built apart, as in two processes.
	worker, err := timebox.Open(context.Background(), file, timebox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	startWorker(t, c, s, queue, worker.Agent)
	runner, err := timebox.Open(context.Background(), file, timebox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()
	r, err := temporal.NewRunner(c, s, queue, runner.Agent)
	if err != nil {
		t.Fatal(err)
	}
	res := r.Run(context.Background(), agent.Input{Text: "go"})
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", res.Record.Status, res.Record.Message)
	}
	var turn sdktrace.ReadOnlySpan
	names := map[string]int{}
	for _, sp := range rec.Ended() {
		names[sp.Name()]++
		if strings.HasPrefix(sp.Name(), "invoke_agent ") {
			turn = sp
		}
	}
	if turn == nil {
		t.Fatalf("no invoke_agent span: %v", names)
	}
	if names["chat test"] != 3 || names["execute_tool quick"] != 1 || names["execute_tool hung"] != 1 || names["execute_tool slow"] != 1 {
		t.Errorf("spans %v", names)
	}
	for _, sp := range rec.Ended() {
		if sp == turn {
			continue
		}
		if sp.SpanContext().TraceID() != turn.SpanContext().TraceID() || sp.Parent().SpanID() != turn.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the turn's span", sp.Name())
		}
		if sp.Name() == "execute_tool hung" {
			for _, kv := range sp.Attributes() {
				if kv.Key == "error.type" && kv.Value.AsString() != "timed_out" {
					t.Errorf("hung: error.type %s", kv.Value.AsString())
				}
			}
		}
	}
}

// TestTracesOfAWorkerStopped: a worker stopped (SIGTERM, a deploy) while
// a tool runs gives the call up — Temporal no longer has it — and another
// worker records it lost. The trace has one span for the call, the lost
// one, as the record says; not also one "cancelled" by the stopping
// worker, whose account of the call the store never took. That span has
// the ids the call's tool_started named — those of the span the stopped
// worker began, which its tool was given — so that what the tool exported
// under them has its parent (before, ids of its own).
func TestTracesOfAWorkerStopped(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "slow"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: stopped\nmodel: {primary: script:test}\nproviders: {script: {file: script.jsonl}}\n"+
		"timeouts: {kill_grace: 200ms, turn: 1m}\ntools:\n  - name: slow\n    exec: [sleep, \"30\"]\n    timeout: 30s\n"), 0o644)
	tp, rec := recorded(t)
	wa := runningWorker(t, c, queue, openTraced(t, file, tp), s)
	r, err := temporal.NewRunner(c, s, queue, openTraced(t, file, tp))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *agent.Result, 1)
	go func() { done <- r.Run(context.Background(), agent.Input{TurnID: "t_stopped", Text: "go"}) }()
	wait.For(t, 30*time.Second, "the call to start", func() bool {
		evs, _ := s.Events(context.Background(), "t_stopped", 0, 0)
		for _, e := range evs {
			if e.Type == event.TypeToolStarted {
				return true
			}
		}
		return false
	})
	wa.Stop()
	startWorker(t, c, s, queue, openTraced(t, file, tp))
	res := <-done
	turnSpanEnded(t, rec)
	if res.Record.Status != budget.StatusCompleted || len(res.Record.ToolCalls) != 1 || res.Record.ToolCalls[0].Phase != budget.PhaseWorkerLost {
		t.Fatalf("turn %s (%s), calls %+v", res.Record.Status, res.Record.Message, res.Record.ToolCalls)
	}
	// Its record says in words who gave it up, for the model and for
	// the person reading it: no error's Go formatting.
	if why := res.Record.ToolCalls[0].Result; !strings.Contains(why, "The call was lost: it was given up by the worker, stopping (worker ") ||
		strings.Contains(why, "(type:") {
		t.Errorf("the lost call's result: %s", why)
	}
	var calls, ids []string
	for _, sp := range rec.Ended() {
		if sp.Name() == "execute_tool slow" {
			var outcome string
			for _, kv := range sp.Attributes() {
				if kv.Key == "timebox.outcome" {
					outcome = kv.Value.AsString()
				}
			}
			calls = append(calls, outcome)
			ids = append(ids, fmt.Sprintf("00-%s-%s-01", sp.SpanContext().TraceID(), sp.SpanContext().SpanID()))
		}
	}
	if len(calls) != 1 || calls[0] != "interrupted" {
		t.Errorf("the call's spans end %v; want one, interrupted (its record: %s)", calls, res.Record.ToolCalls[0].Result)
	}
	var named string
	for _, e := range res.Record.Events {
		if d, ok := e.Data.(*event.ToolStarted); ok {
			named = d.Traceparent
		}
	}
	if named == "" || len(ids) != 1 || ids[0] != named {
		t.Errorf("the lost call's span is %v; its tool_started named %q", ids, named)
	}
}

// TestTracesOfAWorkerLostMidAttempt: the worker streaming a model attempt
// dies — here its store and its spans go with it, as with kill -9 — and
// the worker that asks the step again records the attempt lost. The lost
// attempt's chat span has the ids its llm_started named — those of the
// span the dead worker began, sent to the model server as its
// traceparent header — so that what the server exported under them has
// its parent (before, ids of its own).
func TestTracesOfAWorkerLostMidAttempt(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	// A turn and a task queue of its own, run after run (-count=N).
	id := agent.NewTurnID()
	queue += "-" + id
	// Each worker plays the step's line from its start (the turn's place
	// in the script is the one before the step): slow enough for the
	// death to come while it streams, and played again to its end.
	file := slowAttemptAgent(t, "lost")
	// The dying worker's spans are never looked at: they die with it.
	dyingTP, _ := recorded(t)
	tp, rec := recorded(t)
	dying := &dyingStore{Store: s.(*postgres.Store)}
	wa := runningWorker(t, c, queue, openTraced(t, file, dyingTP), dying)
	done := startRun(t, c, s, queue, openTraced(t, file, tp), id)
	waitStored(t, s, id, event.TypeLLMStarted, "the attempt to start")
	dying.dead.Store(true)
	wa.Stop()
	startWorker(t, c, s, queue, openTraced(t, file, tp))
	res := <-done
	turnSpanEnded(t, rec)
	mc := res.Record.ModelCalls
	if res.Record.Status != budget.StatusCompleted || len(mc) != 2 || mc[0].Phase != budget.PhaseWorkerLost || mc[1].Outcome != event.OutcomeOK {
		t.Fatalf("turn %s (%s), attempts %+v", res.Record.Status, res.Record.Message, mc)
	}
	named := map[int]string{}
	for _, e := range res.Record.Events {
		if d, ok := e.Data.(*event.LLMStarted); ok {
			named[d.Attempt] = d.Traceparent
		}
	}
	var turn sdktrace.ReadOnlySpan
	spans := map[int64]sdktrace.ReadOnlySpan{} // the chat spans, by attempt
	for _, sp := range rec.Ended() {
		if strings.HasPrefix(sp.Name(), "invoke_agent ") {
			turn = sp
		}
		for _, kv := range sp.Attributes() {
			if kv.Key == "timebox.attempt" && sp.Name() == "chat test" {
				if _, twice := spans[kv.Value.AsInt64()]; twice {
					t.Errorf("attempt %d has two chat spans", kv.Value.AsInt64())
				}
				spans[kv.Value.AsInt64()] = sp
			}
		}
	}
	lost := spans[1]
	if turn == nil || lost == nil || spans[2] == nil || len(spans) != 2 {
		t.Fatalf("the turn's span %v, chat spans of attempts %v; want the turn's, and one of each attempt", turn != nil, spans)
	}
	ids := fmt.Sprintf("00-%s-%s-01", lost.SpanContext().TraceID(), lost.SpanContext().SpanID())
	if named[1] == "" || ids != named[1] {
		t.Errorf("the lost attempt's span is %s; its llm_started named %q", ids, named[1])
	}
	if lost.Parent().SpanID() != turn.SpanContext().SpanID() || lost.Status().Code != codes.Error {
		t.Errorf("the lost attempt's span is under %s, status %v; want under the turn's %s, an error", lost.Parent().SpanID(),
			lost.Status(), turn.SpanContext().SpanID())
	}
}

// dyingStore is a worker's store that, once dead, takes none of its
// events, as the store of a worker killed takes none.
type dyingStore struct {
	*postgres.Store
	dead atomic.Bool
}

func (d *dyingStore) AppendEvent(ctx context.Context, e event.Event) error {
	if d.dead.Load() {
		return errors.New("the worker died")
	}
	return d.Store.AppendEvent(ctx, e)
}

func (d *dyingStore) QueueEvent(e event.Event, committed func(error)) {
	if d.dead.Load() {
		committed(errors.New("the worker died"))
		return
	}
	d.Store.QueueEvent(e, committed)
}

// TestTurnSpanOfATurnItsRunnerLeft: the runner begins a turn's span, and
// a gateway shutting down stops following its turns (agent.ErrStopFollowing),
// which run on and end on the workers. The worker that stores the turn's
// end makes the turn's span, with the ids the runner began it with — the
// parent its calls' spans name — and the runner leaves it unended (before:
// the runner ended it at once, "running", an error, before the calls it
// parents). A turn its runner follows to the end has one span too.
func TestTurnSpanOfATurnItsRunnerLeft(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	file := agentFile(t, dir, "sleep 1; echo slow done")
	wtp, wrec := recorded(t)
	rtp, rrec := recorded(t)
	startWorker(t, c, s, queue, openTraced(t, file, wtp))
	r, err := temporal.NewRunner(c, s, queue, openTraced(t, file, rtp))
	if err != nil {
		t.Fatal(err)
	}
	turnSpans := func(rec *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, sp := range rec.Ended() {
			if strings.HasPrefix(sp.Name(), "invoke_agent ") {
				out = append(out, sp)
			}
		}
		return out
	}

	id := stopFollowingMidTool(t, r)
	wait.For(t, 60*time.Second, "the turn to end on its worker", func() bool {
		rec, err := s.Turn(context.Background(), id)
		return err == nil && rec.Status != budget.StatusRunning
	})
	var tp string
	evs, _ := s.Events(context.Background(), id, 0, 0)
	for _, e := range evs {
		if d, ok := e.Data.(*event.TurnStarted); ok {
			tp = d.Traceparent
		}
	}
	if n := len(turnSpans(rrec)); n != 0 {
		t.Errorf("the runner that stopped following ended %d turn spans; want none", n)
	}
	made := turnSpans(wrec)
	if len(made) != 1 {
		t.Fatalf("the worker made %d turn spans; want 1", len(made))
	}
	turn := made[0]
	if got := fmt.Sprintf("00-%s-%s-01", turn.SpanContext().TraceID(), turn.SpanContext().SpanID()); got != tp {
		t.Errorf("the worker's turn span is %s; turn_started named %s", got, tp)
	}
	if turn.Status().Code == codes.Error {
		t.Errorf("the completed turn's span is an error: %v", turn.Status())
	}
	children := 0
	for _, sp := range wrec.Ended() {
		if sp != turn && sp.Parent().SpanID() == turn.SpanContext().SpanID() {
			children++
			if sp.EndTime().After(turn.EndTime()) || sp.StartTime().Before(turn.StartTime()) {
				t.Errorf("%s runs outside its turn's span", sp.Name())
			}
		}
	}
	if children < 4 {
		t.Errorf("%d spans under the turn's; want its model and tool calls", children)
	}

	// Followed to the end: one span, whichever process made it.
	res := r.Run(context.Background(), agent.Input{Text: "again"})
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", res.Record.Status, res.Record.Message)
	}
	n := 0
	for _, sp := range append(turnSpans(wrec), turnSpans(rrec)...) {
		for _, kv := range sp.Attributes() {
			if kv.Key == "timebox.turn.id" && kv.Value.AsString() == res.Record.TurnID {
				n++
			}
		}
	}
	if n != 1 {
		t.Errorf("%d spans of the turn followed to its end; want 1", n)
	}
}

// TestTurnSpanOfAWorkerStopping: a worker stopped (SIGTERM, a deploy) as
// one of its units stores its turn's end, having noted that it makes the
// turn's span (the runner then leaves the span to it), ends the span
// before its Stop returns, and stores the end all the same: a program
// shuts its tracing down after Stop. Before, Temporal's Stop returned at
// once and cancelled the unit's write of the end: the end was stored, or
// not, and the span was never exported — the turn had no invoke_agent
// span, and its calls' spans no parent (the fault suite's "worker kill -9
// mid-tool, retried", whose worker is stopped as soon as the end is
// stored, once in seventeen runs).
func TestTurnSpanOfAWorkerStopping(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue, dsn := setupDSN(t)
	// A turn and a task queue of its own, run after run: the workflow a
	// stopped worker leaves on the shared dev server is no other's.
	id := agent.NewTurnID()
	queue += "-" + id
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: stopping\nmodel: {primary: script:test}\nproviders: {script: {file: script.jsonl}}\ntimeouts: {turn: 1m}\n"), 0o644)
	turnSpans := func(rec *tracetest.SpanRecorder) int {
		n := 0
		for _, sp := range rec.Ended() {
			if strings.HasPrefix(sp.Name(), "invoke_agent ") {
				n++
			}
		}
		return n
	}
	ps, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	held := &heldEnd{Store: ps, noted: make(chan context.Context, 1), release: make(chan struct{})}
	wtp, wrec := recorded(t)
	rtp, rrec := recorded(t)
	w := runningWorker(t, c, queue, openTraced(t, file, wtp), held)
	done := startRun(t, c, s, queue, openTraced(t, file, rtp), id)
	var unit context.Context
	select {
	case unit = <-held.noted:
	case <-time.After(60 * time.Second):
		t.Fatal("no unit noted that it makes the turn's span")
	}
	// The unit stores the end once the worker's stop has given it up
	// (cancelled its context).
	stopped := make(chan int, 1)
	go func() {
		w.Stop()
		stopped <- turnSpans(wrec)
	}()
	select {
	case <-unit.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the worker's stop did not give the unit up")
	}
	close(held.release)
	select {
	case n := <-stopped:
		if n != 1 {
			t.Errorf("when the worker's Stop returned, it had ended %d turn spans; want 1, the one it noted it makes", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker's Stop did not return")
	}
	var res *agent.Result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the runner did not see the turn end")
	}
	if res.Record.Status != budget.StatusCompleted {
		t.Errorf("turn ended %s (%s); want completed, as its unit stored it", res.Record.Status, res.Record.Message)
	}
	if n := turnSpans(rrec); n != 0 {
		t.Errorf("the runner ended %d turn spans; want none, the worker noted it makes it", n)
	}
	// The worker's Stop waited for its workflow task (WorkerStopTimeout,
	// relaying.Stop): none of its goroutines is left for the leak check.
}

// heldEnd is a worker's store that holds a turn's end until release, and
// passes on the context of the note that the unit makes the turn's span.
type heldEnd struct {
	*postgres.Store
	noted   chan context.Context
	release chan struct{}
}

func (h *heldEnd) PutPayloads(ctx context.Context, turnID string, payloads map[string][]byte) error {
	err := h.Store.PutPayloads(ctx, turnID, payloads)
	if _, ok := payloads["turn-span"]; ok && err == nil {
		select {
		case h.noted <- ctx:
		default:
		}
	}
	return err
}

func (h *heldEnd) FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	<-h.release
	return h.Store.FinishTurn(ctx, rec, msgs)
}

// TestCeilingWithoutWorkerTraced: the only worker of a turn stops while a
// tool runs, and the runner ends the turn at its ceiling itself, recording
// the running call interrupted (TestCeilingWithoutWorker). The worker's
// span of the call died with it; the runner makes it, with the ids the
// call's tool_started carries, under the turn's span, interrupted, ended
// at the turn's end. Before, the trace had the model call's span and the
// turn's, no execute_tool.
func TestCeilingWithoutWorkerTraced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	file := stopAgent(t, "6s")
	wtp, wrec := recorded(t)
	rtp, rrec := recorded(t)
	rec, _ := endsWithoutWorkerOf(t, openTraced(t, file, wtp), openTraced(t, file, rtp), agent.Input{Text: "go"}, event.TypeToolStarted, 36*time.Second)
	if rec.StopReason != budget.TurnTimeout {
		t.Fatalf("ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	var started *event.ToolStarted
	for _, e := range rec.Events {
		if d, ok := e.Data.(*event.ToolStarted); ok && d.Tool == "long" {
			started = d
		}
	}
	if started == nil || started.Traceparent == "" {
		t.Fatalf("the call's tool_started %+v names no span", started)
	}
	var turn sdktrace.ReadOnlySpan
	var calls []sdktrace.ReadOnlySpan
	for _, sp := range append(wrec.Ended(), rrec.Ended()...) {
		switch sp.Name() {
		case "invoke_agent stops":
			turn = sp
		case "execute_tool long":
			calls = append(calls, sp)
		}
	}
	if turn == nil || len(calls) != 1 {
		t.Fatalf("turn span %v, %d spans of the running call; want one of each", turn != nil, len(calls))
	}
	call := calls[0]
	attrs := map[string]any{}
	for _, kv := range call.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	if got := fmt.Sprintf("00-%s-%s-01", call.SpanContext().TraceID(), call.SpanContext().SpanID()); got != started.Traceparent ||
		call.Parent().SpanID() != turn.SpanContext().SpanID() || !call.EndTime().Equal(rec.EndedAt) ||
		call.Status().Code != codes.Error || attrs["error.type"] != "interrupted" || attrs["timebox.outcome"] != "interrupted" ||
		attrs["gen_ai.tool.call.id"] != started.CallID || attrs["timebox.budget.ms"] != int64(20000) {
		t.Errorf("the call's span %s under %s, ends %s (the turn %s), status %v, attributes %v; tool_started named %s under %s",
			got, call.Parent().SpanID(), call.EndTime(), rec.EndedAt, call.Status(), attrs, started.Traceparent, turn.SpanContext().SpanID())
	}
	if n := len(wrec.Ended()) + len(rrec.Ended()); n != 3 {
		t.Errorf("%d spans; want the turn's, the model call's and the tool call's", n)
	}
}

// TestCeilingWithoutWorkerMidAttemptTraced: the only worker of a turn
// stops while its model attempt waits for the first chunk, and the runner
// ends the turn at its ceiling itself (store.Interrupter). The worker's
// chat span of the attempt died with it (Temporal gave its unit up); the
// runner makes it, as the process that ends a turn from outside does
// (agent.TraceEnded): with the ids the attempt's llm_started carries —
// those its model request was sent — under the turn's span, interrupted,
// with the turn's message, from the attempt's start to the turn's last
// stored event before its end. Before, the runner made the spans of the
// running calls only: the trace had the turn's span and no chat span.
func TestCeilingWithoutWorkerMidAttemptTraced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	file := slowAttemptAgentOf(t, "stops", "1m", "4s")
	// The worker's spans are never looked at: like its store (closed
	// before it stops), they die with it, as a killed worker's do.
	wtp, _ := recorded(t)
	rtp, rrec := recorded(t)
	rec, _ := endsWithoutWorkerOf(t, openTraced(t, file, wtp), openTraced(t, file, rtp), agent.Input{Text: "go"}, event.TypeLLMStarted, 34*time.Second)
	if rec.StopReason != budget.TurnTimeout {
		t.Fatalf("ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	var started *event.LLMStarted
	var startedAt, last time.Time
	for _, e := range rec.Events {
		if d, ok := e.Data.(*event.LLMStarted); ok {
			started, startedAt = d, e.At
		}
		if e.Type != event.TypeTurnFinished {
			last = e.At
		}
	}
	if started == nil || started.Traceparent == "" {
		t.Fatalf("the attempt's llm_started %+v names no span", started)
	}
	var turn sdktrace.ReadOnlySpan
	var chats []sdktrace.ReadOnlySpan
	for _, sp := range rrec.Ended() {
		switch sp.Name() {
		case "invoke_agent stops":
			turn = sp
		case "chat test":
			chats = append(chats, sp)
		}
	}
	if turn == nil || len(chats) != 1 {
		t.Fatalf("turn span %v, %d spans of the attempt; want one of each", turn != nil, len(chats))
	}
	chat := chats[0]
	attrs := map[string]any{}
	for _, kv := range chat.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	if got := fmt.Sprintf("00-%s-%s-01", chat.SpanContext().TraceID(), chat.SpanContext().SpanID()); got != started.Traceparent ||
		chat.Parent().SpanID() != turn.SpanContext().SpanID() {
		t.Errorf("the attempt's span is %s under %s; its llm_started named %s, the turn's span is %s",
			got, chat.Parent().SpanID(), started.Traceparent, turn.SpanContext().SpanID())
	}
	if !chat.StartTime().Equal(startedAt) || !chat.EndTime().Equal(last) || !last.Before(rec.EndedAt) {
		t.Errorf("the attempt's span runs %s to %s; want its llm_started's %s to the last stored event %s (the turn ended %s)",
			chat.StartTime(), chat.EndTime(), startedAt, last, rec.EndedAt)
	}
	if chat.Status().Code != codes.Error || chat.Status().Description != rec.Message || attrs["error.type"] != "interrupted" ||
		attrs["timebox.outcome"] != "interrupted" || attrs["timebox.attempt"] != int64(1) || attrs["gen_ai.request.model"] != "test" ||
		attrs["timebox.budget.ms"] != int64(30000) {
		t.Errorf("the attempt's span: status %v, attributes %v; want interrupted, the turn's message %q", chat.Status(), attrs, rec.Message)
	}
	if n := len(rrec.Ended()); n != 2 {
		t.Errorf("the runner made %d spans; want the turn's and the attempt's", n)
	}
}

// TestEngineLostWithAWorkerAliveTraced: the process following a turn can
// no longer reach Temporal (its connection cut, for EngineGrace) while
// the worker running the turn's tool can, and goes on with the call. The
// follower ends the turn engine_lost itself, recording the running call
// interrupted, and makes the call's span with the ids its tool_started
// named (agent.TraceLost); the worker, whose unit sees the turn ended in
// the store, stops the call. The call has one execute_tool span of that
// id, not also one the worker ended.
func TestEngineLostWithAWorkerAliveTraced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	res, started, spans := engineLostMidCall(t, stopAgent(t, "1m"), 3*time.Second, func(ps *postgres.Store) store.Store { return ps })
	if call := callNamed(t, res.Record, "long"); call.Outcome != event.OutcomeInterrupted {
		t.Errorf("the running call ended %s, want interrupted", call.Outcome)
	}
	// The worker's unit ends once it saw the turn's end: its workflow
	// closes then, and every span the worker makes of it is made.
	if got, want := spans(), started.Traceparent+" interrupted"; len(got) != 1 || got[0] != want {
		t.Errorf("the call's spans: %q; want one, %q", got, want)
	}
}

// engineLostMidCall runs a turn of agent file whose tool is named long on
// a worker whose store is wrap of one of its own, followed by a runner
// that reaches Temporal through a connection the test cuts once the call
// started, for grace (EngineGrace), and returns the turn's result, ended
// engine_lost, and its call's start, which names the call's span. spans
// waits for the turn's workflow to close, then returns the call's
// execute_tool spans that the worker and the runner made, each as
// "traceparent outcome".
func engineLostMidCall(t *testing.T, file string, grace time.Duration, wrap func(*postgres.Store) store.Store) (_ *agent.Result, _ *event.ToolStarted, spans func() []string) {
	t.Helper()
	c, s, queue, dsn := setupDSN(t)
	defer func(g time.Duration) { temporal.EngineGrace = g }(temporal.EngineGrace)
	temporal.EngineGrace = grace
	wtp, wrec := recorded(t)
	rtp, rrec := recorded(t)
	ps, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	w := runningWorker(t, c, queue, openTraced(t, file, wtp), wrap(ps))
	t.Cleanup(w.Stop)
	p := cuttable(t, testenv.Temporal(t))
	rc, err := client.Dial(client.Options{HostPort: p.addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	r, err := temporal.NewRunner(rc, s, queue, openTraced(t, file, rtp))
	if err != nil {
		t.Fatal(err)
	}
	id := agent.NewTurnID()
	done := make(chan *agent.Result, 1)
	go func() { done <- r.Run(context.Background(), agent.Input{TurnID: id, Text: "go"}) }()
	waitStored(t, s, id, event.TypeToolStarted, "the call to start")
	p.cut()
	var res *agent.Result
	select {
	case res = <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("the turn was still running 40s after Temporal was cut off from its runner")
	}
	if res.Record.StopReason != budget.EngineLost {
		t.Fatalf("ended %s (%s): %s", res.Record.Status, res.Record.StopReason, res.Record.Message)
	}
	var started *event.ToolStarted
	for _, e := range res.Record.Events {
		if d, ok := e.Data.(*event.ToolStarted); ok {
			started = d
		}
	}
	if started == nil || started.Traceparent == "" {
		t.Fatalf("the call's tool_started %+v names no span", started)
	}
	return res, started, func() []string {
		wait.For(t, 60*time.Second, "the turn's workflow to close", func() bool {
			d, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(id), "")
			return err == nil && d.WorkflowExecutionInfo.Status != enums.WORKFLOW_EXECUTION_STATUS_RUNNING
		})
		var out []string
		for _, sp := range append(wrec.Ended(), rrec.Ended()...) {
			if sp.Name() != "execute_tool long" {
				continue
			}
			var outcome string
			for _, kv := range sp.Attributes() {
				if kv.Key == "timebox.outcome" {
					outcome = kv.Value.AsString()
				}
			}
			out = append(out, fmt.Sprintf("00-%s-%s-01 %s", sp.SpanContext().TraceID(), sp.SpanContext().SpanID(), outcome))
		}
		return out
	}
}

// proxy is a TCP proxy to a server whose connections the test cuts.
type proxy struct {
	addr string
	cut  func()
}

// cuttable starts a proxy to addr; cut closes it and every connection
// through it, and each new one is refused. It is cut when t ends.
func cuttable(t *testing.T, addr string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	keep := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			c.Close()
			return false
		}
		conns = append(conns, c)
		return true
	}
	conns = []net.Conn{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil || !keep(in) || !keep(out) {
				in.Close()
				if out != nil {
					out.Close()
				}
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
	var once sync.Once
	p := &proxy{addr: ln.Addr().String(), cut: func() {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			conns = nil
			mu.Unlock()
			wg.Wait()
		})
	}}
	t.Cleanup(p.cut)
	return p
}

// TestCeilingWithoutWorkerMidCompactionTraced: as
// TestCeilingWithoutWorkerMidAttemptTraced, while the turn compacts its
// history: the compaction's start names its span's ids (its request
// carries them), and the runner that ends the turn at its ceiling makes
// that span, under the turn's, interrupted. Before, a compaction's request
// carried no traceparent, nothing named its span, and one under way at
// such an end had none.
func TestCeilingWithoutWorkerMidCompactionTraced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	file, in := hungCompactionAgent(t)
	// The worker's spans die with it, as its store does.
	wtp, _ := recorded(t)
	rtp, rrec := recorded(t)
	rec, _ := endsWithoutWorkerOf(t, openTraced(t, file, wtp), openTraced(t, file, rtp), in, event.TypeCompactionStarted, 34*time.Second)
	if rec.StopReason != budget.TurnTimeout {
		t.Fatalf("ended %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	var started *event.CompactionStarted
	var startedAt time.Time
	for _, e := range rec.Events {
		if d, ok := e.Data.(*event.CompactionStarted); ok {
			started, startedAt = d, e.At
		}
	}
	if started == nil || started.Traceparent == "" {
		t.Fatalf("the compaction's compaction_started %+v names no span", started)
	}
	var turn, compaction sdktrace.ReadOnlySpan
	for _, sp := range rrec.Ended() {
		switch sp.Name() {
		case "invoke_agent compacts":
			turn = sp
		case "chat m":
			compaction = sp
		}
	}
	if n := len(rrec.Ended()); turn == nil || compaction == nil || n != 2 {
		t.Fatalf("the runner made %d spans, the turn's %v, the compaction's %v; want those two", n, turn != nil, compaction != nil)
	}
	attrs := map[string]any{}
	for _, kv := range compaction.Attributes() {
		attrs[string(kv.Key)] = kv.Value.AsInterface()
	}
	if got := fmt.Sprintf("00-%s-%s-01", compaction.SpanContext().TraceID(), compaction.SpanContext().SpanID()); got != started.Traceparent ||
		compaction.Parent().SpanID() != turn.SpanContext().SpanID() || !compaction.StartTime().Equal(startedAt) ||
		attrs["timebox.compaction"] != true || attrs["error.type"] != "interrupted" || attrs["timebox.budget.knob"] != budget.KeyCompaction {
		t.Errorf("the compaction's span %s under %s from %s, attributes %v; compaction_started named %s at %s, the turn's span is %s",
			got, compaction.Parent().SpanID(), compaction.StartTime(), attrs, started.Traceparent, startedAt, turn.SpanContext().SpanID())
	}
}

// TestTracesOfAWorkerLostMidCompaction: as TestTracesOfAWorkerLostMidAttempt,
// while the turn compacts: the compaction lost with its worker has its
// chat span (timebox.compaction) with the ids its compaction_started
// named, those its model request carried, made by the worker that
// records the loss. Before, that span had ids of its own: nothing named
// the compaction's span.
func TestTracesOfAWorkerLostMidCompaction(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	id := agent.NewTurnID()
	queue += "-" + id
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"compaction": true, "text": "A summary.", "first_chunk_delay": "2s"}`+"\n"+
		`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: lost\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ncontext: {compact_at: 50}\n"), 0o644)
	history := []model.Message{{Role: model.RoleUser, Content: strings.Repeat("a long question ", 40)},
		{Role: model.RoleAssistant, Content: strings.Repeat("a long answer ", 40)}}
	dyingTP, _ := recorded(t)
	tp, rec := recorded(t)
	dying := &dyingStore{Store: s.(*postgres.Store)}
	wa := runningWorker(t, c, queue, openTraced(t, file, dyingTP), dying)
	r, err := temporal.NewRunner(c, s, queue, openTraced(t, file, tp))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *agent.Result, 1)
	go func() {
		done <- r.Run(context.Background(), agent.Input{TurnID: id, SessionID: "s-" + id, History: history, Text: "and now?"})
	}()
	waitStored(t, s, id, event.TypeCompactionStarted, "the compaction to start")
	dying.dead.Store(true)
	wa.Stop()
	startWorker(t, c, s, queue, openTraced(t, file, tp))
	res := <-done
	turnSpanEnded(t, rec)
	named := map[int]string{}
	var fins []string
	for _, e := range res.Record.Events {
		switch d := e.Data.(type) {
		case *event.CompactionStarted:
			named[d.Attempt] = d.Traceparent
		case *event.CompactionFinished:
			fins = append(fins, string(d.Outcome)+" "+string(d.Phase))
		}
	}
	if res.Record.Status != budget.StatusCompleted || len(fins) != 2 || fins[0] != "interrupted worker_lost" {
		t.Fatalf("turn %s (%s), compactions %q; want the first lost with its worker, then the turn completed", res.Record.Status, res.Record.Message, fins)
	}
	var turn sdktrace.ReadOnlySpan
	spans := map[int64]sdktrace.ReadOnlySpan{} // the compactions' spans, by attempt
	for _, sp := range rec.Ended() {
		if strings.HasPrefix(sp.Name(), "invoke_agent ") {
			turn = sp
		}
		compaction, attempt := false, int64(0)
		for _, kv := range sp.Attributes() {
			switch kv.Key {
			case "timebox.compaction":
				compaction = kv.Value.AsBool()
			case "timebox.attempt":
				attempt = kv.Value.AsInt64()
			}
		}
		if compaction {
			if _, twice := spans[attempt]; twice {
				t.Errorf("compaction %d has two spans", attempt)
			}
			spans[attempt] = sp
		}
	}
	lost := spans[1]
	if turn == nil || lost == nil || spans[2] == nil || len(spans) != 2 {
		t.Fatalf("the turn's span %v, compaction spans %v; want the turn's, and one of each compaction", turn != nil, spans)
	}
	for attempt, sp := range spans {
		ids := fmt.Sprintf("00-%s-%s-01", sp.SpanContext().TraceID(), sp.SpanContext().SpanID())
		if named[int(attempt)] == "" || ids != named[int(attempt)] || sp.Parent().SpanID() != turn.SpanContext().SpanID() {
			t.Errorf("compaction %d's span is %s under %s; its compaction_started named %q, the turn's span is %s",
				attempt, ids, sp.Parent().SpanID(), named[int(attempt)], turn.SpanContext().SpanID())
		}
	}
	if lost.Status().Code != codes.Error {
		t.Errorf("the lost compaction's span has status %v; want an error", lost.Status())
	}
}

// TestACallEndingAfterItsTurnEndedTraced: as
// TestEngineLostWithAWorkerAliveTraced, but the call ends on its own
// after the runner's end, before its unit sees that end (here its
// store's watch of the turn's cancels never fires): its tool_finished is
// refused, the turn having ended, and the worker leaves its span unended
// then too, so the call has one span, the runner's.
func TestACallEndingAfterItsTurnEndedTraced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	file := hangAgent(t, "turn: 1m", "20s")
	// The call runs 12s: past the runner's end, some 5s after its start.
	b, _ := os.ReadFile(file)
	os.WriteFile(file, []byte(strings.Replace(string(b), `exec: [sleep, "30"]`, `exec: [sleep, "12"]`, 1)), 0o644)
	_, started, spans := engineLostMidCall(t, file, 2*time.Second, func(ps *postgres.Store) store.Store { return blindStore{ps} })
	// The call ends on its own; its unit with it, and the workflow.
	if got, want := spans(), started.Traceparent+" interrupted"; len(got) != 1 || got[0] != want {
		t.Errorf("the call's spans: %q; want one, %q", got, want)
	}
}

// turnSpanEnded waits for rec to have seen a turn's span end: the worker
// whose unit stores the turn's end ends its span once that is stored,
// and the runner's Run may return before.
func turnSpanEnded(t *testing.T, rec *tracetest.SpanRecorder) {
	t.Helper()
	wait.For(t, 10*time.Second, "the turn's span to end", func() bool {
		for _, sp := range rec.Ended() {
			if strings.HasPrefix(sp.Name(), "invoke_agent ") {
				return true
			}
		}
		return false
	})
}

// blindStore is a worker's store whose watch of a turn's cancel requests
// never fires: its units learn of nothing the store is told meanwhile.
type blindStore struct{ *postgres.Store }

func (blindStore) WatchCancel(string) (<-chan struct{}, func()) { return nil, func() {} }
