package store

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// Interrupted is what a store knows of a running turn whose process can no
// longer end it (it crashed, was killed, or its store was closed).
type Interrupted struct {
	// TurnID, SessionID, Agent, Input and StartedAt are the turn's, as
	// BeginTurn stored them (TurnStart).
	TurnID, SessionID, Agent, Input string
	StartedAt                       time.Time
	// Events are the turn's stored events in seq order.
	Events []event.Event
	// ToolCalls is how many tool call records the turn has stored; Steps
	// the largest step of its model call records.
	ToolCalls, Steps int
	// End says how it ends.
	End
	// Now is when the turn is marked interrupted.
	Now time.Time
}

// End is how a turn ends that is ended from outside its process
// (Interrupter, Interrupt).
type End struct {
	// Reason is the stop reason of the turn's end; empty is
	// budget.Interrupted.
	Reason budget.StopReason
	// Why says what happened, for the message: "the timebox process
	// running it (pid 4242) stopped".
	Why string
	// Said, when set, is said by one who knows that the turn ran until
	// now (a cancel no worker took: nothing of it ran since): the turn
	// ends now, at the store's clock, not at its last stored event, and
	// its message opens with Said(ran), ran being how long it ran, in
	// place of the "at least" of a crash, whose real end is unknown.
	// What was running and what is kept are said after it, as for any
	// interruption. Nil: the end is not known.
	Said func(ran time.Duration) string
	// Stop, when set, ends the turn stopped by a budget that the one
	// ending it enforces for a process that could not (the turn's ceiling,
	// which no worker of the engine was there to enforce): its status is
	// Reason's (stopped, not interrupted), its end is known (now, as with
	// Said), and Stop says its message, flags and limit, given the records
	// of the calls that were running (interrupted, as for any
	// interruption). What was running is said after its message.
	Stop func(running []event.ToolCall) Stopped
}

// Stopped is how a turn stopped by a budget from outside its process
// ends (End.Stop): its message, as its engine would have written it, its
// flags, and the budget that stopped it (turn_finished's limit).
type Stopped struct {
	// Message is the turn's closing message.
	Message string
	// Flags are the turn's timeout flags.
	Flags event.Flags
	// Limit is the budget that stopped the turn, with its key.
	Limit *event.BudgetValue
}

// Interruption is how an interrupted turn ends, for the store to write in
// one transaction: the records of the calls that were running, the events
// to append to its log, and its final record.
type Interruption struct {
	// Calls are the records of the tool calls that were running: outcome
	// interrupted, ended at the turn's last event.
	Calls []event.ToolCall
	// Events are a tool_finished for each of Calls, then turn_finished, so
	// that whoever follows the log sees every call and the turn end.
	Events []event.Event
	// Record is the turn's final record (without calls or events): status
	// and stop reason interrupted, a message saying what was running and
	// that the turn ran at least until its last stored event.
	Record event.Turn
	// Attempt is the model attempt that was under way (an llm_started
	// with no llm_finished), or the compaction (a compaction_started with
	// no compaction_finished), nil when none was: it gets no record (the
	// turn's message and llm_ms tell of an attempt), but its chat span is
	// made again (Ending.Attempt).
	Attempt *event.LostAttempt
}

// Ending is a turn a store ended from outside its process, once the end
// is committed: what the SQLite and PostgreSQL stores tell their
// Options.Ended of (a process that exports traces makes the turn's span,
// which died with the process that began it: agent.TraceEnded).
type Ending struct {
	// TurnID names the turn.
	TurnID string
	// Started is the turn's turn_started, nil when its log has none.
	Started *event.TurnStarted
	// Record is the turn's final record.
	Record event.Turn
	// Calls are the calls that were running, which the end records
	// interrupted: the spans of their process died with it too.
	Calls []event.LostCall
	// Attempt is the model attempt, or the compaction, that was under
	// way, nil when none was (Interruption.Attempt): its span died with
	// the process too.
	Attempt *event.LostAttempt
}

// Ending returns what is told of turn t ended as out says.
func (t Interrupted) Ending(out Interruption) Ending {
	e := Ending{TurnID: t.TurnID, Record: out.Record}
	e.Record.TurnID = t.TurnID
	for _, ev := range t.Events {
		if d, ok := ev.Data.(*event.TurnStarted); ok {
			e.Started = d
			break
		}
	}
	e.Calls = event.LostCalls(t.Events, out.Calls)
	e.Attempt = out.Attempt
	return e
}

// MaxQueued bounds the events a durable store (SQLite, PostgreSQL) keeps
// waiting for its database, beside 64 MiB of their JSON: past either, the
// turns that emit wait for room, so that an outage costs bounded memory.
// It was 8,192, and 10,000 turns stopped at once — two or three events
// and an end each — waited seconds for the disk to make room (issue 29;
// docs/decisions/turn-ends-in-groups.md).
const MaxQueued = 1 << 16

// PublishedAhead is how far ahead of what it stored a live process may
// have published a turn's events (a gateway publishes each event to its
// followers before the store commits it, and its store queues at most
// MaxQueued): the events of an interruption are numbered after that, so
// that their seqs are new to every client, whatever it was shown. A turn's
// seqs are strictly increasing, not contiguous.
const PublishedAhead = 2 * MaxQueued

