package store

import (
	"context"
	"fmt"
)

// Suspender is a store that keeps suspended turns: a turn whose process
// stopped while it waited for nothing but people's decisions stays
// running, owned by no process — none takes it for gone — with its
// checkpoint (agent.Checkpoint, as JSON), until a process resumes it.
// Memory, SQLite and PostgreSQL are Suspenders.
type Suspender interface {
	// SuspendTurn stores the events queued for the turn, then its
	// checkpoint, and releases it from this store.
	SuspendTurn(ctx context.Context, turnID string, checkpoint []byte) error
	// SuspendedTurns lists the suspended turns, oldest first.
	SuspendedTurns(ctx context.Context) ([]string, error)
	// ResumeTurn claims a suspended turn for this store and returns its
	// checkpoint; ErrNotFound when it is not suspended (another process
	// took it first).
	ResumeTurn(ctx context.Context, turnID string) ([]byte, error)
}

var _ Suspender = (*Memory)(nil)

// SuspendTurn implements Suspender.
func (m *Memory) SuspendTurn(ctx context.Context, turnID string, checkpoint []byte) error {
	if err := m.Flush(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.running(turnID); err != nil {
		return err
	}
	if m.suspended == nil {
		m.suspended = map[string][]byte{}
	}
	if _, ok := m.suspended[turnID]; !ok {
		m.sorderSusp = append(m.sorderSusp, turnID)
	}
	m.suspended[turnID] = append([]byte(nil), checkpoint...)
	return nil
}

// SuspendedTurns implements Suspender.
func (m *Memory) SuspendedTurns(context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var out []string
	for _, id := range m.sorderSusp {
		if _, ok := m.suspended[id]; ok {
			out = append(out, id)
		}
	}
	return out, nil
}

// ResumeTurn implements Suspender.
func (m *Memory) ResumeTurn(_ context.Context, turnID string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	cp, ok := m.suspended[turnID]
	if !ok {
		return nil, fmt.Errorf("suspended turn %s: %w", turnID, ErrNotFound)
	}
	delete(m.suspended, turnID)
	return cp, nil
}
