package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/sqlite"
)

const runsUsage = `usage:
  timebox runs list [--status S] [--stop-reason R] [--session ID] [--limit N] [--json] [--db STORE]
  timebox runs show ID [--json] [--db STORE]      a turn's record: status, message, every call against its budget
  timebox runs show ID --timeline [--db STORE]    the same as a picture: each call a bar on one time axis
  timebox runs export ID [--db STORE]             a turn's events as JSON lines (as run --json wrote them)

The store is --db, else TIMEBOX_DB, else timebox.db in $XDG_STATE_HOME/timebox
(~/.local/state/timebox): the one default of every command that stores or
reads turns (run, serve, runs, stats, validate, mcp serve).
A postgres:// URL names the PostgreSQL database gateways share.`

func openSQLite(path string, ended func(store.Ending)) (*sqlite.Store, error) {
	st, err := sqlite.Open(path, sqlite.Options{Ended: ended})
	if err != nil {
		return nil, fmt.Errorf("opening the store: %w", err)
	}
	return st, nil
}

func cmdRuns(ctx context.Context, args []string, o IO) int {
	if len(args) == 0 {
		fmt.Fprintln(o.Err, runsUsage)
		return ExitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("timebox runs "+sub, flag.ContinueOnError)
	fs.SetOutput(o.Err)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\n", runsUsage)
		fs.PrintDefaults()
	}
	dbFlag := fs.String("db", "", "the store: a SQLite file or a postgres:// URL (env TIMEBOX_DB; default "+stateDB(o)+")")
	asJSON := new(bool) // export writes JSON lines, whatever it is told
	if sub != "export" {
		fs.BoolVar(asJSON, "json", false, "write JSON instead of a table")
	}
	var f store.Filter
	var status, reason string
	var timeline bool
	if sub == "show" {
		fs.BoolVar(&timeline, "timeline", false, "draw the turn's calls on one time axis, each against its deadline (the page's timeline)")
	}
	if sub == "list" {
		fs.StringVar(&status, "status", "", "only turns with this status (running, completed, stopped, failed, cancelled, interrupted)")
		fs.StringVar(&reason, "stop-reason", "", "only turns with this stop reason (answered, turn_timeout, client_gone, ...)")
		fs.StringVar(&f.SessionID, "session", "", "only the turns of this session")
		fs.IntVar(&f.Limit, "limit", 20, fmt.Sprintf("at most this many turns, newest first (up to %d)", store.MaxLimit))
	}
	switch sub {
	case "list", "show", "export":
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(o.Out, runsUsage)
		return ExitOK
	default:
		fmt.Fprintf(o.Err, "%s\n%s\n", unknownWord("runs", sub, []string{"list", "show", "export"}), runsUsage)
		return ExitUsage
	}
	pos, err := parse(fs, args[1:])
	if err != nil {
		return usageExit(err)
	}
	switch {
	case sub == "list" && len(pos) > 0:
		fmt.Fprintf(o.Err, "timebox runs list: unexpected argument %q (filter with --status, --stop-reason or --session)\n%s\n", pos[0], runsUsage)
		return ExitUsage
	case sub != "list" && len(pos) == 0:
		fmt.Fprintf(o.Err, "timebox runs %s: give the turn's ID (timebox runs list shows them), as in timebox runs %s t_…\n", sub, sub)
		return ExitUsage
	case len(pos) > 1:
		fmt.Fprintf(o.Err, "timebox runs %s: one turn at a time: %q is one argument too many\n", sub, pos[1])
		return ExitUsage
	}
	f.Status, f.StopReason = budget.Status(status), budget.StopReason(reason)
	if err := f.Check("--status", "--stop-reason"); err != nil {
		fmt.Fprintln(o.Err, "timebox runs list:", err)
		return ExitUsage
	}
	if timeline && *asJSON {
		fmt.Fprintln(o.Err, "timebox runs show: --timeline draws for a person; --json writes the record and its events for a program: choose one")
		return ExitUsage
	}
	db := setting(fs, "db", *dbFlag, "TIMEBOX_DB", o, stateDB(o))
	if db == "" {
		fmt.Fprintln(o.Err, `timebox runs: --db is "": name the store, a SQLite file or a postgres:// URL`)
		return ExitUsage
	}
	if _, err := os.Stat(sqlitePath(db)); !postgres.IsURL(db) && errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(o.Err, "timebox runs: no store at %s: nothing was stored there yet (timebox run and timebox serve store their turns in %s unless --db or TIMEBOX_DB names another store)\n",
			storeName(db), stateDB(o))
		return ExitFailed
	}
	ended, traced := readerEnds(ctx, o, "runs")
	defer traced()
	st, err := openStore(db, false, o, ended)
	if err != nil && !postgres.IsURL(db) {
		// What was stored stays readable when the store cannot be opened
		// to write (a full disk).
		var rerr error
		if st, rerr = sqlite.OpenReadOnly(sqlitePath(db)); rerr == nil {
			fmt.Fprintf(o.Err, "timebox runs: %v; reading it without writing\n", err)
			err = nil
		}
	}
	if err != nil {
		fmt.Fprintln(o.Err, "timebox runs:", err)
		return ExitFailed
	}
	defer st.Close()

	r := runsStore{st: st, where: storeName(db)}
	switch sub {
	case "list":
		return r.list(ctx, f, *asJSON, o)
	case "show":
		if timeline {
			return r.timeline(ctx, pos[0], o)
		}
		return r.show(ctx, pos[0], *asJSON, o)
	default:
		return r.export(ctx, pos[0], o)
	}
}

