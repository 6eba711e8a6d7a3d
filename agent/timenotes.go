package agent

import (
	"strings"

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
