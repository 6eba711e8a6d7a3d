package agent

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/internal/spanid"
)

// Spans follow OpenTelemetry's GenAI conventions (docs/observability.md):
// invoke_agent for the turn, chat for each model attempt, execute_tool for
// each tool call, children of the turn's span; and they carry the budget
// each ran under (timebox.*). The turn's span is the engine's (Run here,
// the Temporal runner there); the others are made by whichever process
// runs the call, as a child of the state's TraceParent, from the turn's
// own events, so both engines trace alike.

// instrumentation names the tracer.
const instrumentation = "github.com/timebox-run/timebox"

// Attribute keys of timebox's own.
const (
	attrBudgetMS     = attribute.Key("timebox.budget.ms")
	attrBudgetSource = attribute.Key("timebox.budget.source")
	attrBudgetKnob   = attribute.Key("timebox.budget.knob")
	attrEnforcement  = attribute.Key("timebox.enforcement")
	attrOutcome      = attribute.Key("timebox.outcome")
	attrPhase        = attribute.Key("timebox.phase")
	attrOverran      = attribute.Key("timebox.overran")
	attrAbandoned    = attribute.Key("timebox.abandoned")
	attrTurnID       = attribute.Key("timebox.turn.id")
	attrStopReason   = attribute.Key("timebox.stop_reason")
	attrStep         = attribute.Key("timebox.step")
	attrAttempt      = attribute.Key("timebox.attempt")
	attrCompaction   = attribute.Key("timebox.compaction")
	attrDecision     = attribute.Key("timebox.approval.decision")
	attrDecidedBy    = attribute.Key("timebox.approval.by")
	attrRound        = attribute.Key("timebox.approval.round")
	attrStale        = attribute.Key("timebox.approval.stale")
	attrErrorType    = attribute.Key("error.type")
)

// TraceParent returns the W3C traceparent of the span in ctx
// (00-<trace id>-<span id>-<flags>), "" when there is none. (The core
// writes and reads traceparent itself: OpenTelemetry's propagation
// package would bring net/http into it.)
func TraceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return fmt.Sprintf("00-%s-%s-%02x", sc.TraceID(), sc.SpanID(), byte(sc.TraceFlags()))
}

// WithTraceParent returns ctx with the remote span context a W3C
// traceparent names (a traceparent header, a TRACEPARENT variable), so
// that a turn run under it is that span's child; ctx itself when tp is
// empty or not a traceparent.
func WithTraceParent(ctx context.Context, tp string) context.Context { return withTraceParent(ctx, tp) }

func withTraceParent(ctx context.Context, tp string) context.Context {
	sc, ok := parseTraceParent(tp)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// parseTraceParent reads a W3C traceparent: version 00 (or a later one,
// whose first four fields are read the same), a non-zero trace id and
// span id in lower-case hex, and the flags.
func parseTraceParent(tp string) (trace.SpanContext, bool) {
	parts := strings.Split(strings.TrimSpace(tp), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || parts[0] == "ff" || (parts[0] == "00" && len(parts) != 4) ||
		len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return trace.SpanContext{}, false
	}
	for _, p := range parts[:4] {
		if strings.ToLower(p) != p {
			return trace.SpanContext{}, false
		}
	}
	tid, err1 := trace.TraceIDFromHex(parts[1])
	sid, err2 := trace.SpanIDFromHex(parts[2])
	flags, err3 := hex.DecodeString(parts[3])
	if err1 != nil || err2 != nil || err3 != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
	return sc, sc.IsValid()
}

func budgetAttrs(d budget.Duration) []attribute.KeyValue {
	return budgetKVs(d.MS(), d.Source, d.Knob)
}

func budgetKVs(ms int64, src budget.Source, knob string) []attribute.KeyValue {
	return []attribute.KeyValue{attrBudgetMS.Int64(ms), attrBudgetSource.String(string(src)), attrBudgetKnob.String(knob)}
}

// traceTurn starts the turn's invoke_agent span, a child of the span in ctx
// (or of the traceparent a server was sent, which its caller put there),
// records its traceparent, and its caller's, in s and returns the
// function that ends it with the turn's record, and the one that forgets
// it unended, for a turn whose end, and span, another process made
// (TraceTurn). Without a tracer they do nothing.
func (a *Agent) traceTurn(ctx context.Context, s *machine.State) (end func(*Result), leave func()) {
	if a.tracer == nil {
		return func(*Result) {}, func() {}
	}
	_, span := a.tracer.Start(ctx, "invoke_agent "+a.name, trace.WithTimestamp(s.Start),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(turnAttrs(a.name, s.TurnID, s.SessionID, budgetAttrs(s.Budgets.Turn))...))
	s.TraceCaller = TraceParent(ctx)
	s.TraceParent = TraceParent(trace.ContextWithSpan(ctx, span))
	if !span.IsRecording() {
		// Never exported, so never made again: TraceEnded has nothing
		// to leave to it.
		return func(res *Result) { endTurnSpan(span, res.Record) }, func() {}
	}
	id := span.SpanContext().SpanID()
	live.Store(id, true)
	return func(res *Result) {
			defer live.Delete(id)
			endTurnSpan(span, res.Record)
		}, func() {
			// Left unended, the span is never exported.
			live.Delete(id)
		}
}

// live are the ids of the turn spans this process has begun and not yet
// ended: TraceEnded leaves their turns to them.
var live sync.Map

// turnAttrs are the attributes of a turn's span as it begins.
func turnAttrs(agent, turnID, sessionID string, turnBudget []attribute.KeyValue) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "invoke_agent"),
		attribute.String("gen_ai.agent.name", agent),
		attrTurnID.String(turnID),
		attrEnforcement.String(string(budget.Hard)),
	}
	if sessionID != "" {
		attrs = append(attrs, attribute.String("gen_ai.conversation.id", sessionID))
	}
	return append(attrs, turnBudget...)
}

