package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	// Payload returns the value stored under key for turn id, or an error
	// wrapping ErrNotFound.
	Payload(ctx context.Context, turnID, key string) ([]byte, error)
	// PayloadRange returns the values of turn id whose keys begin with
	// prefix, in key order.
	PayloadRange(ctx context.Context, turnID, prefix string) ([]Payload, error)
}

// Payload is one stored value of a turn.
type Payload struct {
	Key  string
	Data []byte
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
func (m *Memory) Payload(_ context.Context, turnID, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	v, ok := m.payloads[turnID][key]
	if !ok {
		return nil, fmt.Errorf("payload %s of turn %s: %w", key, turnID, ErrNotFound)
	}
	return slices.Clone(v), nil
}

// PayloadRange implements Payloads.
func (m *Memory) PayloadRange(_ context.Context, turnID, prefix string) ([]Payload, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []Payload
	for _, k := range slices.Sorted(maps.Keys(m.payloads[turnID])) {
		if strings.HasPrefix(k, prefix) {
			out = append(out, Payload{Key: k, Data: slices.Clone(m.payloads[turnID][k])})
		}
	}
	return out, nil
}
