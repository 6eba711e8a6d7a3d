package agent

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
)

// stop is how a model step ended the turn.
type stop struct {
	reason budget.StopReason
	cause  error
	// message follows the stop's own sentence in the closing message.
	message string
	// notes are the failed attempts of the step, when every link of the
	// chain failed.
	notes []attemptNote
	// outside: the turn was stopped from outside the step (its ceiling, the
	// step watchdog, a cancellation), which machine.Driver.Check notes.
	outside bool
}

// thinkUnit is the Think unit. It first notes whether the conversation must
// be compacted before the step (then the Compact unit runs and this unit
// again, which considers compaction once a step); otherwise it makes the
// model step u.Step with its failover, and notes in the state how it went:
// the tool calls asked for (the batch), an answer, a refusal of the
// conversation as too long that compaction may cure, or how the turn ends.
func (t *turn) thinkUnit(ctx context.Context, u machine.Unit) {
	s := t.s
	if s.CompactedFor != u.Step && t.compactDue() {
		s.CompactDue = true
		return
	}
	s.Steps = u.Step
	s.CompactAttempts = 0 // they were the compactions before this step
	resp, st := t.modelStep(ctx, u.Step)
	s.Attempts = 0
	switch {
	case st == nil:
	case st.outside:
		return
	case t.tooLong(st):
		s.TooLong = machine.CauseOf(st.cause)
		return
	default:
		s.End = st.ending()
		return
	}
	t.tr.Put(s.Messages, model.Message{Role: model.RoleAssistant, Content: resp.Text, ToolCalls: resp.ToolCalls})
	s.Messages++
	if len(resp.ToolCalls) == 0 {
		s.End = &machine.Ending{Reason: budget.Answered}
		return
	}
	s.Batch = make([]machine.Call, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		s.Batch[i] = machine.Call{Index: i, Name: c.Name}
	}
}

// ending returns how the turn ends for st.
func (st *stop) ending() *machine.Ending {
	e := &machine.Ending{Reason: st.reason, Cause: machine.CauseOf(st.cause), Message: machine.Cut(st.message)}
	if allEmpty(st.notes) {
		e.Empty = len(st.notes)
		for _, n := range st.notes {
			var ee *model.EmptyReplyError
			if errors.As(n.err, &ee) && ee.OutOfTokens() {
				e.OutOfTokens = true
			}
		}
	}
	return e
}

// attemptNote is one failed model call attempt, for messages.
type attemptNote struct {
	endpoint string
	profile  string
	err      error
	index    int       // the endpoint's place in the chain
	at       time.Time // when it failed
}