// endTurnSpan ends a turn's span as its record says the turn ended.
func endTurnSpan(span trace.Span, rec *event.Turn) {
	span.SetAttributes(attrOutcome.String(string(rec.Status)), attrStopReason.String(string(rec.StopReason)))
	if rec.Status != budget.StatusCompleted {
		span.SetAttributes(attrErrorType.String(string(rec.StopReason)))
		span.SetStatus(codes.Error, rec.Message)
	}
	endAt := rec.EndedAt
	if endAt.IsZero() {
		endAt = time.Now()
	}
	span.End(trace.WithTimestamp(endAt))
}

// TraceEnded makes the invoke_agent span of a turn that a process other
// than its own ended — its process died, and a store marked it
// interrupted — with the ids it was begun with (started's Traceparent),
// so that the spans of its calls, already exported under it, have their
// parent. Nothing is made for a turn begun untraced or unsampled, for one
// whose span this process has open (its own end makes it), or when tp's
// IDGenerator does not give the ids asked for (telemetry.IDs does). rec
// is the turn's final record: the span runs from its start to its end.
//
// calls are the calls that were running when the process died, which the
// end records interrupted: their execute_tool spans died with it too, and
// are made with the ids their tool_started carries, beside the turn's.
// attempt, when not nil, is the model attempt that was under way: its chat
// span is made the same way, with the ids its llm_started carries (those
// its model server was sent), ended when it is known to have run until.
func TraceEnded(tp trace.TracerProvider, turnID string, started *event.TurnStarted, rec *event.Turn, attempt *event.LostAttempt, calls ...event.LostCall) {
	if tp == nil || started == nil || rec == nil {
		return
	}
	l := lostSpan{traceparent: started.Traceparent, caller: started.CallerTraceparent,
		agent: started.Agent, turnID: turnID, sessionID: started.SessionID}
	if v, ok := started.Budgets["timeouts.turn"]; ok {
		l.budget = budgetKVs(v.MS, v.Source, v.Knob)
	}
	tracer := tp.Tracer(instrumentation)
	if l.make(tracer, rec, true) {
		// The budgets the spans began with (beginChat, beginCompaction).
		traceLost(tracer, l.traceparent, rec, func(key string) []attribute.KeyValue {
			if v, ok := started.Budgets[key]; ok {
				return budgetKVs(v.MS, v.Source, v.Knob)
			}
			return nil
		}, attempt, calls)
	}
}

// traceLost makes the spans of what was running when a turn was ended
// from outside the processes running its calls — calls, the model attempt
// under way — under the turn's span (turn is its traceparent), as rec,
// the turn's final record, says it ended; budgetOf gives the attributes
// of the budget of a key (timeouts.llm_first_chunk, timeouts.compaction).
// TraceEnded and TraceLost both make them here.
func traceLost(tracer trace.Tracer, turn string, rec *event.Turn, budgetOf func(key string) []attribute.KeyValue,
	attempt *event.LostAttempt, calls []event.LostCall) {
	traceLostCalls(tracer, turn, calls, rec.EndedAt)
	if attempt != nil {
		traceLostAttempt(tracer, turn, attempt, budgetOf, rec.Message)
	}
}

