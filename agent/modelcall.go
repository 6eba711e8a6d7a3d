package agent

import (
	"context"
	"io"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// modelCall is one model call as the turn makes it: a step's attempt or a
// compaction. Both go through callModel, so that the watchdogs, the
// record and what counts as the reply are the same for both.
type modelCall struct {
	step, attempt int
	ep            model.Endpoint
	req           model.Request
	// within, when expired is set, ends the call after that long with the
	// cause expired returns (the rest of llm_budget, the compaction
	// budget); at once when it is not positive.
	within  time.Duration
	expired func() error
	// chunk takes each chunk as it arrives and returns the text to keep
	// (it may take more that is already waiting, from w.Ready). It reports
	// the chunk as progress.
	chunk func(w *model.Watched, c model.Chunk) string
}

// modelCalled is how a model call went.
type modelCalled struct {
	// resp is the reply, its Text the streamed text when the provider gave
	// none of its own; zero unless the stream ended normally.
	resp model.Response
	// text is everything streamed, also when the call failed.
	text    string
	err     error
	elapsed time.Duration
	// rec is the call's record, ok; the caller fails it (failed) and
	// appends it (addModelRecord) once it has judged the reply.
	rec event.ModelCall
}

// collectAt is the length from which a reply is collected as it streams,
// and joined between two garbage collections (issue 29,
// docs/decisions/long-texts.md). While a long reply streams, its chunks are
// live and its parsing leaves garbage five times their size; the heap
// grows to twice what is live between collections. Joining it then holds
// it twice, and the joined reply, one large block, cannot reuse the pages
// the garbage left between the chunks: it took fresh ones on top. So from
// collectAt on, a collection every collectEvery of reply keeps the heap
// near what is live; before the join, debug.FreeOSMemory collects and
// gives the free pages back, so that the joined reply's fresh pages
// replace them rather than add to them; after it (attempt), a collection
// frees the chunks the joined reply replaces. A handful of collections for
// a reply of megabytes, which took seconds to stream, cost milliseconds.
const collectAt = 4 << 20

// collectEvery is how much reply streams between two collections once a
// reply is collectAt long.
const collectEvery = 2 << 20

// callModel opens the call under the turn's watchdogs and reads it to its
// end.
func (t *turn) callModel(ctx context.Context, mc modelCall) modelCalled {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if mc.expired != nil {
		timer := time.AfterFunc(max(mc.within, 0), func() { cancel(mc.expired()) })
		defer timer.Stop()
	}
	w := model.Open(callCtx, mc.ep.Provider, mc.req, t.watchdog(), "model "+mc.ep.Model)
	// The text as chunk returned it, joined only when the provider's reply
	// is not already the same text: a builder beside the provider's own
	// held up to 2.25 more copies of a long reply (issue 29). A provider
	// that heeds Request.TextKept keeps none of its own: the reply's text
	// is this one.
	var text model.Text
	var err error
	next := collectAt
	for {
		var c model.Chunk
		if c, err = w.Recv(); err != nil {
			break
		}
		text.Add(mc.chunk(w, c))
		if text.Len() >= next {
			runtime.GC() // see collectAt
			next = text.Len() + collectEvery
		}
	}
	w.Close()
	out := modelCalled{elapsed: time.Since(w.Started())}
	if err == io.EOF {
		err = nil
		out.resp = w.Response()
	}
	switch {
	case out.resp.Text != "" && len(out.resp.Text) == text.Len():
		// The provider's text is what streamed (the pieces add up to it):
		// one copy.
		out.text = out.resp.Text
	default:
		if text.Len() >= collectAt {
			debug.FreeOSMemory() // see collectAt
		}
		out.text = text.String()
		if err == nil && out.resp.Text == "" {
			out.resp.Text = out.text
		}
	}
	out.err = err
	out.rec = event.ModelCall{Step: mc.step, Model: mc.ep.Model, Provider: mc.ep.ProviderName, Profile: mc.ep.Profile,
		Attempt: mc.attempt, StartedAt: w.Started(), FirstChunkMS: w.FirstChunk().Milliseconds(),
		StreamMS: out.elapsed.Milliseconds(), Outcome: event.OutcomeOK, Compaction: mc.req.Compaction,
		InputTokens: out.resp.Usage.InputTokens, OutputTokens: out.resp.Usage.OutputTokens}
	return out
}

// failed marks the record of a call that ended with err.
func failed(rec *event.ModelCall, err error) {
	if err != nil {
		rec.Outcome, rec.Phase, rec.Error = modelOutcome(err), model.Phase(err), err.Error()
	}
}

// addModelRecord appends a model call's record to the turn's.
func (t *turn) addModelRecord(rec event.ModelCall) {
	t.mu.Lock()
	t.modelRecs = append(t.modelRecs, rec)
	t.mu.Unlock()
}
