package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// BenchmarkAppendEvent measures one synchronous event write: the cost every
// emitted event pays before the turn goes on.
func BenchmarkAppendEvent(b *testing.B) {
	s := open(&testing.T{}, filepath.Join(b.TempDir(), "timebox.db"))
	defer s.Close()
	if err := s.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Input: "x", StartedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	em := event.NewEmitter("t1", store.NewRecorder(s))
	b.ReportAllocs()
	for b.Loop() {
		em.Emit(&event.LLMDelta{Step: 1, Text: "a few words of a reply"})
	}
}

// BenchmarkAppendEventConcurrent measures event writes from 64 turns at
// once, which share commits.
func BenchmarkAppendEventConcurrent(b *testing.B) {
	s := open(&testing.T{}, filepath.Join(b.TempDir(), "timebox.db"))
	defer s.Close()
	b.SetParallelism(32)
	b.ReportAllocs()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		id := fmt.Sprintf("t%d", n.Add(1))
		if err := s.BeginTurn(context.Background(), store.TurnStart{TurnID: id, Input: "x", StartedAt: time.Now()}); err != nil {
			b.Error(err)
			return
		}
		em := event.NewEmitter(id, store.NewRecorder(s))
		for pb.Next() {
			em.Emit(&event.LLMDelta{Step: 1, Text: "a few words of a reply"})
		}
	})
}
