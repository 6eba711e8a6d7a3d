package agent

import (
	"strconv"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// Time notes (context.time_notes, docs/decisions/time-notes.md) tell the
// model its time, so that it can choose tools, split work and answer with
// what it has before a budget ends it. They are added to what the model is
// sent, never to what the agent file or the transcript hold.

// toolBudgetNote is the sentence that ends a tool's description when the
// notes are on: what its budget in this turn does to a call, in plain
// words. A cooperative budget reads as a hard one: to the model both end
// the call at the same time.
func toolBudgetNote(b budget.ToolBudget) string {
	if b.Timeout.Off() {
		return ""
	}
	t := budget.FormatDuration(b.Timeout.D)
	if b.Enforcement == budget.Advisory {
		if !b.IdleTimeout.Off() {
			return "Advisory budget " + t + ", " + budget.FormatDuration(b.IdleTimeout.D) + " of silence: may run longer."
		}
		return "Advisory budget " + t + ": may run longer."
	}
	if !b.IdleTimeout.Off() {
		return "Times out after " + t + "; stopped if silent for " + budget.FormatDuration(b.IdleTimeout.D) + "."
	}
	return "Times out after " + t + "."
}

// withNote ends a description with a note, as a sentence of its own.
func withNote(desc, note string) string {
	if note == "" {
		return desc
	}
	desc = strings.TrimRight(desc, " \t\n")
	switch {
	case desc == "":
		return note
	case strings.HasSuffix(desc, ".") || strings.HasSuffix(desc, "!") || strings.HasSuffix(desc, "?"):
		return desc + " " + note
	}
	return desc + ". " + note
}

// timeNote is the note each model request of the turn ends with: the
// turn's time left (its waits for people left out), the step's no-progress window, llm_budget left when it
// is set, and the tool calls left. It is built for each request and never
// stored, so that it does not pile up in the history.
func (t *turn) timeNote(now time.Time) string {
	b, l := t.s.Budgets, t.s.Limits
	var sb strings.Builder
	sb.WriteString("[timebox] Time left in this turn: ")
	// The ceiling, as far as waits for people have moved it: their time
	// is not taken from the turn's.
	sb.WriteString(noteLeft(t.s.Ceiling().Sub(now)) + " of " + budget.FormatDuration(b.Turn.D) + ".")
	if !b.Step.Off() {
		sb.WriteString(" A step with no progress for " + budget.FormatDuration(b.Step.D) + " is stopped.")
	}
	if !b.LLMBudget.Off() {
		sb.WriteString(" Model time left: " + noteLeft(b.LLMBudget.D-t.s.LLMUsed) + " of " + budget.FormatDuration(b.LLMBudget.D) + ".")
	}
	if n := l.MaxToolCalls.N; n > 0 {
		sb.WriteString(" Tool calls left: " + strconv.FormatInt(max(n-int64(t.s.ToolCalls), 0), 10) + " of " + strconv.FormatInt(n, 10) + ".")
	}
	return sb.String()
}

// noteLeft renders time left for the model: whole seconds, or whole
// milliseconds under a second; never below 0.
func noteLeft(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return budget.FormatDuration(d.Round(time.Second))
}
