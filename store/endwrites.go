package store

import (
	"bytes"
	"slices"

	"github.com/timebox-run/timebox/event"
)

// EndWrites is what a turn's end must write of its log and its call
// records, beyond what the queue stored as the turn ran (EndOf).
//
// The queue stores each call record in the transaction of the event that
// carries it (CallRecords). A turn's end used to write every record again:
// 10,000 upserts for a reply of 10,000 calls, a quarter of the CPU of
// `timebox run` on SQLite, although as a rule none had changed
// (docs/decisions/end-writes-what-changed.md).
type EndWrites struct {
	// Events are those of the turn's log the store does not hold: as a
	// rule none.
	Events []event.Event
	// ToolCalls are the tool call records to write. When Events is not
	// empty, all of them: a call's longest silence is measured from its
	// stored progress events, which may be among Events. Otherwise those
	// that no event carried as they are now: as a rule none, or a call
	// whose result came late, after its tool_finished.
	ToolCalls []event.ToolCall
	// ModelCalls says whether the model call records are written again,
	// all of them, since each is stored at the next index of its turn:
	// unless the events carried them all, unchanged and in their order.
	ModelCalls bool
}

// EndStoresLog reports whether the end of rec (FinishTurn) stores every
// event of the turn's log that the store lacks, those a full disk refused
// as the turn ran among them (EndOf): when rec carries its log. A sink
// that counted refused event writes may take them as made good once such
// an end is stored (Recorder.MadeGood, serve's log).
func EndStoresLog(rec *event.Turn) bool { return len(rec.Events) > 0 }

// EndOf returns what the end of rec must write, given the seqs of the
// turn's events the store holds, in ascending order. The stores (SQLite,
// PostgreSQL, Memory) use it in FinishTurn.
func EndOf(rec *event.Turn, stored []int64) EndWrites {
	var w EndWrites
	for _, e := range rec.Events {
		if _, ok := slices.BinarySearch(stored, e.Seq); !ok {
			w.Events = append(w.Events, e)
		}
	}
	if len(w.Events) > 0 {
		w.ToolCalls, w.ModelCalls = rec.ToolCalls, true
		return w
	}
	tools := make(map[string]*event.ToolCall, len(rec.ToolCalls))
	var models []*event.ModelCall
	for _, e := range rec.Events {
		tc, mc := carried(e)
		if tc != nil {
			tools[tc.CallID] = tc // the last one is the one stored
		}
		if mc != nil {
			models = append(models, mc)
		}
	}
	for _, tc := range rec.ToolCalls {
		if c, ok := tools[tc.CallID]; !ok || !sameToolCall(c, &tc) {
			w.ToolCalls = append(w.ToolCalls, tc)
		}
	}
	w.ModelCalls = !slices.EqualFunc(models, rec.ModelCalls, func(a *event.ModelCall, b event.ModelCall) bool { return *a == b })
	return w
}

// sameToolCall reports whether a and b are the same record, TurnID aside
// (an event's record is stored under its event's turn, which is the
// record's). A field added to event.ToolCall must be added here;
// TestSameToolCallSeesEveryField fails until it is.
func sameToolCall(a, b *event.ToolCall) bool {
	return a.CallID == b.CallID && a.Step == b.Step && a.Tool == b.Tool && a.Kind == b.Kind &&
		bytes.Equal(a.Arguments, b.Arguments) && (a.Arguments == nil) == (b.Arguments == nil) &&
		a.StartedAt == b.StartedAt && a.EndedAt == b.EndedAt && a.DurationMS == b.DurationMS &&
		a.TimeoutMS == b.TimeoutMS && a.TimeoutSource == b.TimeoutSource && a.IdleTimeoutMS == b.IdleTimeoutMS &&
		a.Enforcement == b.Enforcement && a.Outcome == b.Outcome && a.Refused == b.Refused && a.Phase == b.Phase &&
		a.Overran == b.Overran && a.Abandoned == b.Abandoned && a.LateResult == b.LateResult &&
		a.ProgressCount == b.ProgressCount && a.Runs == b.Runs && a.FirstStartedAt == b.FirstStartedAt && samePtr(a.ExitCode, b.ExitCode) && a.StderrTail == b.StderrTail &&
		a.Result == b.Result && a.Truncated == b.Truncated && a.LateOutput == b.LateOutput &&
		a.ServerRestarted == b.ServerRestarted && a.NoticedAt == b.NoticedAt && a.ApprovalMS == b.ApprovalMS &&
		samePtr(a.Approval, b.Approval)
}

func samePtr[T comparable](a, b *T) bool { return a == b || a != nil && b != nil && *a == *b }
