package machine

import (
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
)

// Cause is why a turn stopped, or why its compaction failed, in a form
// that can be sent: the budget that ran out, the cancellation, the
// provider's error, or else its text.
type Cause struct {
	Timeout      *budget.TimeoutError      `json:"timeout,omitempty"`
	Cancel       *budget.CancelError       `json:"cancel,omitempty"`
	ReplyTooLong *budget.ReplyTooLongError `json:"reply_too_long,omitempty"`
	Model        *ModelError               `json:"model,omitempty"`
	Text         string                    `json:"text,omitempty"`
}

// ModelError is a model.Error without its wrapped error.
type ModelError struct {
	Provider   string        `json:"provider"`
	Status     int           `json:"status,omitempty"`
	Message    string        `json:"message,omitempty"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Malformed  bool          `json:"malformed,omitempty"`
	TooLong    bool          `json:"too_long,omitempty"`
}

// maxText bounds the texts a Cause carries: a provider's error can be
// long, and a State travels in a workflow's history, whose payloads
// Temporal bounds.
const maxText = 16 << 10

// Cut cuts s to 16 KiB, for a text a State carries.
func Cut(s string) string { return cut(s) }

func cut(s string) string {
	if len(s) <= maxText {
		return s
	}
	n := maxText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// CauseOf returns err as a Cause; nil for nil. Its texts are cut to 16
// KiB.
func CauseOf(err error) *Cause {
	if err == nil {
		return nil
	}
	c := &Cause{Text: cut(err.Error())}
	var me *model.Error
	switch te, ok := budget.AsTimeout(err); {
	case ok:
		c.Timeout = te
	case errors.As(err, &c.Cancel):
	case errors.As(err, &c.ReplyTooLong):
	case errors.As(err, &me):
		c.Model = &ModelError{Provider: me.Provider, Status: me.Status, Message: cut(me.Message), RetryAfter: me.RetryAfter,
			Malformed: me.Malformed, TooLong: me.TooLong}
	}
	return c
}

// Err returns the error c describes; nil for a nil c.
func (c *Cause) Err() error {
	switch {
	case c == nil:
		return nil
	case c.Timeout != nil:
		return c.Timeout
	case c.Cancel != nil:
		return c.Cancel
	case c.ReplyTooLong != nil:
		return c.ReplyTooLong
	case c.Model != nil:
		m := c.Model
		return &model.Error{Provider: m.Provider, Status: m.Status, Message: m.Message, RetryAfter: m.RetryAfter,
			Malformed: m.Malformed, TooLong: m.TooLong}
	}
	return errors.New(c.Text)
}

// StopReasonOf returns the stop reason of a turn stopped from outside its
// units by cause: the turn's ceiling (or the caller's own deadline),
// the step watchdog, the llm_budget, a cancellation — a bare one reads as
// cancelled.
func StopReasonOf(cause error) budget.StopReason {
	if te, ok := budget.AsTimeout(cause); ok {
		switch te.Phase {
		case budget.PhaseStep:
			return budget.NoProgress
		case budget.PhaseLLMBudget:
			return budget.LLMBudgetExhausted
		}
		return budget.TurnTimeout
	}
	if ce, ok := budget.AsCancel(cause); ok {
		return ce.Reason
	}
	return budget.Cancelled
}

// StopNote is what a turn was doing when a turn-level budget or a
// cancellation stopped it, for its closing message and flags.
type StopNote struct {
	// Desc says what ran: "tool crawl, running for 41s".
	Desc string `json:"desc"`
	// Tools are the tools that were running.
	Tools []string `json:"tools,omitempty"`
	// DuringRun: a tool was running; DuringCompact: a history compaction.
	DuringRun     bool `json:"during_run,omitempty"`
	DuringCompact bool `json:"during_compact,omitempty"`
}

// RunningDesc says that a call of tool runs, and has for ran: a stop
// note's Desc, on either engine.
func RunningDesc(tool string, ran time.Duration) string {
	return "tool " + tool + ", running for " + budget.RoundHuman(ran).String()
}

// WaitingDesc says that a call of tool waits for a person's decision, and
// has for waited: a stop note's Desc, on either engine.
func WaitingDesc(tool string, waited time.Duration) string {
	return "tool " + tool + ", waiting for a person's decision (" + budget.RoundHuman(waited).String() + ")"
}

// Merge returns n with what o says ran added: the notes of units stopped
// at the same time in different places (the calls of one batch).
func (n *StopNote) Merge(o *StopNote) *StopNote {
	switch {
	case o == nil:
		return n
	case n == nil:
		c := *o
		return &c
	}
	c := *n
	c.Tools = append(append([]string(nil), n.Tools...), o.Tools...)
	c.DuringRun = n.DuringRun || o.DuringRun
	c.DuringCompact = n.DuringCompact || o.DuringCompact
	switch {
	case len(c.Tools) > 1:
		c.Desc = "tools " + strings.Join(c.Tools, ", ") + " running"
	case o.DuringRun && !n.DuringRun:
		c.Desc = o.Desc
	}
	return &c
}
