package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/temporal"
	"github.com/timebox-run/timebox/tool"
)

// jsonLines is a sink that writes each event as one JSON line.
type jsonLines struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error
}

func (j *jsonLines) Emit(e event.Event) {
	j.mu.Lock()
	defer j.mu.Unlock()
	// A long answer goes to the writer a piece at a time (issue 29).
	err := event.WriteJSON(j.w, e)
	if err == nil {
		j.w.WriteByte('\n')
		err = j.w.Flush()
	}
	if err != nil && j.err == nil {
		j.err = err
	}
}

// failed returns the first event that could not be written, if any.
func (j *jsonLines) failed() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// exitCode maps a turn's status to the command's exit code (spec §11).
func exitCode(s budget.Status) int {
	switch s {
	case budget.StatusCompleted:
		return ExitOK
	case budget.StatusStopped:
		return ExitStopped
	case budget.StatusCancelled:
		return ExitCancelled
	}
	return ExitFailed
}

// interrupts cancels ctx with a cancelled cause on the first SIGINT or
// SIGTERM; a second one exits at once with 130.
func interrupts(ctx context.Context, o IO) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	sig := make(chan os.Signal, 2)
	// SIGPIPE is asked for only so that the runtime does not kill timebox
	// when the reader of its output goes away (`timebox run … | head`):
	// the write fails with EPIPE instead, and the turn is cancelled as
	// client_gone with its tools stopped (goneWriter). Killed by the
	// signal, timebox would leave its tools running.
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case s := <-sig:
				if s == syscall.SIGPIPE {
					continue
				}
				n++
				if n == 1 {
					by := "you (Ctrl-C)"
					if s == syscall.SIGTERM {
						by = "SIGTERM"
					}
					cancel(&budget.CancelError{Reason: budget.Cancelled, By: by})
					continue
				}
				fmt.Fprintln(o.Err, "\ntimebox: interrupted twice, exiting now")
				os.Exit(ExitCancelled)
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel(nil)
	}
}

// goneWriter is the turn's standard output. When a write fails because
// its reader went away (EPIPE: `timebox run … | head` after head exited),
// or when watchReader sees the reader leave (a pipe), it cancels the
// turn once, as client_gone: nobody is reading the answer,
// and the turn's tools must not run on for nobody. Later writes are
// dropped. Any other failed write (a full disk) is kept for failed: the
// turn goes on, and the command says at its end that output was lost.
type goneWriter struct {
	w      io.Writer
	cancel context.CancelCauseFunc

	mu   sync.Mutex
	gone bool
	err  error // the first write that failed otherwise
}

// failed returns the first write that failed for another reason than a
// reader gone, if any.
func (g *goneWriter) failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *goneWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone {
		return len(p), nil
	}
	n, err := g.w.Write(p)
	if err != nil && errors.Is(err, syscall.EPIPE) {
		g.goneLocked()
		return len(p), nil
	}
	if err != nil && g.err == nil {
		g.err = err
	}
	return n, err
}

// readerGone is watchReader's news that the reader left before a write
// failed.
func (g *goneWriter) readerGone() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.gone {
		g.goneLocked()
	}
}

func (g *goneWriter) goneLocked() {
	g.gone = true
	g.cancel(&budget.CancelError{Reason: budget.ClientGone, By: "the reader of standard output"})
}

