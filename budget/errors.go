package budget

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Phase is where in the loop a timeout or failure happened (spec §6).
type Phase string

// The phases. Only the LLM phases (IsLLM) may rotate credentials or switch
// models.
const (
	PhaseLLMFirstChunk Phase = "llm_first_chunk"
	PhaseLLMIdle       Phase = "llm_idle"
	PhaseLLMHTTP       Phase = "llm_http"
	PhaseLLMBudget     Phase = "llm_budget"
	// PhaseLLMEmpty is a reply that ended normally with neither text nor
	// tool calls. It is an LLM phase: another attempt may well answer.
	PhaseLLMEmpty Phase = "llm_empty"
	// PhaseLLMReplyCap is a reply that reached limits.max_reply; its stream
	// was closed at the cap. It is not an LLM phase: another credential or
	// model, given the same prompt, would most likely do the same.
	PhaseLLMReplyCap Phase = "llm_reply_cap"
	PhaseTool        Phase = "tool"
	PhaseToolIdle    Phase = "tool_idle"
	PhaseStep        Phase = "step"
	PhaseTurn        Phase = "turn"
	PhaseCompaction  Phase = "compaction"
	PhaseCancel      Phase = "cancel"
	// PhaseApproval is the wait for a person's decision on a call that
	// needs one (timeouts.approval): a call that expired in it was never
	// run.
	PhaseApproval Phase = "approval"
	// PhaseWorkerLost is a call, or a model call attempt, that was running
	// on an engine's worker that died or stopped answering (package
	// temporal): nobody's budget, and not the model's failure.
	PhaseWorkerLost Phase = "worker_lost"
)

// IsLLM reports whether p is a phase in which the model provider failed to
// answer (first chunk, idle, HTTP failure, an empty reply) — the only
// phases in which retrying with another credential or model can help. The
// llm_budget and llm_reply_cap phases are limits of the turn and are not
// among them.
func (p Phase) IsLLM() bool {
	switch p {
	case PhaseLLMFirstChunk, PhaseLLMIdle, PhaseLLMHTTP, PhaseLLMEmpty:
		return true
	}
	return false
}

// TimeoutError is a budget that expired. It is used as a context cause
// (context.WithTimeoutCause, context.WithCancelCause) so whoever sees a
// cancelled context can ask context.Cause why.
type TimeoutError struct {
	// Phase is where in the loop the budget fired: tool, llm_idle, turn, …
	Phase Phase
	// Limit is the budget's value.
	Limit   time.Duration
	Elapsed time.Duration // filled by whoever observes the expiry; may be zero
	// Source is where Limit came from, and Knob the setting that changes
	// it, as in Duration.
	Source Source
	Knob   string
	// Subject is what the budget applied to, for messages: `tool "crawl"`,
	// `model gpt-4o`, "the turn".
	Subject string
}

// Expired returns the timeout of d running out: its limit, source and knob
// from d, with the phase, what it applied to (for messages) and the time
// elapsed (zero when whoever observes the expiry fills it).
func (d Duration) Expired(phase Phase, subject string, elapsed time.Duration) *TimeoutError {
	return &TimeoutError{Phase: phase, Limit: d.D, Elapsed: elapsed, Source: d.Source, Knob: d.Knob, Subject: subject}
}

// Error says which budget fired, on what, after how long, and which knob
// changes it: "tool timeout: tool \"crawl\" exceeded 30s (elapsed 30s);
// change tools[crawl].timeout in agent.yaml".
func (e *TimeoutError) Error() string {
	// Plain concatenation, not fmt, in one allocation: a burst of stops
	// (10,000 turns' ceilings at one instant) writes thousands at once.
	var elapsed string
	if e.Elapsed > 0 {
		elapsed = Round(e.Elapsed).String()
	}
	var b strings.Builder
	b.Grow(len(e.Phase) + len(e.subject()) + len(elapsed) + len(e.Knob) + 64)
	b.WriteString(string(e.Phase))
	b.WriteString(" timeout: ")
	b.WriteString(e.subject())
	b.WriteString(" exceeded ")
	b.WriteString(e.Limit.String())
	if elapsed != "" {
		b.WriteString(" (elapsed ")
		b.WriteString(elapsed)
		b.WriteString(")")
	}
	if e.Knob != "" {
		b.WriteString("; change ")
		b.WriteString(e.Knob)
	}
	return b.String()
}

func (e *TimeoutError) subject() string {
	if e.Subject == "" {
		return "call"
	}
	return e.Subject
}

