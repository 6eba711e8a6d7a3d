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
	"github.com/timebox-run/timebox/internal/machine"
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
	h, m := t.tr.History(), t.tr.Messages()
	all := make([]model.Message, 0, len(h)+len(m))
	return append(append(all, h...), m...)
}

// estimateTokens estimates the prompt size of req in tokens: about four
// bytes a token, which is close for English text and JSON, with each
// character of the scripts whose words are a character or two (see
// weight) counted as a token.
func estimateTokens(req model.Request) int {
	n := weight(req.System) + weight(req.TimeNote)
	for _, m := range req.Messages {
		n += weight(m.Content) + 4
		for _, c := range m.ToolCalls {
			n += weight(c.Name) + weight(c.Arguments) + 8
		}
	}
	for _, d := range req.Tools {
		n += weight(d.Name) + weight(d.Description) + weight(d.Parameters)
	}
	return n / bytesPerToken
}

// weight is the size of s for the estimate, in bytes of English text:
// its bytes, with each character from U+3000 to U+D7FF (CJK punctuation
// and ideographs, kana, Hangul; three bytes in UTF-8, about a token each
// to the providers' tokenizers) counted as bytesPerToken bytes, and each
// four-byte character (emoji, rarer ideographs) as itself, a token. At
// four bytes a token alone, Chinese, Japanese and Korean text came to
// 0.75 of a token a character, fewer than the providers count, and a
// conversation in those scripts reached the model's limit before
// context.compact_at.
func weight[S ~string | ~[]byte](s S) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if b := s[i]; b >= 0xE3 && b <= 0xED {
			n++
		}
	}
	return n
}

// weightCut returns where the first w of s's weight ends, at the start of
// a character.
func weightCut(s string, w int) int {
	i := 0
	for ; i < len(s) && w > 0; i++ {
		w--
		if b := s[i]; b >= 0xE3 && b <= 0xED {
			w--
		}
	}
	if w < 0 {
		i-- // the character that began there is over w
	}
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
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
// context.compact_at (by weight, at bytesPerToken), shared so that a small
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

// shareOut cuts the results of one step so that together they weigh at
// most room (see weight): the lightest first, each given at most an equal
// share of what the ones before left.
func shareOut(results []model.Message, room int) {
	weights := make([]int, len(results))
	total := 0
	for i, m := range results {
		weights[i] = weight(m.Content)
		total += weights[i]
	}
	if total <= room {
		return
	}
	order := make([]int, len(results))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return weights[order[a]] < weights[order[b]] })
	left := room
	for k, i := range order {
		share := left / (len(order) - k)
		n := weights[i]
		if n > share {
			results[i].Content = cutResult(results[i].Content, share)
			n = share
		}
		left -= n
	}
}