// Interrupt works out how a turn ends that its process can no longer end
// (docs/decisions/crash-recovery.md). Every store marks interrupted turns
// through it, so that they read the same whichever store holds them.
func Interrupt(t Interrupted) Interruption {
	var (
		last     int64
		lastAt   = t.StartedAt
		running  = map[string]*runningCall{} // by call_id
		progress = map[string]int{}          // progress reports by call_id
		model    string                      // a model call under way
		modelAt  time.Time                   // when it started
		attempt  *event.LLMStarted           // its llm_started
		compact  *event.CompactionStarted    // a compaction under way
		compAt   time.Time                   // when it started
		text     strings.Builder             // the reply of the last model call
		llm      time.Duration               // the model calls' time, as timeouts.llm_budget counts it
		ran      []span                      // the finished tool calls' times
		fails    int                         // failovers
		ended    *event.TurnFinished         // the turn's own end, when its log has it
		endedAt  time.Time
	)
	for _, e := range t.Events {
		last, lastAt = e.Seq, e.At
		switch d := e.Data.(type) {
		case *event.LLMStarted:
			model, modelAt, attempt = d.Model, e.At, d
			text.Reset()
		case *event.LLMDelta:
			text.WriteString(d.Text)
		case *event.LLMFinished:
			model, attempt = "", nil
			if !d.Compaction {
				llm += time.Duration(d.StreamMS) * time.Millisecond
			}
		case *event.CompactionStarted:
			compact, compAt = d, e.At
		case *event.CompactionFinished:
			compact = nil
		case *event.Failover:
			fails++
		case *event.ToolStarted:
			running[d.CallID] = &runningCall{started: d, at: e.At}
		case *event.ToolProgress:
			progress[d.CallID]++
		case *event.ToolFinished:
			delete(running, d.CallID)
			if d.Refused == "" {
				ran = append(ran, span{d.StartedAt, d.EndedAt})
			}
		case *event.TurnFinished:
			ended, endedAt = d, e.At
		}
	}
	if ended != nil {
		// The turn ended, and its turn_finished was stored, but not its
		// record (its process stopped, or its store closed, before the
		// end's own write): the record is the end its log tells, and the
		// log gets no second turn_finished.
		return Interruption{Record: event.Turn{TurnID: t.TurnID, SessionID: t.SessionID, Agent: t.Agent, Input: t.Input,
			StartedAt: t.StartedAt, EndedAt: endedAt, Status: ended.Status, StopReason: ended.StopReason,
			Message: ended.Message, Answer: ended.Answer, Flags: ended.Flags, Steps: ended.Totals.Steps,
			LLMMS: ended.Totals.LLMMS, ToolMS: ended.Totals.ToolMS, WallMS: ended.Totals.WallMS,
			ApprovalMS: ended.Totals.ApprovalMS, Failovers: ended.Totals.Failovers}}
	}
	// The calls that were running get their record, and their log the
	// tool_finished the process never wrote, so that every tool_started
	// has its end: outcome interrupted, ended at the last event stored,
	// which is all that is known (the duration is a lower bound).
	calls := make([]*runningCall, 0, len(running))
	for _, c := range running {
		calls = append(calls, c)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].at.Before(calls[j].at) })
	var out Interruption
	tools := make([]string, 0, len(calls))
	// Past what its process may have published and not stored: a client
	// that saw those events and resumes after them still gets these.
	seq := last + PublishedAhead
	now := t.Now.UTC()
	for _, c := range calls {
		tc := c.record(t.TurnID, lastAt, progress[c.started.CallID], t.Why)
		out.Calls = append(out.Calls, tc)
		seq++
		out.Events = append(out.Events, event.Event{Seq: seq, TurnID: t.TurnID, Type: event.TypeToolFinished, At: now,
			Data: &event.ToolFinished{ToolCall: tc}})
		tools = append(tools, c.started.Tool)
		ran = append(ran, span{tc.StartedAt, tc.EndedAt})
	}
	if model != "" && lastAt.After(modelAt) {
		llm += lastAt.Sub(modelAt)
	}
	// The model call under way: an attempt, or a compaction; a turn makes
	// one at a time, so the later begun.
	switch {
	case attempt != nil && (compact == nil || !compAt.After(modelAt)):
		out.Attempt = &event.LostAttempt{Started: attempt, At: modelAt, Until: later(lastAt, modelAt)}
	case compact != nil:
		out.Attempt = &event.LostAttempt{Compaction: compact, At: compAt, Until: later(lastAt, compAt)}
	}

	end := lastAt
	if (t.Said != nil || t.Stop != nil) && now.After(end) {
		// Its end is known: now.
		end = now
	}
	status := budget.StatusInterrupted
	var stopped Stopped
	if t.Stop != nil {
		stopped = t.Stop(out.Calls)
		status = cmp.Or(t.Reason, budget.Interrupted).Status()
	}
	rec := event.Turn{TurnID: t.TurnID, SessionID: t.SessionID, Agent: t.Agent, Input: t.Input, StartedAt: t.StartedAt,
		Status: status, StopReason: cmp.Or(t.Reason, budget.Interrupted), Steps: t.Steps, Flags: stopped.Flags,
		EndedAt: end, WallMS: end.Sub(t.StartedAt).Milliseconds(),
		// Lower bounds, as the wall time of an unknown end is: what the
		// stored events show.
		LLMMS: llm.Milliseconds(), ToolMS: covered(ran).Milliseconds(), Failovers: fails}
	if model != "" {
		rec.Answer = text.String()
	}
	rec.Message = interruptMessage(t.End, stopped.Message, end.Sub(t.StartedAt), last, tools, model)
	out.Record = rec
	out.Events = append(out.Events, event.Event{Seq: seq + 1, TurnID: t.TurnID, Type: event.TypeTurnFinished, At: now,
		Data: &event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message, Answer: rec.Answer,
			Flags: rec.Flags, Limit: stopped.Limit,
			Totals: event.Totals{Steps: rec.Steps, ToolCalls: t.ToolCalls + len(out.Calls), WallMS: rec.WallMS,
				LLMMS: rec.LLMMS, ToolMS: rec.ToolMS, Failovers: rec.Failovers}}})
	return out
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// span is a stretch of time a tool call ran.
type span struct{ from, to time.Time }

