package agent

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
)

// message writes the turn's closing message for the person waiting: what
// happened, how long it ran, what the last step was, and what to do (spec
// §5). Messages never blame the model for a budget that fired elsewhere.
func (t *turn) message(st machine.Ending, note *machine.StopNote, now time.Time) string {
	b, l := t.s.Budgets, t.s.Limits
	wall := budget.RoundHuman(now.Sub(t.s.Start))
	cause := st.Cause.Err()
	var last string
	var stopTools []string
	if note != nil {
		last, stopTools = note.Desc, note.Tools
	}
	if last == "" || last == "none" {
		last = t.s.LastStep
		if last == "" {
			last = "none"
		}
	}
	switch st.Reason {
	case budget.Answered:
		return t.tr.Message(t.s.Messages - 1).Content
	case budget.TurnTimeout:
		limit, knob := b.Turn.D, b.Turn.Knob
		if te, ok := budget.AsTimeout(cause); ok && te.Limit > 0 {
			limit, knob = te.Limit, te.Knob
		}
		named := knob
		if b.Turn.Source == budget.SourceRequest && knob == b.Turn.Knob {
			named = t.named(budget.KeyTurn)
		}
		return "Stopped after " + limit.String() + ", the limit for one turn (" + named + "). Last step: " + last +
			". Try a simpler request, or raise " + knob + "."
	case budget.NoProgress:
		advice := fmt.Sprintf("Raise %s if a step may legitimately stay silent longer.", b.Step.Knob)
		if len(stopTools) > 0 {
			advice = fmt.Sprintf("The tool was past its own timeout and reported no progress; have it report progress, or raise its timeout or %s.", b.Step.Knob)
		}
		return fmt.Sprintf("Stopped: nothing progressed for %s (%s). Last step: %s. %s", budget.FormatDuration(b.Step.D), t.named(budget.KeyStep), last, advice)
	case budget.LLMBudgetExhausted:
		return fmt.Sprintf("Stopped after %s: the model streamed for %s in this turn, its budget (%s); time spent in tools is not counted. Last step: %s. Ask for a shorter task, or raise %s.",
			wall, budget.RoundHuman(t.s.LLMUsed), t.named(budget.KeyLLMBudget), last, b.LLMBudget.Knob)
	case budget.MaxSteps:
		return fmt.Sprintf("Stopped after %d model calls, the limit for one turn (%s), in %s. Last step: %s. The task may need more steps: split the request, or raise %s.",
			l.MaxSteps.N, t.named(budget.KeyMaxSteps), wall, last, l.MaxSteps.Knob)
	case budget.MaxToolCalls:
		return fmt.Sprintf("Stopped after %d tool calls, the limit for one turn (%s), in %s. %sSplit the request, or raise %s.",
			t.s.ToolCalls, t.named(budget.KeyMaxToolCalls), wall, refusedText(st.Refused), l.MaxToolCalls.Knob)
	case budget.ModelUnresponsive:
		return fmt.Sprintf("Stopped after %s: the model went silent %d times in a row (%s). %s The provider may be overloaded: try again later or add a fallback model; raise %s or %s if the model is just slow.",
			wall, t.s.IdleStreak, l.IdleBreaker.Knob, st.Message, b.LLMIdle.Knob, b.LLMFirstChunk.Knob)
	case budget.ReplyTooLong:
		limit, knob, who := l.MaxReply.N, l.MaxReply.Knob, "the model"
		if re, ok := budget.AsReplyTooLong(cause); ok {
			limit, knob, who = re.Limit, re.Knob, re.Subject
		}
		kept := "Nothing of it is kept."
		if t.tr.Partial() != "" {
			kept = "What it wrote before the cap is kept as the partial answer."
		}
		return fmt.Sprintf("Stopped after %s: the reply of %s grew past %s, the limit for one reply (%s), and was cut off there. %s No other model was tried: given the same request it would most likely write on as long. Ask for a shorter answer, or raise %s.",
			wall, who, budget.FormatBytes(limit), knob, kept, knob)
	case budget.ModelUnavailable:
		if st.Empty > 0 {
			advice := "Try again, rephrase the request, or add a fallback model."
			if st.OutOfTokens {
				advice = "The model used its whole output allowance before writing anything (a reasoning model can): raise model.max_tokens in the agent file."
			}
			return fmt.Sprintf("Failed after %s: the model returned nothing%s (no text, no tool call). %s %s",
				wall, timesText(st.Empty), st.Message, advice)
		}
		return fmt.Sprintf("Failed after %s: no model in the failover chain answered. %s Check the providers and credentials, or add a fallback model.", wall, st.Message)
	case budget.ModelRejected:
		var me *model.Error
		if errors.As(cause, &me) {
			tried := "it was not retried with another credential or model. Fix the request, the model name or the credential."
			if st.Message != "" {
				tried = st.Message + ", and no other model was tried. Fix the credentials (or their access to the model)."
			}
			return fmt.Sprintf("Failed: %s rejected the request (HTTP %d): %s. This is not a timeout; %s%s%s",
				me.Provider, me.Status, strings.TrimRight(me.Message, ". "), tried, t.compactionNote(), tooLongNote(cause))
		}
		return fmt.Sprintf("Failed: the provider rejected the request: %v.", cause)
	case budget.CompactionFailed:
		return t.compactionFailedMessage(cause, now.Sub(t.s.Start))
	case budget.Cancelled, budget.ClientGone, budget.Shutdown:
		who := map[budget.StopReason]string{
			budget.Cancelled:  "Cancelled by the client after %s",
			budget.ClientGone: "Cancelled after %s: the client went away",
			budget.Shutdown:   "Cancelled after %s: the server is shutting down",
		}[st.Reason]
		s := fmt.Sprintf(who, wall)
		if ce, ok := budget.AsCancel(cause); ok && ce.By != "" {
			switch st.Reason {
			case budget.Cancelled:
				s = fmt.Sprintf("Cancelled by %s after %s", ce.By, wall)
			case budget.ClientGone:
				s = fmt.Sprintf("Cancelled after %s: %s", wall, budget.WentAway(ce.By))
			}
		}
		switch {
		case len(stopTools) == 1:
			s += fmt.Sprintf("; tool %s was stopped.", stopTools[0])
		case len(stopTools) > 1:
			s += fmt.Sprintf("; tools %s were stopped.", strings.Join(stopTools, ", "))
		case last != "none":
			s += fmt.Sprintf(". Last step: %s.", last)
		default:
			s += "."
		}
		return s
	case budget.Interrupted, budget.EngineLost:
		if ce, ok := budget.AsCancel(cause); ok && ce.Reason == budget.Interrupted && ce.By != "" {
			// Another process ended the turn in the store (it took this
			// one for gone): the store's message, word for word.
			return ce.By
		}
		why := "the engine running it could not go on"
		if cause != nil {
			why = cause.Error()
		}
		return fmt.Sprintf("Interrupted after %s: %s. Last step: %s. Send the message again.", wall, why, last)
	case budget.AgentMismatch:
		return st.Message
	}
	return fmt.Sprintf("Stopped after %s (%s).", wall, st.Reason)
}

