package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store/internal/watch"
)

// Memory is a Store that keeps everything in memory and loses it on exit,
// for tests and for programs that want the server without a database. The
// zero value is not usable; call NewMemory. It is safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	closed   bool
	turns    map[string]*memTurn
	order    []string // turn ids in the order they began
	sessions map[string]*memSession
	sorder   []string
	now      func() time.Time

	watch     watch.Set       // followers of turns (Watch)
	cancels   watch.Set       // running turns (WatchCancel)
	requested map[string]bool // turns a cancel was requested for

	payloads map[string]map[string][]byte // by turn, by key (Payloads)

	approvals  map[string][]*Approval  // by turn, in the order requested
	deliveries map[string]*memDelivery // webhook deliveries by id (Deliveries)

	suspended  map[string][]byte // checkpoints of suspended turns (Suspender)
	sorderSusp []string
}

type memTurn struct {
	rec    event.Turn // Events, ToolCalls, ModelCalls kept apart
	events []event.Event
	tools  []event.ToolCall
	models []event.ModelCall
	done   bool
}

type memSession struct {
	id       string
	created  time.Time
	updated  time.Time
	turns    []string
	messages []Message
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{turns: map[string]*memTurn{}, sessions: map[string]*memSession{}, now: time.Now, requested: map[string]bool{}}
}

var (
	_ Store       = (*Memory)(nil)
	_ Payloads    = (*Memory)(nil)
	_ Interrupter = (*Memory)(nil)
	_ Approvals   = (*Memory)(nil)
)

func (m *Memory) check() error {
	if m.closed {
		return ErrClosed
	}
	return nil
}

func (m *Memory) session(id string, at time.Time) *memSession {
	s := m.sessions[id]
	if s == nil {
		s = &memSession{id: id, created: at, updated: at}
		m.sessions[id] = s
		m.sorder = append(m.sorder, id)
	}
	if at.After(s.updated) {
		s.updated = at
	}
	return s
}

// BeginTurn implements Store.
func (m *Memory) BeginTurn(_ context.Context, t TurnStart) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	if _, ok := m.turns[t.TurnID]; ok {
		return fmt.Errorf("turn %s: %w", t.TurnID, ErrExists)
	}
	if s := m.sessions[t.SessionID]; s != nil && t.SessionID != "" {
		for _, id := range s.turns {
			if !m.turns[id].done {
				return fmt.Errorf("session %s: %w (%s)", t.SessionID, ErrSessionBusy, id)
			}
		}
	}
	m.begin(t)
	return nil
}

func (m *Memory) begin(t TurnStart) *memTurn {
	mt := &memTurn{rec: event.Turn{TurnID: t.TurnID, SessionID: t.SessionID, Agent: t.Agent, Input: t.Input,
		Status: budget.StatusRunning, StartedAt: t.StartedAt}}
	m.turns[t.TurnID] = mt
	m.order = append(m.order, t.TurnID)
	if t.SessionID != "" {
		s := m.session(t.SessionID, t.StartedAt)
		s.turns = append(s.turns, t.TurnID)
	}
	return mt
}

