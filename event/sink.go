package event

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Sink receives a turn's events in seq order. Emit is called synchronously
// from the turn, one event at a time, so it must be quick; a sink that does
// slow work buffers it. A sink must not keep the Data pointer's fields
// beyond Emit unless it treats them as read-only.
type Sink interface {
	Emit(Event)
}

// LateSink is a Sink that also takes the record of an abandoned tool call
// that returned after its turn ended (late_result: true): the turn's events
// are closed by then, so the record comes on its own, once, from the
// call's goroutine. A sink that stores turns updates the stored record with
// it. A late result that arrives while the turn runs is a late_result
// event instead.
type LateSink interface {
	Sink
	LateResult(ToolCall)
}

// Disowner is a Sink that may stop taking a unit of work's account of its
// calls: an engine that gave the unit up (Temporal no longer has it, and
// another worker records its calls lost), or whose turn another process
// ended in the store meanwhile (recording its calls interrupted, and
// making their spans). While Disowned reports true, the
// unit's other sinks that mark a call's end — its trace span — leave it
// unsaid, as a process that died would.
type Disowner interface {
	Sink
	Disowned() bool
}

// ReportSink is a Sink that is also told of every progress report of a
// tool call, before tool_progress events are coalesced: a Temporal unit's
// heartbeat counts them, so that a call lost with its worker still has
// its progress_count. Reported is called on the reporting goroutine, and
// must be quick and never block.
type ReportSink interface {
	Sink
	Reported(callID string)
}

// SinkFunc adapts a function to a Sink.
type SinkFunc func(Event)

// Emit calls f(e).
func (f SinkFunc) Emit(e Event) { f(e) }

// Emitter stamps a turn's events with seq and time and delivers them to its
// sinks in seq order. It is safe for concurrent use: tool calls of one batch
// report progress from their own goroutines.
type Emitter struct {
	turnID string
	now    func() time.Time

	mu     sync.Mutex
	seq    int64
	sinks  []Sink
	log    []Event
	closed bool
}

// NewEmitter returns an emitter for the turn that delivers to sinks; a nil
// one (a nil Sink, a nil SinkFunc) is skipped. It keeps every event it
// emits for the turn record (Log).
func NewEmitter(turnID string, sinks ...Sink) *Emitter {
	return &Emitter{turnID: turnID, now: time.Now, sinks: present(sinks)}
}

// NewEmitterAfter returns an emitter for a turn that emitted seq events
// before (a turn resumed after a restart): its next event is seq+1. Its
// Log holds only what it emits.
func NewEmitterAfter(turnID string, seq int64, sinks ...Sink) *Emitter {
	return &Emitter{turnID: turnID, now: time.Now, sinks: present(sinks), seq: seq}
}

// present returns sinks without the nil ones: `var s event.Sink; if
// verbose { s = … }; a.Run(ctx, in, s)` gives a nil one.
func present(sinks []Sink) []Sink {
	out := sinks[:0:0]
	for _, s := range sinks {
		if f, ok := s.(SinkFunc); s == nil || ok && f == nil {
			continue
		}
		out = append(out, s)
	}
	return out
}

// Seq returns the seq of the last event emitted.
func (m *Emitter) Seq() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// Emit sends the payload v as the turn's next event and returns it. After
// Close, Emit drops v and returns the zero Event.
func (m *Emitter) Emit(v Payload) Event {
	t := v.Type()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Event{}
	}
	m.seq++
	e := Event{Seq: m.seq, TurnID: m.turnID, Type: t, At: m.now().UTC(), Data: v}
	m.log = append(m.log, e)
	for _, s := range m.sinks {
		s.Emit(e)
	}
	return e
}

// ShareReply makes the log's llm_delta events of step, from seq after on,
// pieces of reply — the text they add up to, joined once the reply ended —
// instead of their own strings: a long reply is then held once, not once
// more by the turn's record (issue 29). Each event keeps its text byte for
// byte. It stops at the first delta that is not the reply's next piece.
// The sinks keep what they were given, but a ReplySharer is given the new
// deltas to keep instead.
func (m *Emitter) ShareReply(after int64, step int, reply string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return // the log may be the record's now
	}
	i, _ := slices.BinarySearchFunc(m.log, after+1, func(e Event, seq int64) int { return cmp.Compare(e.Seq, seq) })
	var shared []Event
	off := 0
	for ; i < len(m.log); i++ {
		d, ok := m.log[i].Data.(*LLMDelta)
		if !ok || d.Step != step {
			continue
		}
		end := off + len(d.Text)
		if end > len(reply) || reply[off:end] != d.Text {
			break
		}
		m.log[i].Data = &LLMDelta{Step: d.Step, Text: reply[off:end]}
		shared = append(shared, m.log[i])
		off = end
	}
	if len(shared) == 0 {
		return
	}
	for _, s := range m.sinks {
		if rs, ok := s.(ReplySharer); ok {
			rs.ShareReply(shared)
		}
	}
}

// ReplySharer is a Sink that keeps the events it is given — an in-memory
// store — and can let a long reply's chunks go: once the reply is joined,
// ShareReply gives it the turn's llm_delta events again, of the same seq
// and text, as pieces of the joined reply, to keep in place of those it
// has (Emitter.ShareReply).
type ReplySharer interface {
	ShareReply(deltas []Event)
}

// Close stops delivery: later Emit calls are dropped. The turn closes its
// emitter after turn_finished so that a straggler (a late progress report,
// an abandoned call returning) cannot emit after the end.
func (m *Emitter) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// Log returns the events emitted so far: a copy while the emitter is
// open; after Close, which ends the log, the log itself (capped at its
// length, so that appending to it copies).
func (m *Emitter) Log() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return m.log[:len(m.log):len(m.log)]
	}
	return append([]Event(nil), m.log...)
}

// Channel is a Sink that sends events on a channel, for a library caller
// that wants them that way. Emit blocks while the channel is full, which
// holds the turn's other emitters back, so give it a buffer and read it
// promptly.
type Channel chan Event

// Emit sends e on the channel.
func (c Channel) Emit(e Event) { c <- e }