func refusedText(n int) string { return fmt.Sprintf("%d more asked for were not run. ", n) }

// allEmpty reports whether every failed attempt was an empty reply.
func allEmpty(notes []attemptNote) bool {
	for _, n := range notes {
		var ee *model.EmptyReplyError
		if !errors.As(n.err, &ee) {
			return false
		}
	}
	return len(notes) > 0
}

// timesText says how often, after "returned nothing".
func timesText(n int) string {
	switch n {
	case 1:
		return ""
	case 2:
		return " twice"
	}
	return fmt.Sprintf(" on each of %d attempts", n)
}

// notesText lists failed model call attempts and why each failed.
func notesText(notes []attemptNote) string {
	var parts []string
	for i, n := range notes {
		who := n.endpoint
		if n.profile != "" {
			who += " with " + n.profile
		}
		parts = append(parts, fmt.Sprintf("%d) %s: %s", i+1, who, attemptReason(n.err)))
	}
	return "Attempts: " + strings.Join(parts, "; ") + "."
}

// attemptReason says in a few words why one attempt failed.
func attemptReason(err error) string {
	if te, ok := budget.AsTimeout(err); ok {
		switch te.Phase {
		case budget.PhaseLLMFirstChunk:
			return fmt.Sprintf("no reply within %s (llm_first_chunk; raise %s)", budget.FormatDuration(te.Limit), te.Knob)
		case budget.PhaseLLMIdle:
			return fmt.Sprintf("went silent for %s mid-reply (llm_idle; raise %s)", budget.FormatDuration(te.Limit), te.Knob)
		}
		return te.Error()
	}
	var ee *model.EmptyReplyError
	if errors.As(err, &ee) {
		if ee.FinishReason != "" {
			return fmt.Sprintf("returned nothing, finish reason %s (llm_empty)", ee.FinishReason)
		}
		return "returned nothing (llm_empty)"
	}
	var me *model.Error
	if errors.As(err, &me) {
		switch {
		case me.Status != 0 && me.RetryAfter > 0:
			// Said, so that a turn that did not wait it out shows why it
			// could not (longer than the turn or the step had left).
			return fmt.Sprintf("HTTP %d: %s; it asked to be tried again after %s (llm_http)", me.Status, me.Message, budget.RoundHuman(me.RetryAfter))
		case me.Status != 0:
			return fmt.Sprintf("HTTP %d: %s (llm_http)", me.Status, me.Message)
		case me.Malformed:
			// The parser's own words ("unexpected end of JSON input") do
			// not say whose JSON it was.
			return "malformed stream: " + me.Message + " (llm_http)"
		}
		return me.Message + " (llm_http)"
	}
	return err.Error()
}