// runsStore is the store `timebox runs` reads, and where it is, for
// messages.
type runsStore struct {
	st    store.Store
	where string
}

// storeName returns where a --db value keeps turns, fit to print: the
// SQLite file's absolute path, a PostgreSQL URL without its password.
func storeName(db string) string {
	switch {
	case db == "":
		return "memory only"
	case postgres.IsURL(db):
		return postgres.Redact(db)
	}
	if abs, err := filepath.Abs(sqlitePath(db)); err == nil {
		return abs
	}
	return sqlitePath(db)
}

func (r runsStore) notFound(err error, id string, o IO) int {
	if errors.Is(err, store.ErrNotFound) {
		fmt.Fprintf(o.Err, "timebox runs: no turn %s in the store at %s (timebox runs list shows the turns stored there; --db or TIMEBOX_DB names another store)\n", id, r.where)
	} else {
		fmt.Fprintln(o.Err, "timebox runs:", err)
	}
	return ExitFailed
}

func (r runsStore) list(ctx context.Context, f store.Filter, asJSON bool, o IO) int {
	st := r.st
	turns, err := st.Turns(ctx, f)
	if err != nil {
		return r.notFound(err, f.Before, o)
	}
	if asJSON {
		enc := json.NewEncoder(o.Out)
		for _, t := range turns {
			enc.Encode(t)
		}
		return ExitOK
	}
	if len(turns) == 0 {
		fmt.Fprintf(o.Err, "no turns match in the store at %s\n", r.where)
		return ExitOK
	}
	tw := tabwriter.NewWriter(termSafe{o.Out}, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TURN\tSTARTED\tSTATUS\tSTOP REASON\tWALL\tSTEPS\tTOOLS\tINPUT")
	for _, t := range turns {
		wall := ms(t.WallMS)
		if t.Status == budget.StatusRunning {
			wall = fmtElapsed(time.Since(t.StartedAt)) + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", t.TurnID, t.StartedAt.Local().Format("2006-01-02 15:04:05"),
			t.Status, dash(string(t.StopReason)), wall, t.Steps, t.ToolCalls, clip(firstLine(t.Input), 48))
	}
	tw.Flush()
	return ExitOK
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func (r runsStore) show(ctx context.Context, id string, asJSON bool, o IO) int {
	st := r.st
	rec, err := st.Turn(ctx, id)
	if err != nil {
		return r.notFound(err, id, o)
	}
	if asJSON {
		if rec.Events, err = st.Events(ctx, id, 0, 0); err != nil {
			return r.notFound(err, id, o)
		}
		enc := json.NewEncoder(o.Out)
		enc.SetIndent("", "  ")
		enc.Encode(rec)
		return ExitOK
	}
	writeRecord(termSafe{o.Out}, rec)
	evs, err := st.Events(ctx, id, 0, 0)
	if err == nil {
		fmt.Fprintf(o.Out, "\n%d events: timebox runs export %s\n", len(evs), id)
	}
	return ExitOK
}

// writeRecord prints a turn's record for a person: how it ended, then each
// call against its budget.
func writeRecord(w io.Writer, r *event.Turn) {
	head := "turn " + r.TurnID
	if r.SessionID != "" {
		head += " · session " + r.SessionID
	}
	if r.Agent != "" {
		head += " · agent " + r.Agent
	}
	fmt.Fprintln(w, head)
	fmt.Fprintf(w, "started  %s\n", r.StartedAt.Local().Format("2006-01-02 15:04:05.000"))
	fmt.Fprintf(w, "input    %s\n", clip(strings.ReplaceAll(r.Input, "\n", " "), 200))
	if r.Status == budget.StatusRunning {
		fmt.Fprintf(w, "status   running for %s · %d step%s so far\n", fmtElapsed(time.Since(r.StartedAt)), r.Steps, plural(r.Steps))
	} else {
		people := ""
		if r.ApprovalMS > 0 {
			// Part of the wall clock, and not of the turn's ceiling: said,
			// so that "after 2h" is not read as a slow turn.
			people = " · waiting for people " + ms(r.ApprovalMS)
		}
		fmt.Fprintf(w, "status   %s (%s) after %s · %d step%s · model %s · tools %s%s\n", r.Status, r.StopReason, ms(r.WallMS),
			r.Steps, plural(r.Steps), ms(r.LLMMS), ms(r.ToolMS), people)
		var flags []string
		if r.Flags.TimedOutByTurnBudget {
			flags = append(flags, "timed_out_by_turn_budget")
		}
		if r.Flags.TimedOutDuringToolExecution {
			flags = append(flags, "timed_out_during_tool_execution")
		}
		if r.Flags.TimedOutDuringCompaction {
			flags = append(flags, "timed_out_during_compaction")
		}
		if len(flags) > 0 {
			fmt.Fprintf(w, "flags    %s\n", strings.Join(flags, ", "))
		}
		if r.Failovers > 0 {
			fmt.Fprintf(w, "failover %d\n", r.Failovers)
		}
		fmt.Fprintf(w, "message  %s\n", r.Message)
	}
	if len(r.ToolCalls) > 0 {
		fmt.Fprintln(w, "\ntool calls")
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "CALL\tTOOL\tOUTCOME\tTOOK\tBUDGET\tSOURCE\tENFORCEMENT\tNOTES")
		for _, c := range r.ToolCalls {
			budgetText := "-"
			if c.TimeoutMS > 0 {
				budgetText = ms(c.TimeoutMS)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.CallID, c.Tool, c.Outcome, ms(c.DurationMS), budgetText,
				dash(string(c.TimeoutSource)), dash(string(c.Enforcement)), callNotes(c))
		}
		tw.Flush()
	}
	if len(r.ModelCalls) > 0 {
		fmt.Fprintln(w, "\nmodel calls")
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tATTEMPT\tMODEL\tPROFILE\tFIRST CHUNK\tSTREAM\tOUTCOME\tNOTES")
		for _, m := range r.ModelCalls {
			notes := ""
			if m.Phase != "" {
				notes = "phase " + string(m.Phase)
			}
			if m.Error != "" {
				notes = strings.TrimSpace(notes + " " + clip(m.Error, 80))
			}
			fmt.Fprintf(tw, "%d\t%d\t%s:%s\t%s\t%s\t%s\t%s\t%s\n", m.Step, m.Attempt, m.Provider, m.Model, dash(m.Profile),
				ms(m.FirstChunkMS), ms(m.StreamMS), m.Outcome, notes)
		}
		tw.Flush()
	}
}

func callNotes(c event.ToolCall) string {
	var n []string
	if c.Phase != "" {
		n = append(n, "phase "+string(c.Phase))
	}
	if c.ApprovalMS > 0 {
		n = append(n, "waited "+ms(c.ApprovalMS)+" for a person")
	}
	if c.Overran {
		n = append(n, "overran")
	}
	if c.Abandoned {
		n = append(n, "abandoned")
	}
	if c.Outcome == event.OutcomeInterrupted {
		n = append(n, "took at least this: timebox stopped before the call ended")
	}
	if c.LateResult {
		n = append(n, "late result")
	}
	if c.ProgressCount > 0 {
		n = append(n, fmt.Sprintf("%d progress", c.ProgressCount))
	}
	if c.ExitCode != nil && *c.ExitCode != 0 {
		n = append(n, fmt.Sprintf("exit %d", *c.ExitCode))
	}
	if c.Truncated {
		n = append(n, "truncated")
	}
	return strings.Join(n, ", ")
}

func (r runsStore) export(ctx context.Context, id string, o IO) int {
	st := r.st
	bw := bufio.NewWriter(o.Out)
	defer bw.Flush()
	after := int64(0)
	for {
		evs, err := st.Events(ctx, id, after, 1000)
		if err != nil {
			return r.notFound(err, id, o)
		}
		for _, e := range evs {
			b, err := json.Marshal(e)
			if err != nil {
				fmt.Fprintln(o.Err, "timebox runs:", err)
				return ExitFailed
			}
			bw.Write(b)
			bw.WriteByte('\n')
			after = e.Seq
		}
		if len(evs) < 1000 {
			return ExitOK
		}
	}
}

// runStore is how `timebox run` stores its turn: the store, and the
// recorder that is the turn's sink. A nil *runStore stores nothing.
type runStore struct {
	st  store.Store
	rec *store.Recorder
	// cancelled signals a cancel request for the turn made through
	// another process sharing the store (timebox serve on PostgreSQL).
	cancelled <-chan struct{}
	unwatch   func()
	turnID    string
	// engine names the engine whose workers store the turn
	// (store.TurnStart.Engine); empty: this process stores it.
	engine string
}

// stateDB returns where every command keeps its turns unless told
// otherwise (run, serve, and runs reading them): timebox.db in the
// user's state directory ($XDG_STATE_HOME/timebox, else
// ~/.local/state/timebox), or in the working directory when neither
// variable is set (docs/decisions/where-turns-are-stored.md).
func stateDB(o IO) string {
	if d := o.getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "timebox", defaultDB)
	}
	if h := o.getenv("HOME"); filepath.IsAbs(h) {
		return filepath.Join(h, ".local", "state", "timebox", defaultDB)
	}
	return defaultDB
}

