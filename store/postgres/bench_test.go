package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/storetest"
)

// BenchmarkAppendEvent measures one event written and waited for — the
// commit a follower waits for before it sees the event (TB_TEST_PG_DURABLE=1
// for fsync):
//
//	TB_TEST_PG_DURABLE=1 go test -run '^$' -bench . ./store/postgres/
func BenchmarkAppendEvent(b *testing.B) {
	s := open(b, testenv.Postgres(b), postgres.Options{})
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

// BenchmarkQueueEventConcurrent measures event writes from 64 turns at
// once, which share commits.
func BenchmarkQueueEventConcurrent(b *testing.B) {
	s := open(b, testenv.Postgres(b), postgres.Options{})
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
//	go test -run '^$' -bench TurnEnds -benchtime 3x ./store/postgres/
func BenchmarkTurnEnds(b *testing.B) {
	s := open(b, testenv.Postgres(b), postgres.Options{})
	defer s.Close()
	storetest.BenchmarkTurnEnds(b, s)
}