// modelStep makes one model call, failing over along the chain on LLM-phase
// failures (spec §6). When every link has failed and one of them was rate
// limited with a Retry-After that ends inside the turn's remaining time,
// that link is tried once more after waiting it out.
func (t *turn) modelStep(ctx context.Context, step int) (model.Response, *stop) {
	req := t.request()
	var notes []attemptNote
	tries := make([]int, len(t.a.models))
	for i := range tries {
		tries[i] = i
	}
	retried, askedAgain := false, false
	for k := 0; k < len(tries); k++ {
		i := tries[k]
		ep := t.a.models[i]
		req.Model = ep.Model
		if t.a.timeNotes && k > 0 {
			// The time a failed attempt, or a Retry-After, took is gone:
			// the note says what is left now.
			req.TimeNote = t.timeNote(time.Now())
		}
		resp, err := t.attempt(ctx, step, t.s.Attempts+k+1, ep, req)
		if err == nil {
			t.s.IdleStreak = 0
			return resp, nil
		}
		if ctx.Err() != nil {
			return model.Response{}, &stop{outside: true}
		}
		phase := model.Phase(err)
		if phase == budget.PhaseLLMBudget {
			return model.Response{}, &stop{reason: budget.LLMBudgetExhausted, cause: err}
		}
		if phase == budget.PhaseLLMReplyCap {
			// No failover: another model given the same prompt would most
			// likely write on as long (docs/decisions/reply-cap.md).
			return model.Response{}, &stop{reason: budget.ReplyTooLong, cause: err}
		}
		var me *model.Error
		if errors.As(err, &me) && me.Rejected() {
			// A credential refused moves on to the same model's next
			// credential; any other refusal, or the model's last
			// credential refused too, ends the turn.
			if !me.CredentialRefused() || k+1 == len(tries) || !sameModel(ep, t.a.models[tries[k+1]]) {
				return model.Response{}, &stop{reason: budget.ModelRejected, cause: err, message: credentialsRefused(notes, ep, me)}
			}
		}
		notes = append(notes, attemptNote{endpoint: ep.Name(), profile: ep.Profile, err: err, index: i, at: time.Now()})
		if phase == budget.PhaseLLMIdle || phase == budget.PhaseLLMFirstChunk {
			t.s.IdleStreak++
			if int64(t.s.IdleStreak) >= t.s.Limits.IdleBreaker.N {
				return model.Response{}, &stop{reason: budget.ModelUnresponsive, cause: err, message: notesText(notes)}
			}
		}
		// The failed attempt's time counts too: when it spent what was
		// left of llm_budget, no other link is asked (it would run with
		// nothing left to bound it).
		if b := t.s.Budgets.LLMBudget; !b.Off() && t.s.LLMUsed >= b.D {
			return model.Response{}, &stop{reason: budget.LLMBudgetExhausted,
				cause: b.Expired(budget.PhaseLLMBudget, "model streaming in this turn", t.s.LLMUsed)}
		}
		// An empty reply is asked again once, of the same endpoint, before
		// the chain moves on — unless the model spent its whole output
		// allowance, which asking again would only repeat
		// (docs/decisions/empty-reply.md).
		var ee *model.EmptyReplyError
		if errors.As(err, &ee) && !askedAgain && !ee.OutOfTokens() {
			askedAgain = true
			tries = slices.Insert(tries, k+1, i)
		}
		if k+1 == len(tries) && !retried {
			if n, wait, ok := t.retryCandidate(notes); ok {
				retried = true
				tries = append(tries, notes[n].index)
				next := t.a.models[notes[n].index]
				t.s.Failovers++
				t.em.Emit(&event.Failover{Step: step, From: endpointLabel(ep), To: endpointLabel(next), Phase: phase,
					Reason:  fmt.Sprintf("%v; every link failed, retrying %s after its Retry-After (%s)", err, endpointLabel(next), budget.RoundHuman(wait)),
					Attempt: t.s.Attempts + k + 2})
				if st := t.waitRetry(ctx, step, next, wait); st != nil {
					return model.Response{}, st
				}
				continue
			}
		}
		if k+1 < len(tries) {
			next := t.a.models[tries[k+1]]
			reason := err.Error()
			if tries[k+1] == i {
				reason += "; asking the same model once more"
			}
			t.s.Failovers++
			t.em.Emit(&event.Failover{Step: step, From: endpointLabel(ep), To: endpointLabel(next), Phase: phase,
				Reason: reason, Attempt: t.s.Attempts + k + 2})
		}
	}
	return model.Response{}, &stop{reason: budget.ModelUnavailable, cause: notes[len(notes)-1].err, message: notesText(notes), notes: notes}
}

// retryCandidate returns the failed attempt whose Retry-After ends first,
// and how long is left to wait for it, if that ends inside the turn's
// remaining time and inside the step window (so waiting it out is not
// mistaken for a stuck turn).
func (t *turn) retryCandidate(notes []attemptNote) (int, time.Duration, bool) {
	best, bestWait := -1, time.Duration(0)
	now := time.Now()
	for n, note := range notes {
		var me *model.Error
		if !errors.As(note.err, &me) || me.RetryAfter <= 0 {
			continue
		}
		wait := max(note.at.Add(me.RetryAfter).Sub(now), 0)
		if best < 0 || wait < bestWait {
			best, bestWait = n, wait
		}
	}
	if best < 0 {
		return 0, 0, false
	}
	remaining := t.s.Budgets.Turn.D - now.Sub(t.s.Start)
	if bestWait >= remaining {
		return 0, 0, false
	}
	if s := t.s.Budgets.Step; !s.Off() && bestWait >= s.D {
		return 0, 0, false
	}
	return best, bestWait, true
}

// waitRetry waits out a Retry-After. The wait is an activity with a
// deadline, so the step watchdog counts it as alive.
func (t *turn) waitRetry(ctx context.Context, step int, ep model.Endpoint, wait time.Duration) *stop {
	act := &activity{step: step, subject: modelSubject(ep.Model) + " (waiting out its Retry-After)", deadline: time.Now().Add(wait)}
	t.live.begin(act)
	defer t.live.end(act, false)
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return &stop{outside: true}
	}
}

func endpointLabel(ep model.Endpoint) string {
	if ep.Profile == "" {
		return ep.Name()
	}
	return ep.Name() + " (" + ep.Profile + ")"
}