// openRunStore opens the store `timebox run` writes to: --db, else
// TIMEBOX_DB, else stateDB; nothing with --no-store or --db "". The
// default store that cannot be opened is a warning, not a failure: the
// turn is what the user asked for. One the user named (--db, TIMEBOX_DB)
// that cannot be opened — a directory, a file that is no database — is
// refused (ok false), as the README says: they asked for the turn there.
func openRunStore(fs *flag.FlagSet, db string, noStore bool, o IO, ended func(store.Ending)) (rs *runStore, ok bool) {
	path, from := settingFrom(fs, "db", db, "TIMEBOX_DB", o, stateDB(o))
	if noStore || path == "" {
		return nil, true
	}
	st, err := openStore(path, false, o, ended)
	if err != nil {
		if from != "the default" {
			fmt.Fprintf(o.Err, "timebox run: %v (from %s); nothing was run (--no-store runs without storing)\n", err, from)
			return nil, false
		}
		fmt.Fprintf(o.Err, "warning: %v; the turn will not be stored (--no-store silences this)\n", err)
		return nil, true
	}
	return &runStore{st: st, rec: store.NewRecorder(st)}, true
}

// begin records the turn as running and fills its id and session history.
// On failure it warns and stores nothing more — but for a session that has
// a turn running, which it refuses (an error): one turn runs at a time in
// a session, whoever runs it, and a second would read the history without
// the first's and not be stored in it.
func (r *runStore) begin(ctx context.Context, in *agent.Input, agentName string, o IO) error {
	if r == nil {
		return nil
	}
	in.TurnID = agent.NewTurnID()
	r.turnID = in.TurnID
	// Watching before the turn is stored, so that no request is missed.
	r.cancelled, r.unwatch = r.st.WatchCancel(in.TurnID)
	ts := store.TurnStart{TurnID: in.TurnID, SessionID: in.SessionID, Agent: agentName, Input: in.Text, StartedAt: time.Now(), Engine: r.engine}
	if o, ok := r.st.(store.Owned); ok && r.engine != "" {
		// The turn runs on an engine's workers: when this run is gone,
		// it is cancelled as client_gone, and a live gateway adopts it;
		// meanwhile this run follows it, and no gateway does.
		ts.Caller, ts.Follower = o.Owner(), o.Owner()
	}
	if err := r.rec.Begin(ctx, ts); err != nil {
		r.rec = nil
		r.unwatch()
		if errors.Is(err, store.ErrSessionBusy) {
			return fmt.Errorf("session %s has a turn running; wait for it to end (timebox runs list --session %s), or use another --session", in.SessionID, in.SessionID)
		}
		fmt.Fprintf(o.Err, "warning: %v; the turn will not be stored\n", err)
	}
	// Read once the turn holds the session, so that a turn of the session
	// another process was ending meanwhile is in it.
	if in.SessionID != "" {
		h, err := r.st.History(ctx, in.SessionID)
		if err != nil {
			fmt.Fprintf(o.Err, "warning: reading session %s: %v\n", in.SessionID, err)
		}
		in.History = h
	}
	return nil
}