// covered returns the time the spans cover, counted once where they
// overlap: a batch of concurrent calls counts once, as a turn's tool_ms
// does, and its waits for people between calls not at all.
func covered(ss []span) time.Duration {
	sort.Slice(ss, func(i, j int) bool { return ss[i].from.Before(ss[j].from) })
	var total time.Duration
	var end time.Time
	for _, s := range ss {
		if s.from.After(end) {
			end = s.from
		}
		if s.to.After(end) {
			total += s.to.Sub(end)
			end = s.to
		}
	}
	return total
}

// runningCall is a tool call a turn's log shows started and not finished.
type runningCall struct {
	started *event.ToolStarted
	at      time.Time
}

// record returns the record of a call that was running when its process
// stopped: outcome interrupted, ended at the turn's last event.
func (c *runningCall) record(turnID string, lastAt time.Time, progress int, why string) event.ToolCall {
	d := c.started
	end := lastAt
	if end.Before(c.at) {
		end = c.at
	}
	return event.ToolCall{CallID: d.CallID, TurnID: turnID, Step: d.Step, Tool: d.Tool, Kind: d.Kind, Arguments: d.Arguments,
		StartedAt: c.at, EndedAt: end, DurationMS: end.Sub(c.at).Milliseconds(), TimeoutMS: d.TimeoutMS,
		TimeoutSource: d.Source, IdleTimeoutMS: d.IdleTimeoutMS, Enforcement: d.Enforcement,
		Outcome: event.OutcomeInterrupted, ProgressCount: progress,
		Result: fmt.Sprintf("Interrupted: %s while this call was running, at least %s after it started. Its result is unknown.",
			why, budget.Round(end.Sub(c.at)))}
}

// interruptMessage says what happened to an interrupted turn and what was
// running at the time, for the person who asked. Unless the one ending it
// knows its end (End.Said), how long the turn ran is known only up to its
// last stored event, so it says "at least". A turn stopped by a budget
// (End.Stop) opens with stopped, its engine's words.
func interruptMessage(end End, stopped string, ran time.Duration, events int64, tools []string, model string) string {
	var doing string
	switch {
	case len(tools) > 0:
		sort.Strings(tools)
		if len(tools) == 1 {
			doing = fmt.Sprintf(" Tool %s was running; its call is recorded as interrupted.", tools[0])
		} else {
			doing = fmt.Sprintf(" Tools %s were running; their calls are recorded as interrupted.", strings.Join(tools, ", "))
		}
	case model != "":
		doing = fmt.Sprintf(" Model %s was answering.", model)
	}
	if end.Stop != nil {
		return stopped + doing
	}
	if end.Said != nil {
		kept := " Nothing of it ran."
		if events > 0 {
			kept = fmt.Sprintf(" Everything it emitted is kept (%d event%s).", events, plural(events))
		}
		return end.Said(ran) + doing + kept + " Send the message again to retry."
	}
	return fmt.Sprintf("Interrupted: %s before the turn ended, at least %s after it started (its last stored event; the real end is unknown).%s Everything it emitted until then is kept (%d event%s). Send the message again to retry.",
		end.Why, budget.Round(ran), doing, events, plural(events))
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Interrupter is a store that can end a running turn from outside, as its
// process would have: the records of its running calls, their
// tool_finished, its turn_finished and its record, all at once, and only
// if the turn is still running — of two that race, one ends it.
// PostgreSQL and Memory implement it; an engine's gateway uses it when the
// engine that ran the turn is lost (budget.EngineLost).
type Interrupter interface {
	// InterruptTurn ends turn id as end says, and returns how it ended it
	// (the calls it recorded interrupted, the model attempt that was
	// under way: what the one that ends the turn makes the spans of,
	// agent.TraceLost); nil when the turn had ended already.
	InterruptTurn(ctx context.Context, turnID string, end End) (*Ending, error)
}