// AppendEvent implements Store.
func (m *Memory) AppendEvent(_ context.Context, e event.Event) error {
	defer m.watch.Wake(e.TurnID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	mt := m.turns[e.TurnID]
	switch {
	case mt == nil:
		return fmt.Errorf("turn %s: %w", e.TurnID, ErrNotFound)
	case mt.done:
		return fmt.Errorf("turn %s has ended: %w", e.TurnID, ErrNotRunning)
	}
	n := len(mt.events)
	if e.Seq == 0 { // numbered by the store (Store.AppendEvent)
		if err := mt.once(e); err != nil {
			return err
		}
		e.Seq = 1
		if n > 0 {
			e.Seq = mt.events[n-1].Seq + 1
		}
	}
	if n > 0 && e.Seq <= mt.events[n-1].Seq {
		return nil
	}
	mt.events = append(mt.events, e)
	tc, mc := CallRecords(e)
	if tc != nil {
		mt.putTool(*tc)
	}
	if mc != nil {
		mt.models = append(mt.models, *mc)
	}
	return nil
}

// once refuses a second end of one thing among events numbered by the
// store (OnceOnly).
func (mt *memTurn) once(e event.Event) error {
	for _, old := range mt.events {
		if SameEnd(old, e) {
			return fmt.Errorf("turn %s: %s for %s: %w", e.TurnID, e.Type, endOf(e), ErrExists)
		}
	}
	return nil
}

// QueueEvent implements Store. Memory has no disk to wait for: the event
// is stored and committed is called before QueueEvent returns.
func (m *Memory) QueueEvent(e event.Event, committed func(error)) {
	err := m.AppendEvent(context.Background(), e)
	if committed != nil {
		committed(err)
	}
}

// Flush implements Store; Memory queues nothing.
func (m *Memory) Flush(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.check()
}

func (mt *memTurn) putTool(tc event.ToolCall) {
	for i := range mt.tools {
		if mt.tools[i].CallID == tc.CallID {
			if !KeepLate(mt.tools[i], tc) {
				mt.tools[i] = tc
			}
			return
		}
	}
	mt.tools = append(mt.tools, tc)
}

// shareDeltas keeps the record's llm_delta events in place of the stored
// ones of the same seq and text: the record's are pieces of the joined
// reply (event.Emitter.ShareReply), the stored ones the chunks the reply
// streamed as, which a long reply would otherwise keep twice (issue 29).
// Both are in seq order.
func shareDeltas(stored, rec []event.Event) {
	i := 0
	for _, e := range rec {
		for i < len(stored) && stored[i].Seq < e.Seq {
			i++
		}
		if i == len(stored) {
			return
		}
		if stored[i].Seq != e.Seq {
			continue
		}
		was, ok1 := stored[i].Data.(*event.LLMDelta)
		now, ok2 := e.Data.(*event.LLMDelta)
		if ok1 && ok2 && was != now && *was == *now {
			stored[i] = e
		}
	}
}

// ShareReply implements event.ReplySharer: the turn's stored deltas become
// pieces of its joined reply as soon as it is joined, not at FinishTurn,
// so that a long reply's chunks are let go while the turn goes on.
func (m *Memory) ShareReply(deltas []event.Event) {
	if len(deltas) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if mt := m.turns[deltas[0].TurnID]; mt != nil {
		shareDeltas(mt.events, deltas)
	}
}

// FinishTurn implements Store.
func (m *Memory) FinishTurn(_ context.Context, rec *event.Turn, msgs []model.Message) error {
	defer m.watch.Wake(rec.TurnID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	mt := m.turns[rec.TurnID]
	if mt == nil {
		mt = m.begin(TurnStart{TurnID: rec.TurnID, SessionID: rec.SessionID, Agent: rec.Agent, Input: rec.Input, StartedAt: rec.StartedAt})
	}
	shareDeltas(mt.events, rec.Events)
	var stored []int64
	if len(rec.Events) > 0 {
		stored = make([]int64, len(mt.events))
		for i, e := range mt.events {
			stored[i] = e.Seq
		}
	}
	w := EndOf(rec, stored)
	if len(w.Events) > 0 {
		mt.events = append(mt.events, w.Events...)
		slices.SortStableFunc(mt.events, func(a, b event.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	for _, tc := range w.ToolCalls {
		tc.TurnID = rec.TurnID
		mt.putTool(tc)
	}
	if w.ModelCalls {
		mt.models = append([]event.ModelCall(nil), rec.ModelCalls...)
	}
	r := *rec
	r.Events, r.ToolCalls, r.ModelCalls = nil, nil, nil
	mt.rec, mt.done = r, true
	delete(m.requested, rec.TurnID)
	if rec.SessionID != "" {
		s := m.session(rec.SessionID, rec.EndedAt)
		s.messages = slices.DeleteFunc(s.messages, func(x Message) bool { return x.TurnID == rec.TurnID })
		for _, msg := range msgs {
			s.messages = append(s.messages, Message{TurnID: rec.TurnID, Message: msg})
		}
	}
	return nil
}

// UpdateToolCall implements Store.
func (m *Memory) UpdateToolCall(_ context.Context, rec event.ToolCall) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	mt := m.turns[rec.TurnID]
	if mt == nil {
		return fmt.Errorf("turn %s: %w", rec.TurnID, ErrNotFound)
	}
	mt.putTool(rec)
	return nil
}

// Turn implements Store.
func (m *Memory) Turn(_ context.Context, id string) (*event.Turn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	mt := m.turns[id]
	if mt == nil {
		return nil, fmt.Errorf("turn %s: %w", id, ErrNotFound)
	}
	r := mt.rec
	r.ToolCalls = append([]event.ToolCall{}, mt.tools...)
	slices.SortStableFunc(r.ToolCalls, func(a, b event.ToolCall) int { return a.StartedAt.Compare(b.StartedAt) })
	r.ModelCalls = append([]event.ModelCall{}, mt.models...)
	if !mt.done {
		r.Steps = stepsOf(r.ModelCalls)
	}
	return &r, nil
}

func stepsOf(mc []event.ModelCall) int {
	n := 0
	for _, c := range mc {
		n = max(n, c.Step)
	}
	return n
}

func (mt *memTurn) summary() TurnSummary {
	r := mt.rec
	s := TurnSummary{TurnID: r.TurnID, SessionID: r.SessionID, Agent: r.Agent, Input: ShortInput(r.Input),
		Status: r.Status, StopReason: r.StopReason, Message: r.Message, StartedAt: r.StartedAt, WallMS: r.WallMS,
		Steps: r.Steps, ToolCalls: len(mt.tools)}
	if mt.done {
		t := r.EndedAt
		s.EndedAt = &t
	} else {
		s.Steps = stepsOf(mt.models)
	}
	if n := len(mt.events); n > 0 {
		s.Events = mt.events[n-1].Seq
	}
	return s
}

// Turns implements Store.
func (m *Memory) Turns(_ context.Context, f Filter) ([]TurnSummary, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	limit := ClampLimit(f.Limit)
	end := len(m.order)
	if f.Before != "" {
		i := slices.Index(m.order, f.Before)
		if i < 0 {
			return nil, fmt.Errorf("turn %s: %w", f.Before, ErrNotFound)
		}
		end = i
	}
	out := []TurnSummary{}
	for i := end - 1; i >= 0 && len(out) < limit; i-- {
		mt := m.turns[m.order[i]]
		r := mt.rec
		if (f.Status != "" && r.Status != f.Status) || (f.StopReason != "" && r.StopReason != f.StopReason) ||
			(f.SessionID != "" && r.SessionID != f.SessionID) {
			continue
		}
		out = append(out, mt.summary())
	}
	return out, nil
}

// Events implements Store.
func (m *Memory) Events(_ context.Context, turnID string, after int64, limit int) ([]event.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	mt := m.turns[turnID]
	if mt == nil {
		return nil, fmt.Errorf("turn %s: %w", turnID, ErrNotFound)
	}
	out := []event.Event{}
	for _, e := range mt.events {
		if e.Seq > after {
			out = append(out, e)
			if limit > 0 && len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// Session implements Store.
func (m *Memory) Session(_ context.Context, id string) (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	s := m.sessions[id]
	if s == nil {
		return nil, fmt.Errorf("session %s: %w", id, ErrNotFound)
	}
	out := &Session{SessionID: id, CreatedAt: s.created, UpdatedAt: s.updated, Turns: []TurnSummary{},
		Messages: append([]Message{}, s.messages...)}
	for _, tid := range s.turns {
		out.Turns = append(out.Turns, m.turns[tid].summary())
	}
	return out, nil
}

// Sessions implements Store.
func (m *Memory) Sessions(_ context.Context, limit int) ([]SessionSummary, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	all := make([]*memSession, 0, len(m.sessions))
	for _, id := range m.sorder {
		all = append(all, m.sessions[id])
	}
	slices.SortStableFunc(all, func(a, b *memSession) int { return b.updated.Compare(a.updated) })
	out := []SessionSummary{}
	for _, s := range all[:min(len(all), ClampLimit(limit))] {
		ss := SessionSummary{SessionID: s.id, CreatedAt: s.created, UpdatedAt: s.updated, Turns: len(s.turns)}
		if len(s.turns) > 0 {
			ss.Title = ShortInput(m.turns[s.turns[0]].rec.Input)
		}
		out = append(out, ss)
	}
	return out, nil
}

// History implements Store.
func (m *Memory) History(_ context.Context, sessionID string) ([]model.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []model.Message
	if s := m.sessions[sessionID]; s != nil {
		for _, msg := range s.messages {
			out = append(out, msg.Message)
		}
	}
	return out, nil
}

// Watch implements Store: every change is made in this process, and
// signalled at once.
func (m *Memory) Watch(turnID string) (<-chan struct{}, func()) { return m.watch.Add(turnID) }

// RequestCancel implements Store. A request reaches a turn whose
// WatchCancel is registered in this store; any other running turn is
// ErrNotHere.
func (m *Memory) RequestCancel(_ context.Context, turnID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.running(turnID); err != nil {
		return err
	}
	if !m.cancels.Watched(turnID) {
		return fmt.Errorf("turn %s: %w", turnID, ErrNotHere)
	}
	m.requested[turnID] = true
	m.cancels.Wake(turnID)
	return nil
}

// running returns nil if turnID is a running turn of the store, else why
// not: the store's own error, ErrNotFound, ErrNotRunning. m.mu is held.
func (m *Memory) running(turnID string) error {
	if err := m.check(); err != nil {
		return err
	}
	switch mt := m.turns[turnID]; {
	case mt == nil:
		return fmt.Errorf("turn %s: %w", turnID, ErrNotFound)
	case mt.done:
		return fmt.Errorf("turn %s: %w", turnID, ErrNotRunning)
	}
	return nil
}

// WatchCancel implements Store.
func (m *Memory) WatchCancel(turnID string) (<-chan struct{}, func()) {
	ch, stop := m.cancels.Add(turnID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requested[turnID] {
		m.cancels.Wake(turnID)
	}
	return ch, stop
}

// InterruptTurn implements Interrupter.
func (m *Memory) InterruptTurn(_ context.Context, turnID string, end End) (*Ending, error) {
	defer m.watch.Wake(turnID)
	defer m.cancels.Wake(turnID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	mt := m.turns[turnID]
	switch {
	case mt == nil:
		return nil, fmt.Errorf("turn %s: %w", turnID, ErrNotFound)
	case mt.done:
		return nil, nil
	}
	t := Interrupted{TurnID: turnID, SessionID: mt.rec.SessionID, Agent: mt.rec.Agent, Input: mt.rec.Input,
		StartedAt: mt.rec.StartedAt, Events: mt.events, ToolCalls: len(mt.tools), Steps: stepsOf(mt.models),
		End: end, Now: m.now()}
	out := Interrupt(t)
	ended := t.Ending(out)
	for _, tc := range out.Calls {
		mt.putTool(tc)
	}
	mt.events = append(mt.events, out.Events...)
	rec := out.Record
	rec.ToolCalls, rec.ModelCalls, rec.Events = nil, nil, nil
	mt.rec = rec
	mt.done = true
	return &ended, nil
}

// Close implements Store: turns still running are marked interrupted.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	now := m.now().UTC()
	for _, id := range m.order {
		mt := m.turns[id]
		if mt.done {
			continue
		}
		mt.rec.Status, mt.rec.StopReason = budget.StatusInterrupted, budget.Interrupted
		mt.rec.Message = "Interrupted: the store was closed while the turn was running. Everything it emitted until then is kept; send the message again to retry."
		mt.rec.EndedAt, mt.rec.WallMS = now, now.Sub(mt.rec.StartedAt).Milliseconds()
		mt.done = true
	}
	m.closed = true
	return nil
}

// RequestApproval implements Approvals.
func (m *Memory) RequestApproval(_ context.Context, a Approval) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	if m.turns[a.TurnID] == nil {
		return fmt.Errorf("turn %s: %w", a.TurnID, ErrNotFound)
	}
	for _, o := range m.approvals[a.TurnID] {
		if o.CallID == a.CallID && o.Round == a.Round {
			return nil
		}
	}
	if m.approvals == nil {
		m.approvals = map[string][]*Approval{}
	}
	a.Decision, a.By, a.Reason, a.DecidedAt = "", "", "", time.Time{}
	m.approvals[a.TurnID] = append(m.approvals[a.TurnID], &a)
	return nil
}

// last returns the last round of a call; m.mu is held.
func (m *Memory) last(turnID, callID string) *Approval {
	var last *Approval
	for _, a := range m.approvals[turnID] {
		if a.CallID == callID && (last == nil || a.Round > last.Round) {
			last = a
		}
	}
	return last
}

// Decide implements Approvals.
func (m *Memory) Decide(_ context.Context, turnID, callID string, d Approval) (Approval, error) {
	defer m.watch.Wake(turnID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return Approval{}, err
	}
	a := m.last(turnID, callID)
	if a == nil {
		return Approval{}, fmt.Errorf("call %s of turn %s: %w", callID, turnID, ErrNotFound)
	}
	err := decide(a, d)
	return *a, err
}

// Approval implements Approvals.
func (m *Memory) Approval(_ context.Context, turnID, callID string) (Approval, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return Approval{}, err
	}
	a := m.last(turnID, callID)
	if a == nil {
		return Approval{}, fmt.Errorf("call %s of turn %s: %w", callID, turnID, ErrNotFound)
	}
	return *a, nil
}

// Approvals implements Approvals.
func (m *Memory) Approvals(_ context.Context, turnID string) ([]Approval, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []Approval
	for _, a := range m.approvals[turnID] {
		if m.last(turnID, a.CallID) == a {
			out = append(out, *a)
		}
	}
	return out, nil
}