func cmdRun(ctx context.Context, args []string, o IO) int {
	fs, c := newFlags("run", o)
	asJSON := fs.Bool("json", false, "write the events as JSON lines to stdout, and nothing else")
	session := fs.String("session", "", "the session id (conversation) the turn belongs to")
	// Storing the turn (issue 3): see runs.go and docs/decisions/run-stores-turns.md.
	db := fs.String("db", "", `store the turn in this file, for timebox runs (env TIMEBOX_DB; default `+stateDB(o)+`; "" stores nothing)`)
	noStore := fs.Bool("no-store", false, "do not store the turn")
	recordTo := fs.String("record", "", "write the model's replies, with timings, to this file as a script (model/script) for offline replay")
	var approve approveFlags
	fs.Var(&approve, "approve", "approve the calls of `TOOL` without asking (repeat, or a list; \"all\" for every tool); others are asked on the terminal, or denied without one")
	ef := addEngineFlags(fs, true, false)
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	es, err := ef.resolve(fs, o)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox run:", err)
		return ExitUsage
	}
	if es.Engine == engineTemporal {
		if path := setting(fs, "db", *db, "TIMEBOX_DB", o, ""); !postgres.IsURL(path) || *noStore {
			fmt.Fprintln(o.Err, "timebox run: --engine temporal needs the PostgreSQL store its workers write to: --db postgres://… (or TIMEBOX_DB)")
			return ExitUsage
		}
		if *recordTo != "" {
			fmt.Fprintln(o.Err, "timebox run: --record records the model's replies in this process; with --engine temporal they are made by the workers")
			return ExitUsage
		}
	}
	prompt := strings.Join(pos, " ")
	if prompt == "-" {
		// One byte past the limit tells a prompt over it, without
		// reading an endless input (`yes | timebox run -`).
		b, err := io.ReadAll(io.LimitReader(o.In, agent.MaxInputBytes+1))
		if err != nil {
			fmt.Fprintln(o.Err, "timebox: reading the prompt:", err)
			return ExitUsage
		}
		prompt = string(b)
	}
	if strings.TrimSpace(prompt) == "" {
		fmt.Fprintln(o.Err, synopses["run"])
		if name, value, ok := tookLastWord(args); ok && len(pos) == 0 {
			fmt.Fprintf(o.Err, "timebox run: no prompt: %s took %q as its value (give the flag its value, then the prompt)\n", name, value)
		}
		return ExitUsage
	}
	// The checks of POST /v1/turns: a prompt a person can send the model,
	// and a session id that is safe wherever it is shown.
	switch {
	case len(prompt) > agent.MaxInputBytes:
		fmt.Fprintf(o.Err, "timebox run: the prompt is over %s, the limit of a turn's input (serve's too): give the model a file's path and a tool to read it\n",
			budget.FormatBytes(agent.MaxInputBytes))
		return ExitUsage
	case !utf8.ValidString(prompt):
		fmt.Fprintln(o.Err, "timebox run: the prompt is not valid UTF-8 text")
		return ExitUsage
	case *session != "" && !agent.ValidSessionID(*session):
		fmt.Fprintf(o.Err, "timebox run: --session %q: a session id is %s\n", *session, agent.SessionIDForm)
		return ExitUsage
	}
	cfg, ctx, stop, ok := loadToRun(ctx, c, fs, o)
	if !ok {
		return ExitUsage
	}
	defer stop()
	ctx, outGone := context.WithCancelCause(ctx)
	defer outGone(nil)
	gw := &goneWriter{w: o.Out, cancel: outGone}
	defer watchReader(o.Out, gw.readerGone)()
	o.Out = gw
	var recording *script.Recording
	recordDone := func() error { return nil }
	if *recordTo != "" {
		f, err := os.Create(*recordTo)
		if err != nil {
			fmt.Fprintln(o.Err, "timebox: --record:", err)
			return ExitUsage
		}
		defer f.Close() // on the returns before the turn's end
		recording = script.NewRecording(f)
		recordDone = func() error {
			err := recording.Err()
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}
	}
	tracing, ok := startTracing(ctx, o)
	if !ok {
		return ExitUsage
	}
	defer stopTracing(tracing, o)
	// A timebox run as another traced program's tool joins its trace.
	ctx = agent.WithTraceParent(ctx, o.getenv(tool.EnvTraceParent))
	if es.Engine != engineTemporal { // there, the workers call the models
		if err := timebox.NoCredential(cfg, o.getenv); err != nil {
			fmt.Fprintln(o.Err, "timebox run:", err)
			return ExitUsage
		}
	}
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv, Record: recording, TracerProvider: tracing.Provider})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	if err := approve.check(a.Agent); err != nil {
		fmt.Fprintln(o.Err, "timebox run:", err)
		return ExitUsage
	}

	var sink event.Sink
	var v *view
	var jl *jsonLines
	if *asJSON {
		jl = &jsonLines{w: bufio.NewWriter(o.Out)}
		sink = jl
	} else {
		v = newView(o.Out, o.Terminal, o.Terminal && o.getenv("NO_COLOR") == "")
		sink = v
	}
	in := agent.Input{SessionID: *session, Text: prompt}
	ca := &cliApprover{auto: approve}
	if v != nil && o.Terminal && o.InTerminal {
		ca.ask = newPrompter(o.In, o.Out, v)
	}
	in.Approver = ca
	rs, ok := openRunStore(fs, *db, *noStore, o, tracedEnds(tracing))
	if !ok {
		return ExitFailed
	}
	var runner interface {
		Run(context.Context, agent.Input, ...event.Sink) *agent.Result
	} = a
	sinks := func() []event.Sink { return rs.sinks(sink) }
	if es.Engine == engineTemporal {
		if rs == nil {
			return ExitFailed // openRunStore said why
		}
		tc, err := es.dial(ctx, o)
		if err != nil {
			fmt.Fprintln(o.Err, "timebox run:", err)
			rs.finish(nil, nil, o)
			return ExitFailed
		}
		defer tc.Close()
		r, err := temporal.NewRunner(tc, rs.st, es.TaskQueue, a.Agent)
		if err != nil {
			fmt.Fprintln(o.Err, "timebox run:", err)
			return ExitFailed
		}
		// The workers store the turn's events and record.
		runner, rs.engine = r, r.Engine()
		sinks = func() []event.Sink { return []event.Sink{sink} }
	}
	if err := rs.begin(ctx, &in, cfg.Name, o); err != nil {
		fmt.Fprintln(o.Err, "timebox run:", err)
		rs.finish(nil, nil, o) // closes the store
		return ExitFailed
	}
	runCtx, unwatch := rs.cancellable(ctx)
	res := runner.Run(runCtx, in, sinks()...)
	unwatch()
	// A Ctrl-C after the turn ended (its first: the turn was not
	// cancelled by one) stops waiting for a store that is away.
	var stopWaiting <-chan struct{}
	if ctx.Err() == nil {
		stopWaiting = ctx.Done()
	}
	rs.finishUnless(res.Record, res.Messages, stopWaiting, o)
	if v != nil {
		v.close()
	}
	switch r := res.Record; r.StopReason {
	case budget.AgentMismatch:
		// The workers run another agent file: a configuration error.
		fmt.Fprintln(o.Err, "timebox run:", r.Message)
		return ExitUsage
	case budget.EngineLost, budget.Interrupted:
		fmt.Fprintln(o.Err, "timebox run:", r.Message)
	}
	code := exitCode(res.Record.Status)
	// Output that could not be written is lost: the command fails, saying
	// so, however the turn ended (the store has the turn).
	outErr := gw.failed()
	if outErr == nil && jl != nil {
		outErr = jl.failed()
	}
	if outErr != nil {
		fmt.Fprintln(o.Err, "timebox run: writing to standard output:", outErr)
	}
	recErr := recordDone()
	if recErr != nil {
		fmt.Fprintln(o.Err, "timebox run: --record:", recErr)
	}
	if code == ExitOK && (outErr != nil || recErr != nil) {
		code = ExitFailed
	}
	return code
}
