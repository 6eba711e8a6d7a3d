package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

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
// passes context.compact_at (spec §6). The call runs on the primary model
// under timeouts.compaction and never rotates credentials or falls back. If
// it fails the turn goes on with the uncompacted history — the provider
// decides whether that fits; if it refuses, the closing message says the
// compaction failed. It returns a stop only when the turn itself was
// stopped during the compaction.
func (t *turn) compact(ctx context.Context, step int) *stop {
	limit := t.a.compactAt
	if limit <= 0 {
		return nil
	}
	before := estimateTokens(t.request())
	if before <= limit {
		return nil
	}
	all := t.conversation()
	cut := compactionCut(all, t.compactedUpTo)
	if cut == 0 {
		return nil // only the current exchange is left; nothing to summarise
	}
	b := t.a.budgets
	ep := t.a.models[0]
	t.em.Emit(&event.CompactionStarted{Step: step, EstimatedTokens: before, CompactAt: limit, LimitMS: b.Compaction.MS()})
	act := &activity{step: step, subject: "compaction (model " + ep.Model + ")", compaction: true}
	t.live.begin(act)

	older := all[t.compactedUpTo:cut]
	text := transcript(older)
	if t.summary != "" {
		text = "[summary of what came before]\n" + t.summary + "\n\n" + text
	}
	req := model.Request{Model: ep.Model, System: compactionInstructions, Conversation: t.request().Conversation,
		Messages: []model.Message{{Role: model.RoleUser, Content: text}}}

	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := time.AfterFunc(b.Compaction.D, func() {
		cancel(&budget.TimeoutError{Phase: budget.PhaseCompaction, Limit: b.Compaction.D, Elapsed: b.Compaction.D,
			Source: b.Compaction.Source, Knob: b.Compaction.Knob, Subject: "history compaction"})
	})
	defer timer.Stop()
	w := model.Open(cctx, ep.Provider, req, model.Watchdog{FirstChunk: b.LLMFirstChunk, Idle: b.LLMIdle}, "model "+ep.Model)
	var sb strings.Builder
	var err error
	for {
		var c model.Chunk
		if c, err = w.Recv(); err != nil {
			break
		}
		t.live.progress()
		sb.WriteString(c.Text)
	}
	w.Close()
	elapsed := time.Since(w.Started())
	if err == io.EOF {
		err = nil
		if r := w.Response(); r.Text != "" {
			sb.Reset()
			sb.WriteString(r.Text)
		}
		if strings.TrimSpace(sb.String()) == "" {
			err = &model.Error{Provider: ep.ProviderName, Message: "the compaction reply was empty"}
		}
	}
	t.live.end(act, err == nil)

	rec := event.ModelCall{Step: step, Model: ep.Model, Provider: ep.ProviderName, Profile: ep.Profile, Attempt: 1,
		StartedAt: w.Started(), FirstChunkMS: w.FirstChunk().Milliseconds(), StreamMS: elapsed.Milliseconds(),
		Outcome: event.OutcomeOK, Compaction: true}
	fin := &event.CompactionFinished{Step: step, Outcome: event.OutcomeOK, DurationMS: elapsed.Milliseconds(), TokensBefore: before}
	if err != nil {
		rec.Outcome, rec.Phase, rec.Error = modelOutcome(err), model.Phase(err), err.Error()
		fin.Outcome, fin.Phase = rec.Outcome, rec.Phase
		fin.TokensAfter = before
	}
	if ctx.Err() != nil { // the turn itself was stopped during the compaction
		t.mu.Lock()
		t.modelRecs = append(t.modelRecs, rec)
		t.mu.Unlock()
		fin.Message = "the turn was stopped during compaction"
		t.em.Emit(fin)
		st := t.stopFromContext(ctx)
		return &st
	}
	if err != nil {
		if te, ok := budget.AsTimeout(err); ok && te.Phase == budget.PhaseCompaction {
			t.compactionTimeout = true
			fin.Message = fmt.Sprintf("Compaction did not finish within %s (%s); going on with the full history.", te.Limit, te.Knob)
		} else {
			fin.Message = fmt.Sprintf("Compaction failed (%v); going on with the full history.", err)
		}
		t.compactionFailed = err
	} else {
		t.summary = strings.TrimSpace(sb.String())
		t.compactedUpTo = cut
		fin.TokensAfter = estimateTokens(t.request())
	}
	t.mu.Lock()
	t.modelRecs = append(t.modelRecs, rec)
	t.mu.Unlock()
	t.em.Emit(fin)
	return nil
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