// Is lets errors.Is(err, context.DeadlineExceeded) hold for a timeout.
func (e *TimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// AsTimeout returns the *TimeoutError in err's chain, if any.
func AsTimeout(err error) (*TimeoutError, bool) {
	if te, ok := err.(*TimeoutError); ok {
		return te, true // the common case, without errors.As's reflection
	}
	var te *TimeoutError
	ok := errors.As(err, &te)
	return te, ok
}

// CancelError is a stop that nobody's budget caused: a client cancelled the
// turn, went away, or the server is shutting down.
type CancelError struct {
	Reason StopReason // Cancelled, ClientGone or Shutdown
	// By says who cancelled, for messages ("the client", "the server").
	By string
}

// Error returns the stop reason, and who cancelled when known:
// "cancelled by the client".
func (e *CancelError) Error() string {
	if e.By != "" {
		return fmt.Sprintf("%s by %s", e.Reason, e.By)
	}
	return string(e.Reason)
}

// WentAway says that who, a client or the process that followed a turn
// for it, went away; a who that ends in a clause of its own (", which
// stopped sending heartbeats 3s ago") is closed by a comma.
func WentAway(who string) string {
	if strings.Contains(who, ", which ") {
		return who + ", went away"
	}
	return who + " went away"
}

// Is lets errors.Is(err, context.Canceled) hold for a cancellation.
func (e *CancelError) Is(target error) bool { return target == context.Canceled }

// AsCancel returns the *CancelError in err's chain, if any.
func AsCancel(err error) (*CancelError, bool) {
	if ce, ok := err.(*CancelError); ok {
		return ce, true
	}
	var ce *CancelError
	ok := errors.As(err, &ce)
	return ce, ok
}

// ReplyTooLongError is a model reply that grew past limits.max_reply (its
// text plus its tool calls' names and arguments): the stream was closed at
// the cap. It is used as the stream's context cause, like a TimeoutError.
type ReplyTooLongError struct {
	// Limit is limits.max_reply, in bytes.
	Limit int64
	// Source is where Limit came from, and Knob the setting that changes
	// it, as in Duration.
	Source Source
	Knob   string
	// Subject is the model, for messages: "model gpt-4o".
	Subject string
}

// Error says whose reply grew past which cap, and the knob that changes it.
func (e *ReplyTooLongError) Error() string {
	s := fmt.Sprintf("%s: the reply of %s grew past %s", PhaseLLMReplyCap, e.subject(), FormatBytes(e.Limit))
	if e.Knob != "" {
		s += "; change " + e.Knob
	}
	return s
}

func (e *ReplyTooLongError) subject() string {
	if e.Subject == "" {
		return "the model"
	}
	return e.Subject
}

// AsReplyTooLong returns the *ReplyTooLongError in err's chain, if any.
func AsReplyTooLong(err error) (*ReplyTooLongError, bool) {
	var re *ReplyTooLongError
	ok := errors.As(err, &re)
	return re, ok
}

// Cause returns context.Cause(ctx), mapping a bare context.Canceled (a
// parent cancelled without a cause) to a *CancelError with reason
// "cancelled", and a bare context.DeadlineExceeded (the caller's own
// deadline, not a budget of timebox's) to one by "the caller's deadline":
// a context that ends cancels the turn as a client would, whichever way
// it ends. It returns nil while ctx is live.
func Cause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	c := context.Cause(ctx)
	if _, ok := AsTimeout(c); ok {
		return c
	}
	if _, ok := AsCancel(c); ok {
		return c
	}
	if _, ok := AsReplyTooLong(c); ok {
		return c
	}
	if errors.Is(c, context.DeadlineExceeded) {
		return &CancelError{Reason: Cancelled, By: CallersDeadline}
	}
	return &CancelError{Reason: Cancelled}
}

// CallersDeadline is the CancelError.By of a turn whose context's own
// deadline passed (Cause).
const CallersDeadline = "the caller's deadline"

// CancelGrace is the longest polite-stop window a cancellation (as opposed
// to a tool's own timeout) allows. A person who pressed stop, a client that
// went away and a shutting-down server want the call gone now; see
// docs/decisions/cancel-grace.md.
const CancelGrace = 500 * time.Millisecond

// GraceFor returns the time between the polite and the forced stop of a call
// stopped for cause: the tool's kill grace when its own budget fired, at
// most CancelGrace when the turn was cancelled or stopped around it.
func GraceFor(cause error, killGrace time.Duration) time.Duration {
	if te, ok := AsTimeout(cause); ok && (te.Phase == PhaseTool || te.Phase == PhaseToolIdle) {
		return killGrace
	}
	return min(killGrace, CancelGrace)
}
