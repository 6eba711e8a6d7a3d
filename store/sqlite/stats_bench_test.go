package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/store/storetest"
)

// BenchmarkStatsMillion times what `timebox stats` asks of the store over
// 1,000,000 tool calls and 1,000,000 model calls of the last 30 days (it
// takes a few minutes to store them first; skipped with -short; with
// TIMEBOX_BENCH_DB=FILE they are stored there once and read by every run):
//
//	go test -run '^$' -bench StatsMillion -benchtime 5x ./store/sqlite/
func BenchmarkStatsMillion(b *testing.B) {
	if testing.Short() {
		b.Skip("stores a million calls first")
	}
	path := os.Getenv("TIMEBOX_BENCH_DB")
	_, err := os.Stat(path)
	seeded := path != "" && err == nil
	if path == "" {
		path = filepath.Join(b.TempDir(), "timebox.db")
	}
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if !seeded {
		start := time.Now()
		if err := storetest.GenerateCalls(1_000_000, 10_000, benchEnd, 30*24*time.Hour, func(tools []event.ToolCall, models []storetest.TurnModelCall) error {
			return s.SeedCalls(ctx, tools, models)
		}); err != nil {
			b.Fatal(err)
		}
		b.Logf("stored 1,000,000 tool calls and 1,000,000 model calls in %s", time.Since(start).Round(time.Second))
	}
	benchStats(b, s, store.StatsFilter{Since: benchEnd.Add(-30 * 24 * time.Hour)})
}

// benchEnd is when the benchmark's calls end: fixed, so that a store kept
// with TIMEBOX_BENCH_DB is read the same way by every run.
var benchEnd = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

// benchStats times ToolStats, ModelStats, and both as timebox stats asks
// for them.
func benchStats(b *testing.B, cs store.CallStats, f store.StatsFilter) {
	ctx := context.Background()
	b.Run("tools", func(b *testing.B) {
		for b.Loop() {
			ts, err := cs.ToolStats(ctx, f)
			if err != nil || len(ts) != 8 {
				b.Fatal(len(ts), err)
			}
		}
	})
	b.Run("models", func(b *testing.B) {
		for b.Loop() {
			if _, err := cs.ModelStats(ctx, f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stats", func(b *testing.B) {
		for b.Loop() {
			if _, err := cs.ToolStats(ctx, f); err != nil {
				b.Fatal(err)
			}
			if _, err := cs.ModelStats(ctx, f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