// traceLostAttempt makes the chat span of a model attempt under way when
// its turn's process died, a child of the turn's span (turn is its
// traceparent), with the ids its llm_started carries (a compaction's, its
// compaction_started), the attributes its live span began with (budgetOf
// gives its budget's), outcome and error.type
// interrupted and msg (the turn's message, which says what was answering)
// as its error status. It ends at a.Until, the turn's last stored event:
// that is as long as the attempt is known to have run, and as long as the
// turn's llm_ms counts it; the turn's end may be later (an end said at
// the store's clock), and a model call's span ends when the call did, not
// the turn. An attempt begun untraced or unsampled has none; when the
// tracer does not give the ids asked for, the span begun is left
// unended, never exported (as traceLostCalls').
func traceLostAttempt(tracer trace.Tracer, turn string, a *event.LostAttempt, budgetOf func(key string) []attribute.KeyValue, msg string) {
	var tp string
	var begin func(parent context.Context) trace.Span
	switch d, c := a.Started, a.Compaction; {
	case d != nil:
		tp = d.Traceparent
		begin = func(parent context.Context) trace.Span {
			return chatSpan(tracer, parent, d.Step, d.Attempt, d.Model, d.Provider, a.At, budgetOf(budget.KeyLLMFirstChunk))
		}
	case c != nil:
		tp = c.Traceparent
		begin = func(parent context.Context) trace.Span {
			return compactionSpan(tracer, parent, c.Step, max(c.Attempt, 1), c.Model, c.Provider, a.At, budgetOf(budget.KeyCompaction))
		}
	default:
		return
	}
	own, ok := parseTraceParent(tp)
	if !ok || !own.IsSampled() {
		return
	}
	span := begin(spanid.With(withTraceParent(context.Background(), turn), own.TraceID(), own.SpanID()))
	if sc := span.SpanContext(); sc.TraceID() != own.TraceID() || sc.SpanID() != own.SpanID() {
		return
	}
	end := a.Until
	if end.Before(a.At) {
		end = a.At
	}
	endSpan(span, end, event.OutcomeInterrupted, msg, []attribute.KeyValue{attrOutcome.String(string(event.OutcomeInterrupted))})
}

// TraceLost makes the spans of what was running when a turn's Temporal
// runner ended the turn itself (its ceiling or step window with no worker
// left, a cancel no worker took, engine_lost): the execute_tool spans of
// calls, which the end recorded interrupted, and the chat span of attempt,
// the model attempt under way (nil when none was), as the store's end
// returned them (store.Ending). Their spans died with the workers that ran
// them, or were left unended by workers Temporal gave them up on; they are
// made as TraceEnded makes them, with the ids their tool_started and
// llm_started carry, under the turn's span (s.TraceParent). rec is the
// turn's final record: the calls' spans end at its end, the attempt's at
// the turn's last stored event before it (LostAttempt.Until). The turn's
// own span is the runner's (TraceTurn).
func TraceLost(a *Agent, s *machine.State, rec *event.Turn, attempt *event.LostAttempt, calls ...event.LostCall) {
	if a.tracer == nil || rec == nil {
		return
	}
	traceLost(a.tracer, s.TraceParent, rec, func(key string) []attribute.KeyValue {
		if key == budget.KeyCompaction {
			return budgetAttrs(s.Budgets.Compaction)
		}
		return budgetAttrs(s.Budgets.LLMFirstChunk)
	}, attempt, calls)
}

