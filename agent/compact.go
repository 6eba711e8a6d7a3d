package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// summaryHeading introduces the compaction summary in the system prompt.
const summaryHeading = "Summary of the earlier conversation (older messages were summarised to save space):"

// compactionInstructions is the system prompt of a compaction call.
const compactionInstructions = `You are summarising a conversation for an assistant that will continue it without seeing the original messages.
Write a concise summary: the user's goals, facts learned, tool results that still matter, decisions made, and open tasks.
Reply with the summary only.`

// bytesPerToken is the estimate's ratio (see estimateTokens).
const bytesPerToken = 4

// Convergence (docs/decisions/compaction-convergence.md): the tool results
// of one step are sent to the model within resultShare of compact_at, so
// that one step cannot by itself put a fresh conversation over it; and
// after a compaction that failed or left the conversation over compact_at,
// the next is tried only once the estimate has grown by compact_at /
// retryGrowth.
const (
	resultShare = 2 // one step's results take at most 1/resultShare of compact_at
	retryGrowth = 10
)

// conversation returns the whole conversation: the session's history and
// what this turn added.
func (t *turn) conversation() []model.Message {
	all := make([]model.Message, 0, len(t.in.History)+len(t.msgs))
	return append(append(all, t.in.History...), t.msgs...)
}

// estimateTokens estimates the prompt size of req in tokens: about four
// bytes a token, which is close for English text and JSON and errs on the
// side of compacting early for other scripts.
func estimateTokens(req model.Request) int {
	n := len(req.System)
	for _, m := range req.Messages {
		n += len(m.Content) + 4
		for _, c := range m.ToolCalls {
			n += len(c.Name) + len(c.Arguments) + 8
		}
	}
	for _, d := range req.Tools {
		n += len(d.Name) + len(d.Description) + len(d.Parameters)
	}
	return n / 4
}

// compactionCut returns where the messages kept as they are begin: at the
// most recent user message, or, when that would keep everything since the
// last compaction, at the most recent assistant message. Cutting only there
// never separates a tool result from the call it answers. It returns 0 when
// nothing can be summarised.
func compactionCut(all []model.Message, from int) int {
	for _, role := range []model.Role{model.RoleUser, model.RoleAssistant} {
		for i := len(all) - 1; i > from; i-- {
			if all[i].Role == role {
				return i
			}
		}
	}
	return 0
}

// sendable cuts, in msgs (a copy the caller owns), the tool results of
// each step to what the model is sent: together at most half of
// context.compact_at (in bytes, at bytesPerToken), shared so that a small
// result is sent whole and the large ones split what is left. The session
// history and the tool call records keep every result whole; only the
// requests see the cut. Off when compaction is off.
func (t *turn) sendable(msgs []model.Message) []model.Message {
	if t.a.compactAt <= 0 {
		return msgs
	}
	room := t.a.compactAt * bytesPerToken / resultShare
	for i := 0; i < len(msgs); {
		if msgs[i].Role != model.RoleTool {
			i++
			continue
		}
		j := i
		for j < len(msgs) && msgs[j].Role == model.RoleTool {
			j++
		}
		shareOut(msgs[i:j], room)
		i = j
	}
	return msgs
}

// shareOut cuts the results of one step so that together they take at most
// room bytes: the smallest first, each given at most an equal share of
// what the ones before left.
func shareOut(results []model.Message, room int) {
	total := 0
	for _, m := range results {
		total += len(m.Content)
	}
	if total <= room {
		return
	}
	order := make([]int, len(results))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return len(results[order[a]].Content) < len(results[order[b]].Content) })
	left := room
	for k, i := range order {
		share := left / (len(order) - k)
		n := len(results[i].Content)
		if n > share {
			results[i].Content = cutResult(results[i].Content, share)
			n = share
		}
		left -= n
	}
}

// cutResult keeps the first n bytes of a tool result (whole characters
// only) and says so to the model.
func cutResult(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + fmt.Sprintf("\n[output cut: only the first %d of its %d bytes are sent to the model, to keep the conversation within context.compact_at; ask for a narrower result if more is needed]", n, len(s))
}

