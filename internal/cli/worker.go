package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/temporal"
)

// cmdWorker runs a Temporal worker: the turns that `timebox run --engine
// temporal` and `timebox serve --engine temporal` start on its task queue
// run here, their events and records going to the shared PostgreSQL store.
func cmdWorker(ctx context.Context, args []string, o IO) int {
	fs, c := newFlags("worker", o)
	ef := addEngineFlags(fs, false, true)
	dbFlag := fs.String("db", "", "the PostgreSQL store the workers and gateways share, postgres://… (env TIMEBOX_DB)")
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	if len(pos) > 0 {
		fmt.Fprintf(o.Err, "timebox worker: unexpected argument %q (the file is given with -f)\n", pos[0])
		return ExitUsage
	}
	es, err := ef.resolve(fs, o)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox worker:", err)
		return ExitUsage
	}
	db := setting(fs, "db", *dbFlag, "TIMEBOX_DB", o, "")
	if !postgres.IsURL(db) {
		fmt.Fprintln(o.Err, "timebox worker: --db must be a postgres://… URL (or TIMEBOX_DB): the workers and the gateways that start turns share one PostgreSQL store")
		return ExitUsage
	}
	cfg, ctx, stop, ok := loadToRun(ctx, c, fs, o)
	if !ok {
		return ExitUsage
	}
	defer stop()

	tracing, st, closeStore, code := openTracedStore(ctx, db, false, o, "timebox worker")
	if code != ExitOK {
		return code
	}
	defer closeStore()
	if err := timebox.NoCredential(cfg, o.getenv); err != nil {
		fmt.Fprintln(o.Err, "timebox worker:", err)
		return ExitUsage
	}
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv, TracerProvider: tracing.Provider})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	tc, err := es.dial(ctx, o)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox worker:", err)
		return ExitFailed
	}
	defer tc.Close()
	w, err := temporal.NewWorker(temporal.WorkerOptions{Client: tc, TaskQueue: es.TaskQueue, Agent: a.Agent, Store: st,
		Heartbeat: es.Heartbeat, Logger: slog.New(slog.NewTextHandler(o.Err, nil))})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox worker:", err)
		return ExitUsage
	}
	if err := w.Start(); err != nil {
		fmt.Fprintln(o.Err, "timebox worker:", err)
		return ExitFailed
	}
	name := cfg.Name
	if name == "" {
		name = c.file
	}
	fmt.Fprintf(o.Out, "timebox worker running %s on task queue %s at %s (store: %s)\n", name, es.TaskQueue, es.Address, postgres.Redact(db))
	<-ctx.Done()
	// Stop gives the units of work under way up: their tools' process
	// trees are stopped, and another worker takes their turns on at once,
	// asking a model step given up again and recording a call that was
	// running lost (worker_lost; run again when its tool has retries). It waits (up to 10s) for the
	// units it gave up to record how they ended, and for a unit storing
	// its turn's end, whose span it must make: the store closes and the
	// tracing ends after it.
	fmt.Fprintln(o.Err, "timebox worker: stopping; units of work under way are given up, and another worker goes on with their turns (a call running now is recorded lost, worker_lost)")
	w.Stop()
	fmt.Fprintln(o.Err, "timebox worker: stopped")
	return ExitOK
}