// traceLostCalls makes the execute_tool span of each of calls, a child of
// the turn's span (turn is its traceparent), with the ids its tool_started
// carries, the
// attributes its live span had and its record's outcome, ended at end
// (the turn's). A call begun untraced or unsampled has none; when the
// tracer does not give the ids asked for, the span begun is left
// unended, never exported, rather than one that names no call's children.
func traceLostCalls(tracer trace.Tracer, turn string, calls []event.LostCall, end time.Time) {
	parent := withTraceParent(context.Background(), turn)
	for _, c := range calls {
		own, ok := parseTraceParent(c.Started.Traceparent)
		if !ok || !own.IsSampled() {
			continue
		}
		d := c.Started
		attrs := toolAttrs(d.Step, d.CallID, d.Tool, d.Kind, d.Enforcement)
		if d.Source != "" || d.Knob != "" {
			attrs = append(attrs, budgetKVs(d.TimeoutMS, d.Source, d.Knob)...)
		}
		_, span := tracer.Start(spanid.With(parent, own.TraceID(), own.SpanID()), "execute_tool "+d.Tool,
			trace.WithTimestamp(c.Record.StartedAt), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		if sc := span.SpanContext(); sc.TraceID() != own.TraceID() || sc.SpanID() != own.SpanID() {
			continue
		}
		rec := c.Record
		at := end
		if at.Before(rec.EndedAt) {
			at = rec.EndedAt
		}
		endSpan(span, at, rec.Outcome, rec.Result, []attribute.KeyValue{attrOutcome.String(string(rec.Outcome)),
			attrOverran.Bool(rec.Overran), attrAbandoned.Bool(rec.Abandoned)})
	}
}

// lostSpan is a turn's span to make again: its ids and what its start
// said.
type lostSpan struct {
	traceparent, caller      string
	agent, turnID, sessionID string
	budget                   []attribute.KeyValue
}

// make makes the span with tracer, ended as rec says the turn ended;
// unlessLive, not when this process has it open. It reports whether it
// made it.
func (l lostSpan) make(tracer trace.Tracer, rec *event.Turn, unlessLive bool) bool {
	end := l.begin(tracer, rec.StartedAt, unlessLive)
	if end != nil {
		end(rec)
	}
	return end != nil
}

// begin begins the span with tracer at start and returns the function
// that ends it with the turn's final record; nil when it is not to be
// made: the turn untraced or unsampled, its span open in this process
// (unlessLive), or the ids not given (the span begun is then left
// unended, and never exported).
func (l lostSpan) begin(tracer trace.Tracer, start time.Time, unlessLive bool) func(*event.Turn) {
	own, ok := parseTraceParent(l.traceparent)
	if !ok || !own.IsSampled() {
		return nil
	}
	if _, open := live.Load(own.SpanID()); open && unlessLive {
		return nil
	}
	ctx := spanid.With(context.Background(), own.TraceID(), own.SpanID())
	if caller, ok := parseTraceParent(l.caller); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, caller)
	}
	_, span := tracer.Start(ctx, "invoke_agent "+l.agent, trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(turnAttrs(l.agent, l.turnID, l.sessionID, l.budget)...))
	if sc := span.SpanContext(); sc.TraceID() != own.TraceID() || sc.SpanID() != own.SpanID() {
		return nil
	}
	return func(rec *event.Turn) { endTurnSpan(span, rec) }
}

// turnSpan begins the span of the turn of s, begun by its runner, for
// the process that will write its end, and returns the function that ends
// it with the turn's final record; nil when this process cannot make it
// (Units.TurnSpan).
func (a *Agent) turnSpan(s *machine.State) func(*event.Turn) {
	if a.tracer == nil {
		return nil
	}
	return lostSpan{traceparent: s.TraceParent, caller: s.TraceCaller, agent: a.name, turnID: s.TurnID,
		sessionID: s.SessionID, budget: budgetAttrs(s.Budgets.Turn)}.begin(a.tracer, s.Start, false)
}

// TraceTurn is traceTurn for an engine that runs the turn elsewhere
// (package temporal): it starts the turn's span and returns the function
// that ends it with the turn's result, for an end the engine's runner
// wrote, and the one that leaves it unended, for an end a unit wrote,
// which made the span (machine.Units.TraceEnded).
func TraceTurn(a *Agent, ctx context.Context, s *machine.State) (end func(*Result), leave func()) {
	return a.traceTurn(ctx, s)
}

// spans makes the chat and execute_tool spans of the calls a unit runs, as
// the turn's events tell of them. Each call's span is begun before its
// start is told (beginChat, beginTool), so that the start names its ids,
// and the call is given its traceparent (a model request's header, a
// tool's TRACEPARENT or _meta); it is one of the turn's sinks, which the
// rest of the call's events annotate and end.
type spans struct {
	t      *turn
	tracer trace.Tracer
	parent context.Context

	mu         sync.Mutex
	chat       trace.Span
	compaction trace.Span // the compaction's, begun before its start (beginCompaction)
	calls      map[string]trace.Span
	failover   *event.Failover // told on the next attempt's span
}

func newSpans(t *turn, tracer trace.Tracer) *spans {
	return &spans{t: t, tracer: tracer, parent: withTraceParent(context.Background(), t.s.TraceParent),
		calls: map[string]trace.Span{}}
}