// attempt makes one model call attempt under the watchdogs and the turn's
// llm_budget.
func (t *turn) attempt(ctx context.Context, step, attempt int, ep model.Endpoint, req model.Request) (model.Response, error) {
	b := t.s.Budgets
	// The attempt's span is begun before its start is told, so that the
	// start carries its ids, those the model server is sent: the worker
	// that records the attempt lost makes it again with them when this
	// one dies mid-attempt (LostAttempts).
	started := t.em.Emit(&event.LLMStarted{Step: step, Model: ep.Model, Provider: ep.ProviderName, Profile: ep.Profile, Attempt: attempt,
		Traceparent: t.spans.beginChat(step, attempt, ep.Model, ep.ProviderName, time.Now())})
	act := &activity{step: step, subject: modelSubject(ep.Model)}
	t.s.LastStep, t.s.LastModel = act.subject, ep.Model
	t.live.begin(act)

	req.TraceParent = t.spans.traceparent("")
	// callModel keeps what streamed and joins it: the provider need not
	// keep the text too (a long reply was held twice while it streamed).
	req.TextKept = true
	mc := modelCall{step: step, attempt: attempt, ep: ep, req: req}
	if !b.LLMBudget.Off() {
		remaining, used := b.LLMBudget.D-t.s.LLMUsed, t.s.LLMUsed
		mc.within = remaining
		mc.expired = func() error {
			return b.LLMBudget.Expired(budget.PhaseLLMBudget, "model streaming in this turn", used+remaining)
		}
	}
	var delta []byte
	mc.chunk = func(w *model.Watched, c model.Chunk) string {
		if w.FirstChunk() > 0 && !act.streaming {
			t.live.streaming(act)
		}
		t.live.progress(act)
		// Events go to the sinks synchronously. When they are slower than
		// the provider, what has arrived meanwhile goes as one llm_delta,
		// so that the number of events follows the sinks' pace, not the
		// provider's, and a flood of tiny chunks is not a flood of events.
		// A chunk that goes alone goes as it came: the provider keeps the
		// same string for its reply (model.Text), so a long reply is held
		// once, not once more for the events.
		d := c.Text
		var more model.Chunk
		ok := false
		if len(c.Text) < maxDelta {
			more, ok = w.Ready()
		}
		if ok {
			delta = append(append(delta[:0], c.Text...), more.Text...)
			for len(delta) < maxDelta {
				if more, ok = w.Ready(); !ok {
					break
				}
				delta = append(delta, more.Text...)
			}
			d = string(delta)
		}
		if d == "" {
			return ""
		}
		t.em.Emit(&event.LLMDelta{Step: step, Text: d})
		return d
	}
	out := t.callModel(ctx, mc)
	// The deltas' texts become pieces of the joined reply: the chunks
	// they were are let go (issue 29).
	t.em.ShareReply(started.Seq, step, out.text)
	if len(out.text) >= collectAt {
		runtime.GC() // the chunks the deltas were (collectAt)
	}
	t.s.LLMUsed += out.elapsed
	resp, err := out.resp, out.err
	if err == nil && resp.Empty() {
		err = &model.EmptyReplyError{Provider: ep.ProviderName, FinishReason: resp.FinishReason}
		resp = model.Response{}
	}
	t.tr.SetPartial(out.text)
	t.live.end(act, err == nil)

	rec := out.rec
	failed(&rec, err)
	t.addModelRecord(rec)
	t.em.Emit(&event.LLMFinished{ModelCall: rec, ToolCalls: len(resp.ToolCalls)})
	return resp, err
}

// maxDelta is the most text the turn gathers into one llm_delta from chunks
// that are already waiting; a single larger chunk still goes whole.
const maxDelta = 64 << 10

// watchdog returns the budgets every model stream of the turn runs under.
func (t *turn) watchdog() model.Watchdog {
	b := t.s.Budgets
	return model.Watchdog{FirstChunk: b.LLMFirstChunk, Idle: b.LLMIdle, MaxReply: t.s.Limits.MaxReply}
}

func modelOutcome(err error) event.Outcome {
	switch model.Phase(err) {
	case budget.PhaseLLMFirstChunk, budget.PhaseLLMIdle, budget.PhaseLLMBudget, budget.PhaseTurn, budget.PhaseStep, budget.PhaseCompaction:
		return event.OutcomeTimedOut
	case budget.PhaseCancel:
		return event.OutcomeCancelled
	}
	return event.OutcomeError
}

// sameModel reports whether b is a's model with another credential.
func sameModel(a, b model.Endpoint) bool {
	return a.ProviderName == b.ProviderName && a.Model == b.Model && a.Profile != b.Profile
}

// credentialsRefused says, for a refusal of ep's credential, that the credentials
// of its model before it were refused too; "" when none was.
func credentialsRefused(notes []attemptNote, ep model.Endpoint, me *model.Error) string {
	if !me.CredentialRefused() {
		return ""
	}
	var profiles []string
	for _, n := range notes {
		var nme *model.Error
		if n.endpoint == ep.Name() && errors.As(n.err, &nme) && nme.CredentialRefused() {
			profiles = append(profiles, n.profile)
		}
	}
	if len(profiles) == 0 {
		return ""
	}
	return fmt.Sprintf("each credential of %s was refused: %s", ep.Name(), strings.Join(append(profiles, ep.Profile), ", "))
}
