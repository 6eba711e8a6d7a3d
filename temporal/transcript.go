package temporal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// Payload keys of a turn (store.Payloads): what grows with its
// conversation lives in the store, and the workflow passes only the
// turn's State, whatever the conversation's size.
const (
	keyInput   = "input"   // input: the user's message (and, stored before issue 29, the session's history)
	keyHistory = "h/"      // h/<n>: message n of the session's history, from 0
	keyMessage = "m/"      // m/<n>: message n the turn added, from 0
	keySummary = "summary" // the compaction summary
	keyPartial = "partial" // what the last model attempt streamed
	keyDone    = "done/"   // done/<run>/<activity>: a unit's result, kept with its writes
	// turn-span: set by the worker that stores the turn's end before it
	// does, when it makes the turn's span (Units.TurnSpan): the runner
	// then leaves it to the worker.
	keyTurnSpan = "turn-span"
)

func messageKey(i int) string { return indexKey(keyMessage, i) }

func historyKey(i int) string { return indexKey(keyHistory, i) }

func indexKey(prefix string, i int) string {
	s := strconv.Itoa(i)
	if len(s) < 8 {
		s = "00000000"[len(s):] + s
	}
	return prefix + s
}

// input is the turn's input as the runner stores it. HistoryLen counts
// the history's messages, kept a message a key (keyHistory): only that
// many are read, whatever else a put that failed half-way left there.
// History is read from the input of a turn a runner stored before the
// history was kept so.
type input struct {
	Text       string          `json:"text"`
	HistoryLen int             `json:"history_len,omitempty"`
	History    []model.Message `json:"history,omitempty"`
}

// putInput stores a turn's input, its session's history and its first
// message, the user's: what a runner stores before it starts the turn's
// workflow. The history is a message a key, so that a unit reads it one
// message at a time: in one value, a worker read a session of 50 MB into
// one buffer of its size before decoding it (issue 29).
func putInput(ctx context.Context, p store.Payloads, turnID, text string, history []model.Message) error {
	in, err := json.Marshal(input{Text: text, HistoryLen: len(history)})
	if err != nil {
		return err
	}
	first, err := json.Marshal(model.Message{Role: model.RoleUser, Content: text})
	if err != nil {
		return err
	}
	// The history goes first, in puts of about maxPut bytes: one put
	// holds its values and the database's write buffer of them.
	vals, size := map[string][]byte{}, 0
	for i, m := range history {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		if size > 0 && size+len(b) > maxPut {
			if err := p.PutPayloads(ctx, turnID, vals); err != nil {
				return err
			}
			vals, size = map[string][]byte{}, 0
		}
		vals[historyKey(i)], size = b, size+len(b)
	}
	vals[keyInput], vals[messageKey(0)] = in, first
	return p.PutPayloads(ctx, turnID, vals)
}

// maxPut is about the most a runner puts at once of a session's history.
const maxPut = 4 << 20

// transcript is a turn's machine.Transcript in the store, read when a unit
// begins (what the unit needs) and written when it ends, in one
// transaction with the unit's result (flush), so that a unit whose report
// to Temporal is lost keeps what it did.
type transcript struct {
	turnID string
	p      store.Payloads
	// records is set where the turn may end (loadTranscript): Records
	// reads the call records from the store.
	records bool

	in      input
	summary string
	partial string
	// msgs are the turn's messages read (all of them, or only those a
	// call needs) and written; n counts those read in order from 0.
	msgs map[int]model.Message
	n    int
	// ctx reads the call records from the store when Records is called.
	ctx context.Context

	mu      sync.Mutex // Put by the calls of a batch
	pending map[string][]byte
	// err is the first error of a read the transcript's interface cannot
	// return (Records): flush returns it.
	err error
}