// traceparent returns the traceparent of the tool call's span, or of the
// model attempt's for callID "": what the call passes on.
func (sp *spans) traceparent(callID string) string {
	if sp == nil {
		return ""
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	s := sp.chat
	if callID != "" {
		s = sp.calls[callID]
	}
	if s == nil {
		return ""
	}
	return TraceParent(trace.ContextWithSpan(context.Background(), s))
}

// compactionParent returns the traceparent of the compaction's span,
// what its model request passes on; "" when there is none.
func (sp *spans) compactionParent() string {
	if sp == nil {
		return ""
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.compaction == nil {
		return ""
	}
	return TraceParent(trace.ContextWithSpan(context.Background(), sp.compaction))
}

// beginTool begins the execute_tool span of a call about to start at
// start and returns its traceparent, for the call's tool_started: "" when
// the turn is not traced or the span not sampled (nothing to make again).
func (sp *spans) beginTool(step int, callID, tool, kind string, enf budget.Enforcement, start time.Time) string {
	if sp == nil {
		return ""
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	s := sp.startTool(sp.parent, step, callID, tool, kind, enf, start)
	sp.calls[callID] = s
	return sampled(s)
}

// beginChat begins the chat span of a model attempt about to start at
// start and returns its traceparent, for the attempt's llm_started: ""
// when the turn is not traced or the span not sampled. (The model server
// is sent it as its traceparent header: what it exports under it keeps
// its parent when this process dies mid-attempt, adoptChat.)
func (sp *spans) beginChat(step, attempt int, model, provider string, start time.Time) string {
	if sp == nil {
		return ""
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.chat = sp.startChat(sp.parent, step, attempt, model, provider, start, sp.t.s.Budgets.LLMFirstChunk)
	if f := sp.failover; f != nil {
		sp.failover = nil
		sp.chat.AddEvent("failover", trace.WithTimestamp(start), trace.WithAttributes(
			attribute.String("timebox.failover.from", f.From), attribute.String("timebox.failover.to", f.To),
			attrPhase.String(string(f.Phase)), attribute.String("timebox.failover.reason", f.Reason)))
	}
	return sampled(sp.chat)
}

// beginCompaction begins the chat span of a compaction about to start at
// start, and returns its traceparent, for its compaction_started: "" when
// the turn is not traced or the span not sampled (as beginChat's).
func (sp *spans) beginCompaction(step, attempt int, model, provider string, start time.Time) string {
	if sp == nil {
		return ""
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.compaction = sp.startCompaction(sp.parent, step, attempt, model, provider, start)
	return sampled(sp.compaction)
}

// sampled returns the traceparent of s, "" when it is not sampled (it is
// never exported, so never made again).
func sampled(s trace.Span) string {
	if !s.SpanContext().IsSampled() {
		return ""
	}
	return TraceParent(trace.ContextWithSpan(context.Background(), s))
}

// adoptTool begins, at start, the execute_tool span of a call whose span
// another process began, with the ids traceparent names (a call lost
// with its worker, whose span died with it), for its end to end. Nothing
// when the turn is not traced, traceparent names no sampled span, or the
// tracer does not give the ids (adopt): the call's end makes one with ids
// of its own, as before.
func (sp *spans) adoptTool(traceparent string, step int, callID, tool, kind string, enf budget.Enforcement, start time.Time) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if s := sp.adopt(traceparent, func(parent context.Context) trace.Span {
		return sp.startTool(parent, step, callID, tool, kind, enf, start)
	}); s != nil {
		sp.calls[callID] = s
	}
}

// adoptChat is adoptTool for a model attempt lost with its worker: its
// chat span takes the ids its llm_started named, those the model server
// was sent, for the record of the loss to end.
func (sp *spans) adoptChat(traceparent string, step, attempt int, model, provider string, start time.Time) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if s := sp.adopt(traceparent, func(parent context.Context) trace.Span {
		return sp.startChat(parent, step, attempt, model, provider, start, sp.t.s.Budgets.LLMFirstChunk)
	}); s != nil {
		sp.chat = s
	}
}

// adoptCompaction is adoptChat for a compaction lost with its worker: its
// span takes the ids its compaction_started named, for the record of the
// loss (compaction_finished) to end.
func (sp *spans) adoptCompaction(traceparent string, step, attempt int, model, provider string, start time.Time) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if s := sp.adopt(traceparent, func(parent context.Context) trace.Span {
		return sp.startCompaction(parent, step, attempt, model, provider, start)
	}); s != nil {
		sp.compaction = s
	}
}

// adopt begins, with begin, a span under the turn's with the ids
// traceparent names; nil when it names no sampled span, or when the
// tracer does not give those ids (telemetry.IDs does): the span begun is
// then left unended, never exported, rather than one that names no
// call's children. sp.mu is held.
func (sp *spans) adopt(traceparent string, begin func(parent context.Context) trace.Span) trace.Span {
	own, ok := parseTraceParent(traceparent)
	if !ok || !own.IsSampled() {
		return nil
	}
	s := begin(spanid.With(sp.parent, own.TraceID(), own.SpanID()))
	if sc := s.SpanContext(); sc.TraceID() != own.TraceID() || sc.SpanID() != own.SpanID() {
		return nil
	}
	return s
}

// Emit starts, annotates and ends spans as the turn's events say.
func (sp *spans) Emit(e event.Event) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	b := &sp.t.s.Budgets
	switch d := e.Data.(type) {
	case *event.LLMFinished:
		rec := d.ModelCall
		if sp.disowned() {
			sp.chat = nil // as if its process had died: another records it lost
			return
		}
		if sp.chat == nil && rec.Phase == budget.PhaseWorkerLost {
			// An attempt lost with its worker: the span that worker
			// began died with it, unexported. This one, from the record
			// of the loss, says so; with ids of its own when adoptChat
			// could not give it that span's.
			sp.chat = sp.startChat(sp.parent, rec.Step, rec.Attempt, rec.Model, rec.Provider, rec.StartedAt, b.LLMFirstChunk)
		}
		if sp.chat == nil {
			return
		}
		attrs := []attribute.KeyValue{attrOutcome.String(string(rec.Outcome))}
		if rec.InputTokens > 0 || rec.OutputTokens > 0 {
			attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", rec.InputTokens),
				attribute.Int64("gen_ai.usage.output_tokens", rec.OutputTokens))
		}
		if rec.Phase != "" {
			attrs = append(attrs, attrPhase.String(string(rec.Phase)))
			if fired, ok := phaseBudget(b, rec.Phase); ok {
				attrs = append(attrs, budgetAttrs(fired)...)
			}
		}
		end := e.At
		if rec.Phase == budget.PhaseWorkerLost {
			end = rec.StartedAt.Add(time.Duration(rec.StreamMS) * time.Millisecond) // as long as it is known to have run
		}
		endSpan(sp.chat, end, rec.Outcome, rec.Error, attrs)
		sp.chat = nil
	case *event.CompactionFinished:
		// A compaction is a model call the turn waits for: its span,
		// begun before its start (beginCompaction, or adoptCompaction for
		// one lost with its worker), fills what would be a gap in the
		// trace; one begun elsewhere is made from its record.
		s := sp.compaction
		sp.compaction = nil
		if d.Record == nil {
			return
		}
		if sp.disowned() {
			return // as if its process had died: another records it lost
		}
		rec := *d.Record
		if s == nil {
			s = sp.startCompaction(sp.parent, rec.Step, rec.Attempt, rec.Model, rec.Provider, rec.StartedAt)
		}
		attrs := []attribute.KeyValue{attrOutcome.String(string(rec.Outcome))}
		if rec.Phase != "" {
			attrs = append(attrs, attrPhase.String(string(rec.Phase)))
		}
		endSpan(s, rec.StartedAt.Add(time.Duration(rec.StreamMS)*time.Millisecond), rec.Outcome, rec.Error, attrs)
	case *event.Failover:
		sp.failover = d
	case *event.ApprovalDecided:
		// A call's wait for a person: its own span, beside the tool's
		// (docs/decisions/approval-spans.md), made whole from the
		// decision, which says how long the call waited — on Temporal
		// the request and the decision are units of different workers.
		if sp.disowned() {
			return
		}
		outcome := event.OutcomeOK
		switch d.Decision {
		case event.Deny:
			outcome = event.OutcomeDenied
		case event.Expired:
			outcome = event.OutcomeApprovalExpired
		}
		attrs := []attribute.KeyValue{attrDecision.String(string(d.Decision))}
		if d.By != "" {
			attrs = append(attrs, attrDecidedBy.String(d.By))
		}
		if d.Round > 1 {
			attrs = append(attrs, attrRound.Int(d.Round))
		}
		if d.Stale {
			attrs = append(attrs, attrStale.Bool(true))
		}
		sp.approvalSpan(d.CallID, d.Tool, e.At.Add(-time.Duration(d.WaitedMS)*time.Millisecond), e.At, outcome, d.Reason, attrs)
	case *event.ToolStarted:
		if sp.calls[d.CallID] == nil { // not begun ahead of its start (beginTool)
			sp.calls[d.CallID] = sp.startTool(sp.parent, d.Step, d.CallID, d.Tool, d.Kind, d.Enforcement, e.At)
		}
	case *event.ToolProgress:
		if s := sp.calls[d.CallID]; s != nil {
			attrs := []attribute.KeyValue{attribute.String("timebox.progress.message", d.Message)}
			if d.Progress != nil {
				attrs = append(attrs, attribute.Float64("timebox.progress", *d.Progress))
			}
			if d.Total != nil {
				attrs = append(attrs, attribute.Float64("timebox.progress.total", *d.Total))
			}
			s.AddEvent("progress", trace.WithTimestamp(e.At), trace.WithAttributes(attrs...))
		}
	case *event.StillWorking:
		for _, c := range d.Calls {
			s := sp.chat
			if s == nil {
				s = sp.compaction
			}
			if c.CallID != "" {
				s = sp.calls[c.CallID]
			}
			if s != nil {
				s.AddEvent("still_working", trace.WithTimestamp(e.At), trace.WithAttributes(
					attribute.String("timebox.subject", c.Subject), attribute.Int64("timebox.elapsed_ms", c.ElapsedMS)))
			}
		}
	case *event.ToolFinished:
		rec := d.ToolCall
		if sp.disowned() {
			delete(sp.calls, d.CallID) // as if its process had died: another records it lost
			return
		}
		if rec.Refused == machine.RefusedCancelled && rec.Approval != nil && rec.Approval.Decision == "" {
			// The turn was stopped while the call waited for a person:
			// no decision ends the wait; its record does.
			start := rec.StartedAt.Add(-time.Duration(rec.ApprovalMS) * time.Millisecond)
			sp.approvalSpan(rec.CallID, rec.Tool, start, rec.StartedAt, event.OutcomeCancelled, rec.Result, nil)
			return
		}
		s := sp.calls[d.CallID]
		if s == nil && rec.Phase == budget.PhaseWorkerLost {
			// A call lost with its worker, recorded by another: the span
			// its worker began died with it, unexported. This one, from
			// the record, runs as long as the call is known to have run
			// (to its last heartbeat) and says it was lost.
			s = sp.startTool(sp.parent, rec.Step, rec.CallID, rec.Tool, rec.Kind, rec.Enforcement, rec.StartedAt)
		}
		if s == nil {
			return
		}
		delete(sp.calls, d.CallID)
		attrs := []attribute.KeyValue{attrOutcome.String(string(rec.Outcome)),
			attrOverran.Bool(rec.Overran), attrAbandoned.Bool(rec.Abandoned)}
		if rec.Phase != "" {
			attrs = append(attrs, attrPhase.String(string(rec.Phase)))
			if fired, ok := sp.toolPhaseBudget(d.Tool, rec.Phase); ok {
				attrs = append(attrs, budgetAttrs(fired)...)
			}
		}
		if rec.ExitCode != nil {
			attrs = append(attrs, attribute.Int("process.exit.code", *rec.ExitCode))
		}
		endSpan(s, rec.EndedAt, rec.Outcome, rec.Result, attrs)
	}
}