// cancellable returns ctx cancelled (stop reason cancelled) when a cancel
// request for the turn comes through the store — `POST
// /v1/turns/ID/cancel` to a timebox serve sharing a PostgreSQL store —
// and the function that ends the watch.
func (r *runStore) cancellable(ctx context.Context) (context.Context, func()) {
	if r == nil || r.rec == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-r.cancelled:
			cancel(store.WhyCancelled(r.st, r.turnID, "a client of timebox serve"))
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		r.unwatch()
		cancel(nil)
	}
}

// sink returns the recorder as the turn's first sink, or nil.
func (r *runStore) sinks(others ...event.Sink) []event.Sink {
	if r == nil || r.rec == nil {
		return others
	}
	return append([]event.Sink{r.rec}, others...)
}

// finish stores the record and closes the store.
func (r *runStore) finish(rec *event.Turn, msgs []model.Message, o IO) {
	r.finishUnless(rec, msgs, nil, o)
}

// finishWait bounds how long `timebox run` waits, its turn over, for a
// store that is away to take the turn's end; waitNoteAfter is when it says
// that it waits.
const (
	finishWait    = 30 * time.Second
	waitNoteAfter = 2 * time.Second
)

// finishUnless stores the turn's end and closes the store, waiting for a
// store that is away at most finishWait, or until stop is closed (a
// Ctrl-C after the turn ended), and saying so while it waits.
func (r *runStore) finishUnless(rec *event.Turn, msgs []model.Message, stop <-chan struct{}, o IO) {
	if r == nil {
		return
	}
	if r.rec != nil && r.engine == "" && rec != nil {
		ctx, cancel := context.WithTimeout(context.Background(), finishWait)
		defer cancel()
		note := time.AfterFunc(waitNoteAfter, func() {
			fmt.Fprintf(o.Err, "timebox run: waiting for the store to take the turn's end (it is away; at most %s more; Ctrl-C stops waiting)\n", finishWait-waitNoteAfter)
		})
		defer note.Stop()
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := r.rec.Finish(ctx, rec, msgs); err != nil {
			if errors.Is(err, sqlite.ErrDiskFull) {
				fmt.Fprintf(o.Err, "timebox run: the disk holding the store is full: %v. The answer above is all there is of this turn's events; `timebox runs show %s` shows what was stored. Free space on that disk.\n", err, rec.TurnID)
			} else {
				fmt.Fprintf(o.Err, "warning: %v\n", err)
			}
		} else if n, err := r.rec.MadeGood(); n > 0 {
			fmt.Fprintf(o.Err, "timebox run: %d writes of this turn's events failed as it ran (the first: %v); its end stored them.\n", n, err)
		}
	}
	if err := r.st.Close(); err != nil {
		fmt.Fprintf(o.Err, "warning: closing the store: %v\n", err)
	}
}
