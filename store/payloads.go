package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/timebox-run/timebox/event"
)

// Payloads keeps the large values of turns whose units of work run on
// other machines — their conversations — so that an engine passes
// references instead of the values themselves (package temporal: no
// payload limit of Temporal's bounds a conversation). PostgreSQL and
// Memory implement it. A turn's payloads are kept with its record.
type Payloads interface {
	// PutPayloads stores each value of p under its key for turn id, in
	// one transaction, replacing what was there.
	PutPayloads(ctx context.Context, turnID string, p map[string][]byte) error
	// Payload calls use with the value stored under key for turn id, or
	// returns an error wrapping ErrNotFound. data is lent, as in
	// PayloadRange. use's error is returned.
	Payload(ctx context.Context, turnID, key string, use func(data []byte) error) error
	// PayloadRange calls each with the values of turn id whose keys begin
	// with prefix, in key order, one at a time. data is lent for the call
	// (a store may lend its read buffer, or its own copy): each copies
	// what it keeps, and changes none of it. So a conversation of 50 MB is
	// read without being held twice, as stored and as decoded (issue 29).
	// An error of each ends the range and is returned.
	PayloadRange(ctx context.Context, turnID, prefix string, each func(key string, data []byte) error) error
	// TurnWithoutResults returns turn id's record as Turn does, each tool
	// call's Result left empty. The end of a turn whose units ran
	// elsewhere counts and orders its calls, whose records stay as their
	// units stored them, results and all; the runner that followed the
	// turn has every result in its tool_finished already. (Each read every
	// result again: ten 5 MB results were 130 MB decoded and 50 MB held
	// through the end, issue 29.)
	TurnWithoutResults(ctx context.Context, turnID string) (*event.Turn, error)
}

// TurnWithoutResults implements Payloads.
func (m *Memory) TurnWithoutResults(ctx context.Context, turnID string) (*event.Turn, error) {
	rec, err := m.Turn(ctx, turnID)
	if err != nil {
		return nil, err
	}
	for i := range rec.ToolCalls {
		rec.ToolCalls[i].Result = ""
	}
	return rec, nil
}

// PutPayloads implements Payloads.
func (m *Memory) PutPayloads(_ context.Context, turnID string, p map[string][]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	if m.payloads == nil {
		m.payloads = map[string]map[string][]byte{}
	}
	t := m.payloads[turnID]
	if t == nil {
		t = map[string][]byte{}
		m.payloads[turnID] = t
	}
	for k, v := range p {
		t[k] = slices.Clone(v)
	}
	return nil
}

// Payload implements Payloads.
func (m *Memory) Payload(_ context.Context, turnID, key string, use func(data []byte) error) error {
	m.mu.Lock()
	if err := m.check(); err != nil {
		m.mu.Unlock()
		return err
	}
	v, ok := m.payloads[turnID][key]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("payload %s of turn %s: %w", key, turnID, ErrNotFound)
	}
	return use(v) // never changed in place: PutPayloads replaces it
}

// PayloadRange implements Payloads.
func (m *Memory) PayloadRange(_ context.Context, turnID, prefix string, each func(key string, data []byte) error) error {
	m.mu.Lock()
	if err := m.check(); err != nil {
		m.mu.Unlock()
		return err
	}
	// The values are never changed in place (PutPayloads replaces them):
	// each is called without the lock, and may use the store.
	t := m.payloads[turnID]
	var keys []string
	for k := range t {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		vals[i] = t[k]
	}
	m.mu.Unlock()
	for i, k := range keys {
		if err := each(k, vals[i]); err != nil {
			return err
		}
	}
	return nil
}