// disowned reports whether the engine gave the unit up
// (event.Disowner): what it says of its calls' ends is not the turn's, and
// their spans are left unended, unexported, as a dead worker's are.
func (sp *spans) disowned() bool {
	for _, s := range sp.t.sinks {
		if d, ok := s.(event.Disowner); ok && d.Disowned() {
			return true
		}
	}
	return false
}

// startChat starts a model attempt's chat span at start, under budget b,
// in parent (the turn's span, or one that asks for the span's ids).
func (sp *spans) startChat(parent context.Context, step, attempt int, model, provider string, start time.Time, b budget.Duration) trace.Span {
	return chatSpan(sp.tracer, parent, step, attempt, model, provider, start, budgetAttrs(b))
}

// chatSpan starts with tracer a model attempt's chat span at start, in
// parent, with the attributes every chat span begins with, b its budget's
// (startChat; TraceEnded, for an attempt under way when its process died).
func chatSpan(tracer trace.Tracer, parent context.Context, step, attempt int, model, provider string, start time.Time, b []attribute.KeyValue) trace.Span {
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", provider),
		attribute.String("gen_ai.request.model", model),
		attrStep.Int(step), attrAttempt.Int(attempt),
		attrEnforcement.String(string(budget.Hard)),
	}
	attrs = append(attrs, b...)
	_, s := tracer.Start(parent, "chat "+model, trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return s
}