// named names a budget in a message by its knob or, for a value the
// request set, by key, value and source: "timeouts.turn = 1.5s (from the
// request)".
func (t *turn) named(key string) string {
	k, _ := budget.KnobByKey(key)
	n, src, knob := k.Get(&t.s.Budgets, &t.s.Limits)
	if src == budget.SourceRequest {
		return key + " = " + k.Format(n) + " (from the request)"
	}
	return knob
}

// stopFlags returns the flags of a turn of state s ended as end says while
// note ran (spec §6): a turn-level budget (turn, step) that fired during a
// tool call or a compaction says so, and turn says it was the ceiling; a
// compaction of the turn that timed out (s.CompactionTimeout) says so
// whatever the end.
func stopFlags(s *machine.State, end machine.Ending, note *machine.StopNote) event.Flags {
	var flags event.Flags
	if te, ok := budget.AsTimeout(end.Cause.Err()); ok && (te.Phase == budget.PhaseTurn || te.Phase == budget.PhaseStep) {
		flags.TimedOutByTurnBudget = te.Phase == budget.PhaseTurn
		if note != nil {
			flags.TimedOutDuringToolExecution = note.DuringRun
			flags.TimedOutDuringCompaction = note.DuringCompact
		}
	}
	if s.CompactionTimeout {
		flags.TimedOutDuringCompaction = true
	}
	return flags
}

// limit returns the budget that stopped the turn, for turn_finished: the
// one that fired, with its value, source and knob; nil when no budget
// stopped it (an answer, a failure, a cancellation, the caller's own
// deadline).
func (t *turn) limit(st machine.Ending) *event.BudgetValue {
	if st.Reason == budget.CompactionFailed {
		c := t.a.compactKnob
		return &event.BudgetValue{Key: "context.compact_at", Value: fmt.Sprint(c.N), N: c.N, Source: c.Source, Knob: c.Knob}
	}
	k, ok := budget.KnobFor(st.Reason)
	if !ok {
		return nil
	}
	if te, ok := budget.AsTimeout(st.Cause.Err()); ok && te.Knob == "" {
		return nil // the caller's own context deadline
	}
	v := k.Value(&t.s.Budgets, &t.s.Limits)
	return &v
}
