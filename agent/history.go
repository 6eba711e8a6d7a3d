package agent

import (
	"fmt"

	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// RepairHistory returns a conversation both providers accept: every tool
// call of an assistant message followed, before the next message of any
// other role, by exactly one result. A conversation cut short — a turn
// interrupted by a crash between a tool call and its result, or stored in
// pieces — can break that pairing, and the OpenAI and Anthropic APIs refuse
// the whole request for it, so the session could never be continued.
//
// A call without a result gets a tool_cancelled result saying the turn was
// interrupted; a result that answers no call of the message before its run,
// and a second result for one call, are dropped; when anything was
// repaired, results follow the order of their calls. repaired counts the
// messages added or dropped; when it is 0, h is returned as it is. h itself
// is never modified.
//
// Run repairs Input.History with it, so every caller of the library gets
// the repair; it is exported for programs that keep or show conversations.
func RepairHistory(h []model.Message) (out []model.Message, repaired int) {
	out = make([]model.Message, 0, len(h))
	for i := 0; i < len(h); {
		m := h[i]
		if m.Role == model.RoleTool { // a result whose call is not right before it
			repaired++
			i++
			continue
		}
		out = append(out, m)
		i++
		if m.Role != model.RoleAssistant || len(m.ToolCalls) == 0 {
			continue
		}
		j := i
		for j < len(h) && h[j].Role == model.RoleTool {
			j++
		}
		results := h[i:j]
		used := make([]bool, len(results))
		for _, c := range m.ToolCalls {
			found := false
			for k, r := range results {
				if !used[k] && r.ToolCallID == c.ID {
					used[k], found = true, true
					out = append(out, r)
					break
				}
			}
			if !found {
				repaired++
				out = append(out, model.Message{Role: model.RoleTool, ToolCallID: c.ID, ToolName: c.Name, Content: interrupted(c.Name)})
			}
		}
		for k := range results {
			if !used[k] {
				repaired++
			}
		}
		i = j
	}
	if repaired == 0 {
		return h, 0
	}
	return out, repaired
}

// interrupted is the result given for a call whose turn ended before it.
func interrupted(name string) string {
	return tool.ErrorInfo{Type: "tool_cancelled", Tool: name, Message: fmt.Sprintf(
		"Tool %q has no result: the turn that called it was interrupted before the call finished (for example by a crash or a restart). "+
			"It may or may not have run; check before relying on what it would have done.", name)}.String()
}

// SplitSummary takes a session's history apart: its messages, without the
// notes of its compactions (model.RoleSummary), and the last of those
// notes — the summary the next turn starts from, and how many of the
// messages it stands for (at most all of them). A session's turns each
// leave such a note when they compacted, so that the next one sends the
// summary and what came after it, rather than summarising the whole
// session again at its first step: that grew by the session's every
// turn until the summarising call itself no longer fit.
func SplitSummary(h []model.Message) (msgs []model.Message, summary string, covers int) {
	for i, m := range h {
		if m.Role != model.RoleSummary {
			continue
		}
		if msgs == nil {
			msgs = append(make([]model.Message, 0, len(h)), h[:i]...)
		}
		summary, covers = m.Content, m.Covers
	}
	if msgs == nil {
		return h, "", 0
	}
	for _, m := range h[len(msgs):] {
		if m.Role != model.RoleSummary {
			msgs = append(msgs, m)
		}
	}
	return msgs, summary, min(max(covers, 0), len(msgs))
}