// startCompaction starts a compaction's chat span at start, in parent:
// an attempt's, under timeouts.compaction, marked timebox.compaction.
func (sp *spans) startCompaction(parent context.Context, step, attempt int, model, provider string, start time.Time) trace.Span {
	return compactionSpan(sp.tracer, parent, step, attempt, model, provider, start, budgetAttrs(sp.t.s.Budgets.Compaction))
}

// compactionSpan is chatSpan for a compaction (b the attributes of
// timeouts.compaction).
func compactionSpan(tracer trace.Tracer, parent context.Context, step, attempt int, model, provider string, start time.Time, b []attribute.KeyValue) trace.Span {
	return chatSpan(tracer, parent, step, attempt, model, provider, start, append(b, attrCompaction.Bool(true)))
}

// startTool starts a tool call's execute_tool span at start, in parent
// (as startChat's).
func (sp *spans) startTool(parent context.Context, step int, callID, tool, kind string, enf budget.Enforcement, start time.Time) trace.Span {
	attrs := toolAttrs(step, callID, tool, kind, enf)
	if e, ok := sp.t.a.tools[tool]; ok {
		attrs = append(attrs, budgetAttrs(turnToolBudget(e, &sp.t.s.Budgets).Timeout)...)
	}
	_, s := sp.tracer.Start(parent, "execute_tool "+tool, trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return s
}

// toolAttrs are the attributes of a call's execute_tool span as it
// begins, but its budget.
func toolAttrs(step int, callID, tool, kind string, enf budget.Enforcement) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "execute_tool"),
		attribute.String("gen_ai.tool.name", tool),
		attribute.String("gen_ai.tool.call.id", callID),
		attribute.String("gen_ai.tool.type", toolType(kind)),
		attrStep.Int(step), attrEnforcement.String(string(enf)),
	}
}