// transcript renders messages as text for the compaction call, so that it
// needs no tool definitions and no call/result pairing.
func transcript(msgs []model.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case model.RoleTool:
			fmt.Fprintf(&b, "[tool result from %s]\n%s\n\n", m.ToolName, m.Content)
		default:
			fmt.Fprintf(&b, "[%s]\n%s\n", m.Role, m.Content)
			for _, c := range m.ToolCalls {
				fmt.Fprintf(&b, "(called tool %s with %s)\n", c.Name, c.Arguments)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// compact summarises older history when the next request's estimated size
// passes context.compact_at (spec §6), or, with force, because the provider
// refused the conversation as too long. The call runs on the primary model
// under timeouts.compaction and never rotates credentials or falls back.
//
// A compaction that fails goes on with the uncompacted history (the
// provider decides whether that fits; a length refusal then stops the turn
// with compaction_failed); one that leaves the conversation still over
// compact_at is recorded as insufficient and its summary kept. After
// either, no compaction is tried again until the estimate has grown by
// compact_at/retryGrowth, so a conversation that cannot get under the
// threshold is not compacted on every step. shrunk reports whether older
// history was summarised. It returns a stop only when the turn itself was
// stopped during the compaction.
func (t *turn) compact(ctx context.Context, step int, force bool) (shrunk bool, st *stop) {
	limit := t.a.compactAt
	if limit <= 0 {
		return false, nil
	}
	before := estimateTokens(t.request())
	if (before <= limit && !force) || before < t.retryAt {
		return false, nil
	}
	all := t.conversation()
	cut := compactionCut(all, t.compactedUpTo)
	if cut == 0 {
		return false, nil // only the current exchange is left; nothing to summarise
	}
	b := t.b
	ep := t.a.models[0]
	t.em.Emit(&event.CompactionStarted{Step: step, EstimatedTokens: before, CompactAt: limit, LimitMS: b.Compaction.MS()})
	act := &activity{step: step, subject: "compaction (model " + ep.Model + ")", compaction: true}
	t.live.begin(act)

	older := t.sendable(all[t.compactedUpTo:cut])
	text := transcript(older)
	if t.summary != "" {
		text = "[summary of what came before]\n" + t.summary + "\n\n" + text
	}
	req := model.Request{Model: ep.Model, System: compactionInstructions, Conversation: t.request().Conversation,
		Messages: []model.Message{{Role: model.RoleUser, Content: text}}, Compaction: true}

	out := t.callModel(ctx, modelCall{step: step, attempt: 1, ep: ep, req: req,
		within: b.Compaction.D,
		expired: func() error {
			return b.Compaction.Expired(budget.PhaseCompaction, "history compaction", b.Compaction.D)
		},
		chunk: func(_ *model.Watched, c model.Chunk) string {
			t.live.progress()
			return c.Text
		}})
	elapsed, err := out.elapsed, out.err
	if err == nil && strings.TrimSpace(out.resp.Text) == "" {
		err = &model.Error{Provider: ep.ProviderName, Message: "the compaction reply was empty"}
	}
	t.live.end(act, err == nil)

	rec := out.rec
	fin := &event.CompactionFinished{Step: step, Outcome: event.OutcomeOK, DurationMS: elapsed.Milliseconds(), TokensBefore: before}
	if err != nil {
		failed(&rec, err)
		fin.Outcome, fin.Phase = rec.Outcome, rec.Phase
		fin.TokensAfter = before
	}
	if ctx.Err() != nil { // the turn itself was stopped during the compaction
		t.addModelRecord(rec)
		fin.Message = "the turn was stopped during compaction"
		t.em.Emit(fin)
		st := t.stopFromContext(ctx)
		return false, &st
	}
	growth := max(limit/retryGrowth, 1)
	if err != nil {
		t.retryAt = before + growth
		if te, ok := budget.AsTimeout(err); ok && te.Phase == budget.PhaseCompaction {
			t.compactionTimeout = true
			fin.Message = fmt.Sprintf("Compaction did not finish within %s (%s); going on with the full history.", te.Limit, te.Knob)
		} else {
			fin.Message = fmt.Sprintf("Compaction failed (%v); going on with the full history.", err)
		}
		fin.Message += fmt.Sprintf(" It is not tried again before the conversation grows to about %d tokens.", t.retryAt)
		t.compactionFailed = err
	} else {
		t.summary = strings.TrimSpace(out.resp.Text)
		t.compactedUpTo = cut
		t.compactionFailed, t.insufficient = nil, false
		shrunk = true
		after := estimateTokens(t.request())
		fin.TokensAfter, t.retryAt = after, 0
		if after > limit {
			t.insufficient = true
			t.retryAt = after + growth
			rec.Outcome, fin.Outcome = event.OutcomeInsufficient, event.OutcomeInsufficient
			rec.Error = fmt.Sprintf("still about %d tokens after compaction, over context.compact_at (%d)", after, limit)
			fin.Message = fmt.Sprintf("Compaction left about %d tokens, still over context.compact_at (%d): what cannot be summarised yet (the instructions, the tool definitions and the latest step) is too large. "+
				"Going on; it is not tried again before the conversation grows to about %d tokens.", after, limit, t.retryAt)
		}
	}
	t.addModelRecord(rec)
	t.em.Emit(fin)
	return shrunk, nil
}

// tooLong handles a step the provider refused as too long for the model
// (model.Error.TooLong). When compaction is on and can summarise something
// it has not, it compacts and returns nil: the step is made again with the
// shorter history. Otherwise the history cannot fit, and the turn stops
// with compaction_failed. Any other stop is returned as it is.
func (t *turn) tooLong(ctx context.Context, st *stop) *stop {
	var me *model.Error
	if st.reason != budget.ModelRejected || !errors.As(st.cause, &me) || !me.TooLong || t.a.compactAt <= 0 {
		return st
	}
	// Each forced compaction summarises messages no earlier one did, and a
	// refusal adds none, so this cannot repeat without new messages.
	shrunk, cst := t.compact(ctx, t.steps+1, true)
	if cst != nil {
		return cst
	}
	if shrunk {
		return nil
	}
	return &stop{reason: budget.CompactionFailed, cause: st.cause}
}

// compactionFailedMessage is the closing message of a turn whose history
// could not fit: what the provider said, why compaction did not help, and
// the two knobs that change it.
func (t *turn) compactionFailedMessage(st stop, wall time.Duration) string {
	var me *model.Error
	why := "the provider refused it as too long"
	if errors.As(st.cause, &me) {
		why = fmt.Sprintf("%s refused it as too long for model %s (HTTP %d: %s)", me.Provider, t.lastModel, me.Status, me.Message)
	}
	var help string
	te, timedOut := budget.AsTimeout(t.compactionFailed)
	switch {
	case timedOut && te.Phase == budget.PhaseCompaction:
		help = fmt.Sprintf(" History compaction had timed out after %s (%s), so the full history was sent; raise %s.", te.Limit, te.Knob, te.Knob)
	case t.compactionFailed != nil:
		var cme *model.Error
		reason := t.compactionFailed.Error()
		if errors.As(t.compactionFailed, &cme) {
			reason = cme.Message
		}
		help = fmt.Sprintf(" History compaction had failed (%s), so it could not be shortened.", reason)
	case t.insufficient:
		help = " Compaction could not bring it under context.compact_at: what cannot be summarised (the instructions, the tool definitions and the latest step) is too large."
	case t.summary != "":
		help = " Older history was summarised, and what cannot be (the instructions, the tool definitions and the latest step) is still too long."
	default:
		help = " Nothing older than the latest step was left to summarise."
	}
	l := t.l.MaxToolOutput
	return fmt.Sprintf("Stopped after %s: the conversation (about %d tokens by timebox's estimate) does not fit; %s.%s "+
		"Lower context.compact_at (now %d) so that older history is summarised before the model's limit, or make tool results smaller "+
		"(%s, now %s, or narrower requests); a new session starts with an empty history.",
		roundHuman(wall), estimateTokens(t.request()), why, help, t.a.compactAt, l.Knob, budget.FormatBytes(l.N))
}

// tooLongNote explains, for a refusal of a conversation too long for the
// model while compaction is off, how to make it fit.
func tooLongNote(err error) string {
	var me *model.Error
	if !errors.As(err, &me) || !me.TooLong {
		return ""
	}
	return " The conversation is too long for the model and history compaction is off: set context.compact_at to summarise older history, or make tool results smaller (limits.max_tool_output)."
}

// compactionNote explains, for the closing message of a turn the provider
// refused, that the history it was given had failed to compact.
func (t *turn) compactionNote() string {
	if t.compactionFailed == nil {
		return ""
	}
	if te, ok := budget.AsTimeout(t.compactionFailed); ok && te.Phase == budget.PhaseCompaction {
		return fmt.Sprintf(" History compaction had timed out after %s (%s), so the full history was sent; raise %s or lower context.compact_at.", te.Limit, te.Knob, te.Knob)
	}
	var me *model.Error
	if errors.As(t.compactionFailed, &me) {
		return fmt.Sprintf(" History compaction had failed (%s), so the full history was sent.", me.Message)
	}
	return " History compaction had failed, so the full history was sent."
}
