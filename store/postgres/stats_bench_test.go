package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/storetest"
)

// BenchmarkStatsMillion times what `timebox stats` asks of the store over
// 1,000,000 tool calls and 1,000,000 model calls of the last 30 days, on
// the throwaway cluster (it takes a few minutes to store them first, then
// VACUUM ANALYZE as autovacuum would; skipped with -short; with
// TIMEBOX_BENCH_PG=URL, a database of yours, they are stored there once and
// read by every run):
//
//	go test -run '^$' -bench StatsMillion -benchtime 5x ./store/postgres/
func BenchmarkStatsMillion(b *testing.B) {
	if testing.Short() {
		b.Skip("stores a million calls first")
	}
	dsn := os.Getenv("TIMEBOX_BENCH_PG")
	if dsn == "" {
		dsn = testenv.Postgres(b)
	}
	s := open(b, dsn, postgres.Options{})
	defer s.Close()
	ctx := context.Background()
	end := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	f := store.StatsFilter{Since: end.Add(-30 * 24 * time.Hour)}
	if ts, err := s.ToolStats(ctx, f); err != nil || len(ts) == 0 {
		start := time.Now()
		if err := storetest.GenerateCalls(1_000_000, 10_000, end, 30*24*time.Hour, func(tools []event.ToolCall, models []storetest.TurnModelCall) error {
			return s.SeedCalls(ctx, tools, models)
		}); err != nil {
			b.Fatal(err)
		}
		if err := s.Vacuum(ctx); err != nil {
			b.Fatal(err)
		}
		b.Logf("stored 1,000,000 tool calls and 1,000,000 model calls in %s", time.Since(start).Round(time.Second))
	}
	for _, bc := range []struct {
		name string
		fn   func() error
	}{
		{"tools", func() error { _, err := s.ToolStats(ctx, f); return err }},
		{"models", func() error { _, err := s.ModelStats(ctx, f); return err }},
		{"stats", func() error {
			if _, err := s.ToolStats(ctx, f); err != nil {
				return err
			}
			_, err := s.ModelStats(ctx, f)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := bc.fn(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