// loadTranscript reads what a model step and the end of a turn need: the input,
// the messages, the summary and the partial answer.
func loadTranscript(ctx context.Context, p store.Payloads, s *machine.State) (*transcript, error) {
	t := &transcript{turnID: s.TurnID, p: p, records: true, ctx: ctx, msgs: map[int]model.Message{}, pending: map[string][]byte{}}
	// The input, with the session's history, and each message are decoded
	// as they are read: the conversation is held once, not also as stored.
	if err := p.Payload(ctx, s.TurnID, keyInput, func(data []byte) error { return json.Unmarshal(data, &t.in) }); err != nil {
		return nil, fmt.Errorf("reading the input of turn %s: %w", s.TurnID, err)
	}
	errEnough := errors.New("enough")
	if n := t.in.HistoryLen; n > 0 {
		t.in.History = make([]model.Message, 0, n)
		err := p.PayloadRange(ctx, s.TurnID, keyHistory, func(_ string, data []byte) error {
			if len(t.in.History) == n {
				return errEnough
			}
			var m model.Message
			if err := json.Unmarshal(data, &m); err != nil {
				return err
			}
			t.in.History = append(t.in.History, m)
			return nil
		})
		if err != nil && !errors.Is(err, errEnough) {
			return nil, fmt.Errorf("reading the history of turn %s: %w", s.TurnID, err)
		}
		if len(t.in.History) < n {
			return nil, fmt.Errorf("turn %s has %d of its %d history messages in the store", s.TurnID, len(t.in.History), n)
		}
	}
	err := p.PayloadRange(ctx, s.TurnID, keyMessage, func(_ string, data []byte) error {
		i := t.n
		if i >= s.Messages {
			return errEnough // written by a unit whose report was lost, and asked again
		}
		var m model.Message
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("reading message %d of turn %s: %w", i, s.TurnID, err)
		}
		t.msgs[i] = m
		t.n = i + 1
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, fmt.Errorf("reading the messages of turn %s: %w", s.TurnID, err)
	}
	if t.n < s.Messages {
		return nil, fmt.Errorf("turn %s has %d of its %d messages in the store", s.TurnID, t.n, s.Messages)
	}
	if s.Summarised {
		if err := p.Payload(ctx, s.TurnID, keySummary, func(data []byte) error { t.summary = string(data); return nil }); err != nil {
			return nil, fmt.Errorf("reading the summary of turn %s: %w", s.TurnID, err)
		}
	}
	switch err := p.Payload(ctx, s.TurnID, keyPartial, func(data []byte) error { t.partial = string(data); return nil }); {
	case err == nil:
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("reading the partial answer of turn %s: %w", s.TurnID, err)
	}
	return t, nil
}

// loadCall reads what a tool call needs: the step's assistant message,
// the State's last.
func loadCall(ctx context.Context, p store.Payloads, s *machine.State) (*transcript, error) {
	t := &transcript{turnID: s.TurnID, p: p, msgs: map[int]model.Message{}, pending: map[string][]byte{}}
	i := s.Messages - 1
	var m model.Message
	if err := p.Payload(ctx, s.TurnID, messageKey(i), func(data []byte) error { return json.Unmarshal(data, &m) }); err != nil {
		return nil, fmt.Errorf("reading message %d of turn %s: %w", i, s.TurnID, err)
	}
	t.msgs[i] = m
	return t, nil
}

// Input returns the user's message.
func (t *transcript) Input() string { return t.in.Text }

// History returns the session's conversation before the turn.
func (t *transcript) History() []model.Message { return t.in.History }

// Summary returns the compaction summary.
func (t *transcript) Summary() string { return t.summary }

// Partial returns what the last model attempt streamed.
func (t *transcript) Partial() string { return t.partial }

// SetSummary sets the compaction summary, stored when the unit ends (flush).
func (t *transcript) SetSummary(s string) {
	t.summary = s
	t.put(keySummary, []byte(s))
}

// SetPartial sets what the last model attempt streamed, stored when the unit
// ends (flush).
func (t *transcript) SetPartial(s string) {
	t.partial = s
	t.put(keyPartial, []byte(s))
}

// Records reads the turn's call records from the store: every unit's,
// which each stored with the event that carried it before it went on.
// Their results are left out (store.Payloads.TurnWithoutResults): the
// end counts the calls, and leaves their records as stored (finish).
func (t *transcript) Records() ([]event.ToolCall, []event.ModelCall, bool) {
	if !t.records {
		return nil, nil, false
	}
	rec, err := t.p.TurnWithoutResults(t.ctx, t.turnID)
	if err != nil {
		t.err = fmt.Errorf("reading the records of turn %s: %w", t.turnID, err)
		return nil, nil, true
	}
	return rec.ToolCalls, rec.ModelCalls, true
}

// Messages returns the turn's messages read or put so far, in order from
// 0, up to the first missing one.
func (t *transcript) Messages() []model.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]model.Message, 0, len(t.msgs))
	for i := 0; ; i++ {
		m, ok := t.msgs[i]
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

// Message returns the i-th message of the turn, from 0, if read or put.
func (t *transcript) Message(i int) model.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.msgs[i]
}

// Put sets message i, stored when the unit ends (flush); the calls of a
// batch may put theirs at once.
func (t *transcript) Put(i int, m model.Message) {
	b, err := json.Marshal(m)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.msgs[i] = m
	if err == nil {
		t.pending[messageKey(i)] = b
	}
}

func (t *transcript) put(key string, b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending[key] = b
}

// flush writes what the unit wrote, and its result under done (its key,
// when not empty), in one transaction.
func (t *transcript) flush(ctx context.Context, done string, result any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return t.err
	}
	if done != "" {
		b, err := json.Marshal(result)
		if err != nil {
			return err
		}
		t.pending[done] = b
	}
	if len(t.pending) == 0 {
		return nil
	}
	if err := t.p.PutPayloads(ctx, t.turnID, t.pending); err != nil {
		return fmt.Errorf("storing the conversation of turn %s: %w", t.turnID, err)
	}
	clear(t.pending)
	return nil
}