// approvalSpan makes the await_approval span of a call's wait for a
// person, from start to end, a sibling of its execute_tool span: the
// wait is not the tool's time, and its budget is the approval timeout.
func (sp *spans) approvalSpan(callID, tool string, start, end time.Time, outcome event.Outcome, msg string, attrs []attribute.KeyValue) {
	head := []attribute.KeyValue{
		attribute.String("gen_ai.tool.name", tool),
		attribute.String("gen_ai.tool.call.id", callID),
		attrEnforcement.String(string(budget.Hard)),
	}
	var step int
	if _, err := fmt.Sscanf(callID, "call_%d_", &step); err == nil { // machine.CallID
		head = append(head, attrStep.Int(step))
	}
	if e, ok := sp.t.a.tools[tool]; ok {
		head = append(head, budgetAttrs(sp.t.approvalBudget(e))...)
	}
	_, s := sp.tracer.Start(sp.parent, "await_approval "+tool, trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(head...))
	attrs = append(attrs, attrOutcome.String(string(outcome)))
	if outcome == event.OutcomeApprovalExpired {
		attrs = append(attrs, attrPhase.String(string(budget.PhaseApproval)))
	}
	endSpan(s, end, outcome, msg, attrs)
}

// endSpan ends a call's span at end with its outcome: error.type and an
// error status for every outcome but ok.
func endSpan(s trace.Span, end time.Time, outcome event.Outcome, msg string, attrs []attribute.KeyValue) {
	s.SetAttributes(attrs...)
	if outcome != event.OutcomeOK {
		s.SetAttributes(attrErrorType.String(string(outcome)))
		if len(msg) > 500 {
			msg = msg[:500]
		}
		s.SetStatus(codes.Error, msg)
	}
	if end.IsZero() {
		end = time.Now()
	}
	s.End(trace.WithTimestamp(end))
}

// toolType is the GenAI convention's gen_ai.tool.type of a tool kind: a
// tool run here is a function; an MCP server's, an extension.
func toolType(kind string) string {
	if kind == "mcp" {
		return "extension"
	}
	return "function"
}

// toolPhaseBudget returns the budget of the phase that ended a call of
// tool, when it is not the tool's timeout the span started with: its
// idle timeout, the step's or the turn's. (The span then names the budget
// that fired, as a model call's does.)
func (sp *spans) toolPhaseBudget(tool string, p budget.Phase) (budget.Duration, bool) {
	b := &sp.t.s.Budgets
	switch p {
	case budget.PhaseToolIdle:
		if e, ok := sp.t.a.tools[tool]; ok {
			return turnToolBudget(e, b).IdleTimeout, true
		}
	case budget.PhaseStep:
		return b.Step, true
	case budget.PhaseTurn:
		return b.Turn, true
	}
	return budget.Duration{}, false
}

// phaseBudget returns the budget of the phase that ended a model call.
func phaseBudget(b *budget.Budgets, p budget.Phase) (budget.Duration, bool) {
	switch p {
	case budget.PhaseLLMFirstChunk:
		return b.LLMFirstChunk, true
	case budget.PhaseLLMIdle:
		return b.LLMIdle, true
	case budget.PhaseLLMBudget:
		return b.LLMBudget, true
	case budget.PhaseStep:
		return b.Step, true
	case budget.PhaseTurn:
		return b.Turn, true
	}
	return budget.Duration{}, false
}
