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
	"github.com/timebox-run/timebox/store/storetest"
)

// BenchmarkAppendEvent measures one event written and waited for: what an
// event that carries a call record (store.WaitForStore) costs the turn.
func BenchmarkAppendEvent(b *testing.B) {
	s := open(&testing.T{}, filepath.Join(b.TempDir(), "timebox.db"))
	defer s.Close()
	ctx := context.Background()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x", StartedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	seq := int64(0)
	for b.Loop() {
		seq++
		e := event.Event{Seq: seq, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{Step: 1, Text: "a few words of a reply"}}
		if err := s.AppendEvent(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQueueEvent measures the events of one streaming turn, queued by
// its Recorder and committed in batches; the final Flush is timed too.
func BenchmarkQueueEvent(b *testing.B) {
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
	if err := s.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkQueueEventConcurrent measures event writes from 64 turns at
// once, which share commits.
func BenchmarkQueueEventConcurrent(b *testing.B) {
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
	if err := s.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTurnEnds ends 10,000 turns (TB_BENCH_TURNS) at one instant and
// measures how long after it their ends are stored
// (storetest.BenchmarkTurnEnds):
//
//	go test -run '^$' -bench TurnEnds -benchtime 3x ./store/sqlite/
func BenchmarkTurnEnds(b *testing.B) {
	s := open(&testing.T{}, filepath.Join(b.TempDir(), "timebox.db"))
	defer s.Close()
	storetest.BenchmarkTurnEnds(b, s)
}