// cutResult keeps the first w of a tool result's weight (whole characters
// only) and says so to the model, in bytes. timebox's own notes at its end — the
// output truncated, the time the call took — are kept after the cut: the
// model is told each result's duration, cut or not.
func cutResult(s string, w int) string {
	body, notes := s, ""
	for _, note := range []string{"\n[output truncated", "\n[timebox: took "} {
		if i := strings.LastIndex(body, note); i >= 0 && len(s)-i < 512 {
			body, notes = s[:i], s[i:]
			break
		}
	}
	n := weightCut(body, w)
	return body[:n] + fmt.Sprintf("\n[output cut: only the first %d of its %d bytes are sent to the model, to keep the conversation within context.compact_at; ask for a narrower result if more is needed]", n, len(body)) + notes
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

// compactDue reports whether older history must be summarised before the
// next model step: the estimated prompt passes context.compact_at (spec
// §6), no failed or insufficient compaction asked to wait for more growth,
// and something older than the current exchange is left to summarise.
func (t *turn) compactDue() bool {
	limit := t.a.compactAt
	if limit <= 0 {
		return false
	}
	before := estimateTokens(t.request())
	if before <= limit || before < t.s.RetryAt {
		return false
	}
	return compactionCut(t.conversation(), t.s.CompactedUpTo) != 0
}

// compactUnit is the Compact unit: the compaction a model step waits for,
// or, with force, the one a refusal of the step as too long asks for —
// after which the step is asked again when something was summarised, and
// the turn stops with compaction_failed when nothing could be. A turn
// stopped meanwhile is left for Drive to end (machine.Driver.Check).
func (t *turn) compactUnit(ctx context.Context, u machine.Unit) {
	s := t.s
	shrunk, stopped := t.compact(ctx, u.Step, u.Force)
	if stopped {
		return
	}
	if !u.Force {
		s.CompactDue, s.CompactedFor = false, s.Steps+1
		return
	}
	if !shrunk {
		s.End = &machine.Ending{Reason: budget.CompactionFailed, Cause: s.TooLong}
	}
	s.TooLong = nil
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
// history was summarised; stopped, that the turn itself was stopped during
// the compaction.
func (t *turn) compact(ctx context.Context, step int, force bool) (shrunk, stopped bool) {
	s := t.s
	limit := t.a.compactAt
	if limit <= 0 {
		return false, false
	}
	before := estimateTokens(t.request())
	if (before <= limit && !force) || before < s.RetryAt {
		return false, false
	}
	all := t.conversation()
	cut := compactionCut(all, s.CompactedUpTo)
	if cut == 0 {
		return false, false // only the current exchange is left; nothing to summarise
	}
	b := s.Budgets
	ep := t.a.models[0]
	// Attempts of the step's compactions are numbered on from those made
	// before, lost ones included (a Temporal worker lost mid-compaction).
	s.CompactAttempts++
	attempt := s.CompactAttempts
	// Its span is begun before its start is told, as an attempt's is: the
	// start carries its ids, those its model request is sent, for whoever
	// records it lost or ends the turn while it runs to make it with.
	t.em.Emit(&event.CompactionStarted{Step: step, Attempt: attempt, EstimatedTokens: before, CompactAt: limit, LimitMS: b.Compaction.MS(),
		Model: ep.Model, Provider: ep.ProviderName, Traceparent: t.spans.beginCompaction(step, attempt, ep.Model, ep.ProviderName, time.Now())})
	act := &activity{step: step, subject: compactionSubject(ep.Model), compaction: true}
	t.live.begin(act)

	older := t.sendable(all[s.CompactedUpTo:cut])
	text := transcript(older)
	if s.Summarised {
		text = "[summary of what came before]\n" + t.tr.Summary() + "\n\n" + text
	}
	req := model.Request{Model: ep.Model, System: compactionInstructions, Conversation: t.conversationID(),
		Messages: []model.Message{{Role: model.RoleUser, Content: text}}, Compaction: true,
		TraceParent: t.spans.compactionParent()}

	mc := modelCall{step: step, attempt: attempt, ep: ep, req: req,
		chunk: func(_ *model.Watched, c model.Chunk) string {
			t.live.progress(act)
			return c.Text
		}}
	if !b.Compaction.Off() {
		mc.within = b.Compaction.D
		mc.expired = func() error {
			return b.Compaction.Expired(budget.PhaseCompaction, "history compaction", b.Compaction.D)
		}
	}
	out := t.callModel(ctx, mc)
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
		fin.Message, fin.Record = "the turn was stopped during compaction", &rec
		t.em.Emit(fin)
		return false, true
	}
	growth := max(limit/retryGrowth, 1)
	if err != nil {
		s.RetryAt = before + growth
		if te, ok := budget.AsTimeout(err); ok && te.Phase == budget.PhaseCompaction {
			s.CompactionTimeout = true
			fin.Message = fmt.Sprintf("Compaction did not finish within %s (%s); going on with the full history.", budget.FormatDuration(te.Limit), te.Knob)
		} else {
			fin.Message = fmt.Sprintf("Compaction failed (%v); going on with the full history.", err)
		}
		fin.Message += fmt.Sprintf(" It is not tried again before the conversation grows to about %d tokens.", s.RetryAt)
		s.CompactionFailed = machine.CauseOf(err)
	} else {
		t.tr.SetSummary(strings.TrimSpace(out.resp.Text))
		s.Summarised, s.SummarisedHere = true, true
		s.CompactedUpTo = cut
		s.CompactionFailed, s.Insufficient = nil, false
		shrunk = true
		after := estimateTokens(t.request())
		fin.TokensAfter, s.RetryAt = after, 0
		if after > limit {
			s.Insufficient = true
			s.RetryAt = after + growth
			rec.Outcome, fin.Outcome = event.OutcomeInsufficient, event.OutcomeInsufficient
			rec.Error = fmt.Sprintf("still about %d tokens after compaction, over context.compact_at (%d)", after, limit)
			fin.Message = fmt.Sprintf("Compaction left about %d tokens, still over context.compact_at (%d): what cannot be summarised yet (the instructions, the tool definitions and the latest step) is too large. "+
				"Going on; it is not tried again before the conversation grows to about %d tokens.", after, limit, s.RetryAt)
		}
	}
	t.addModelRecord(rec)
	fin.Record = &rec
	t.em.Emit(fin)
	return shrunk, false
}

// tooLong reports whether a stop of a model step is the provider's refusal
// of the conversation as too long for the model (model.Error.TooLong) that
// a compaction may cure: compaction is on. The turn then compacts (forced)
// and asks the step again; it stops with compaction_failed when nothing
// could be summarised (compactUnit). Each forced compaction summarises
// messages no earlier one did, and a refusal adds none, so this cannot
// repeat without new messages.
func (t *turn) tooLong(st *stop) bool {
	var me *model.Error
	return st.reason == budget.ModelRejected && errors.As(st.cause, &me) && me.TooLong && t.a.compactAt > 0
}

// compactionFailedMessage is the closing message of a turn whose history
// could not fit: what the provider said, why compaction did not help, and
// the two knobs that change it.
func (t *turn) compactionFailedMessage(cause error, wall time.Duration) string {
	compactionFailed := t.s.CompactionFailed.Err()
	var me *model.Error
	why := "the provider refused it as too long"
	if errors.As(cause, &me) {
		why = fmt.Sprintf("%s refused it as too long for model %s (HTTP %d: %s)", me.Provider, t.s.LastModel, me.Status, me.Message)
	}
	var help string
	te, timedOut := budget.AsTimeout(compactionFailed)
	switch {
	case timedOut && te.Phase == budget.PhaseCompaction:
		help = fmt.Sprintf(" History compaction had timed out after %s (%s), so the full history was sent; raise %s.", budget.FormatDuration(te.Limit), te.Knob, te.Knob)
	case compactionFailed != nil:
		var cme *model.Error
		reason := compactionFailed.Error()
		if errors.As(compactionFailed, &cme) {
			reason = cme.Message
		}
		help = fmt.Sprintf(" History compaction had failed (%s), so it could not be shortened.", reason)
	case t.s.Insufficient:
		help = " Compaction could not bring it under context.compact_at: what cannot be summarised (the instructions, the tool definitions and the latest step) is too large."
	case t.s.Summarised:
		help = " Older history was summarised, and what cannot be (the instructions, the tool definitions and the latest step) is still too long."
	default:
		help = " Nothing older than the latest step was left to summarise."
	}
	l := t.s.Limits.MaxToolOutput
	return fmt.Sprintf("Stopped after %s: the conversation (about %d tokens by timebox's estimate) does not fit; %s.%s "+
		"Lower context.compact_at (now %d) so that older history is summarised before the model's limit, or make tool results smaller "+
		"(%s, now %s, or narrower requests); a new session starts with an empty history.",
		budget.RoundHuman(wall), estimateTokens(t.request()), why, help, t.a.compactAt, l.Knob, budget.FormatBytes(l.N))
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
	compactionFailed := t.s.CompactionFailed.Err()
	if compactionFailed == nil {
		return ""
	}
	if te, ok := budget.AsTimeout(compactionFailed); ok && te.Phase == budget.PhaseCompaction {
		return fmt.Sprintf(" History compaction had timed out after %s (%s), so the full history was sent; raise %s or lower context.compact_at.", budget.FormatDuration(te.Limit), te.Knob, te.Knob)
	}
	var me *model.Error
	if errors.As(compactionFailed, &me) {
		return fmt.Sprintf(" History compaction had failed (%s), so the full history was sent.", me.Message)
	}
	return " History compaction had failed, so the full history was sent."
}
