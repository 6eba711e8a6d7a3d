// Package cli is the timebox command: run, validate, tool call, serve,
// runs, stats, version. cmd/timebox is a thin main over Run so the whole
// command is testable in-process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/telemetry"
)

// Exit codes (spec §11).
const (
	ExitOK        = 0
	ExitFailed    = 1
	ExitUsage     = 2
	ExitStopped   = 3
	ExitCancelled = 130
)

// IO is the command's environment: its streams and variables.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
	// Env is the environment in os.Environ form.
	Env []string
	// Terminal reports whether Out is a terminal (live view and colour).
	Terminal bool
	// InTerminal reports whether In is a terminal: `timebox run` asks its
	// approvals there.
	InTerminal bool
}

// Std returns the process's own IO.
func Std() IO {
	return IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Env: os.Environ(),
		Terminal: term.IsTerminal(int(os.Stdout.Fd())) && os.Getenv("TERM") != "dumb", InTerminal: term.IsTerminal(int(os.Stdin.Fd()))}
}

func (o IO) getenv(k string) string {
	v, _ := o.lookupEnv(k)
	return v
}

// lookupEnv returns a variable's value and whether it is set at all (to
// tell an empty variable from an unset one).
func (o IO) lookupEnv(k string) (string, bool) {
	for i := len(o.Env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(o.Env[i], k+"="); ok {
			return v, true
		}
	}
	return "", false
}

const usage = `timebox runs LLM agent turns in honest, enforced, explained, measured time budgets.

Usage:
  timebox run [-f agent.yaml] [--json] [budget flags] "prompt"   one turn, live view (--json: events as JSON lines)
  timebox validate [-f agent.yaml] [budget flags]                check the agent file, print the resolved budgets
  timebox tool call NAME --input '{...}' [-f agent.yaml]          one tool call under its budget; prints its record
  timebox serve [-f agent.yaml] [--addr 127.0.0.1:8080]           HTTP/SSE API and web page
  timebox mcp serve [-f agent.yaml] [--addr HOST:PORT] [budget flags]
                                                                  the agent's tools as an MCP server (stdio, or streamable HTTP with --addr)
  timebox worker -f agent.yaml --db postgres://… [--temporal-address HOST:PORT]
                                                                  run turns on Temporal (run/serve --engine temporal start them)
  timebox runs list|show ID|export ID                             stored turns
  timebox stats [--since 30d] [--tool NAME] [--json] [--apply]    per tool and model endpoint: durations, outcomes, suggested timeouts
  timebox schema                                                  the agent file's JSON Schema, for editors
  timebox version

Exit codes: 0 completed, 1 failed, 2 usage or configuration error, 3 stopped by a budget, 130 cancelled.
Run 'timebox COMMAND -h' for a command's flags.
`

// Run runs the command line args (without the program name) and returns the
// exit code.
func Run(ctx context.Context, args []string, o IO) int {
	// Remove this process's (empty) tool cgroups on the way out.
	defer proctree.Close()
	if len(args) == 0 {
		fmt.Fprint(o.Err, usage)
		return ExitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(ctx, args[1:], o)
	case "validate":
		return cmdValidate(args[1:], o)
	case "tool":
		if len(args) < 2 || args[1] != "call" {
			toolUsage := synopses["tool call"]
			if len(args) == 2 && isHelp(args[1]) {
				fmt.Fprintln(o.Out, toolUsage)
				return ExitOK
			}
			if len(args) >= 2 && !strings.HasPrefix(args[1], "-") {
				fmt.Fprintln(o.Err, unknownWord("tool", args[1], []string{"call"}))
			}
			fmt.Fprintln(o.Err, toolUsage)
			return ExitUsage
		}
		return cmdToolCall(ctx, args[2:], o)
	case "serve":
		return cmdServe(ctx, args[1:], o)
	case "mcp":
		return cmdMCP(ctx, args[1:], o)
	case "worker":
		return cmdWorker(ctx, args[1:], o)
	case "runs":
		return cmdRuns(ctx, args[1:], o)
	case "stats":
		return cmdStats(ctx, args[1:], o)
	case "schema":
		return cmdSchema(args[1:], o)
	case "version", "--version", "-v":
		fmt.Fprint(o.Out, versionText())
		return ExitOK
	case "help", "-h", "--help":
		fmt.Fprint(o.Out, usage)
		return ExitOK
	}
	if meant := problem.Suggest(args[0], commands); meant != "" && len(args[0]) > 1 {
		fmt.Fprintf(o.Err, "timebox: unknown command %q; did you mean %q?\n\n%s", args[0], meant, usage)
		return ExitUsage
	}
	fmt.Fprintf(o.Err, "timebox: unknown command %q\n\n%s", args[0], usage)
	return ExitUsage
}

// synopses are the usage lines of the commands whose flags newFlags
// makes and that have no usage text of their own: their -h starts with
// it, as every command's does, and a mistake in their arguments repeats it.
var synopses = map[string]string{
	"run":       `usage: timebox run [-f agent.yaml] [--json] [budget flags] "prompt"   (or "-" to read it from stdin)`,
	"serve":     "usage: timebox serve [-f agent.yaml] [--addr 127.0.0.1:8080] [--token T] [--db STORE] [budget flags]",
	"tool call": "usage: timebox tool call NAME --input '{...}' [-f agent.yaml] [budget flags]",
	"mcp serve": "usage: timebox mcp serve [-f agent.yaml] [--addr host:port [--token T]] [--db STORE | --no-store] [budget flags]   (MCP over stdin and stdout, or over streamable HTTP with --addr)",
	"worker":    "usage: timebox worker -f agent.yaml --db postgres://… [--temporal-address HOST:PORT] [budget flags]",
}

// about says, in a command's -h, between its usage line and its flags,
// what a person needs that the flags do not say.
var about = map[string]string{
	"run": `Runs one turn of the agent: the prompt in, the answer (or why it stopped)
out, with a live view of every model and tool call under its budget.
Exit 0 completed, 1 failed, 2 usage or configuration error, 3 stopped by a
budget, 130 cancelled.

`,
}

// common holds the flags every command that loads an agent file has.
type common struct {
	file     string
	settings map[string]*string
}

func newFlags(name string, o IO) (*flag.FlagSet, *common) {
	fs := flag.NewFlagSet("timebox "+name, flag.ContinueOnError)
	fs.SetOutput(o.Err)
	c := &common{settings: map[string]*string{}}
	fs.StringVar(&c.file, "f", "agent.yaml", "the agent file")
	for _, s := range config.Settings {
		if s.ServeOnly && name != "serve" && name != "validate" {
			continue
		}
		def := s.Default
		if def == "0" {
			def = "off"
		}
		c.settings[s.Key] = fs.String(s.Flag, "", fmt.Sprintf("%s (%s, default %s; env %s)", s.Doc, s.Key, def, s.Env))
	}
	fs.Usage = func() {
		if s, ok := synopses[name]; ok {
			fmt.Fprintf(fs.Output(), "%s\n\n%s", s, about[name])
		} else {
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		}
		printFlags(fs, name)
	}
	return fs, c
}

// budgetFlagsNote heads the budget flags in a command's -h, saying what
// they do there: not every command runs a turn.
var budgetFlagsNote = map[string]string{
	"validate":  "Budget flags (flag > TIMEBOX_* > agent file > default): validate resolves them as run would, and prints and checks what each tool and the turn get:",
	"stats":     "Budget flags: only the tools' timeouts (--tool-timeout, --tool-max), --llm-first-chunk-timeout and --compaction-timeout change the report (the budget it compares the calls with); the others do nothing here:",
	"mcp serve": "Budget flags: only the tools' apply (--tool-timeout, --tool-max, --kill-grace, --max-tool-output, --parallel-tools); those of the turn and the model are accepted and do nothing, since there is no turn:",
}

// printFlags prints the flags of a command made by newFlags: its own
// first, then the budget settings under a heading that says what they do
// for this command.
func printFlags(fs *flag.FlagSet, name string) {
	budgetFlag := map[string]bool{}
	for _, s := range config.Settings {
		budgetFlag[s.Flag] = true
	}
	own, budgets := flag.NewFlagSet("", flag.ContinueOnError), flag.NewFlagSet("", flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		to := own
		if budgetFlag[f.Name] {
			to = budgets
		}
		to.Var(f.Value, f.Name, f.Usage)
	})
	own.SetOutput(fs.Output())
	budgets.SetOutput(fs.Output())
	own.PrintDefaults()
	note, ok := budgetFlagsNote[name]
	if !ok {
		note = "Budget flags (flag > TIMEBOX_* > agent file > default):"
	}
	fmt.Fprintf(fs.Output(), "\n%s\n", note)
	budgets.PrintDefaults()
}

// overrides returns the flags that were set and the environment.
func (c *common) overrides(fs *flag.FlagSet, o IO) config.Overrides {
	ov := config.Overrides{Flags: map[string]string{}, Env: o.Env}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range config.Settings {
		if set[s.Flag] && c.settings[s.Key] != nil {
			ov.Flags[s.Key] = *c.settings[s.Key]
		}
	}
	return ov
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// isHelp reports whether arg asks for a command's usage.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// usageExit returns the exit code of a command whose flags did not parse:
// ExitOK when -h or --help asked for the usage (which the flag set printed),
// ExitUsage for a flag error.
func usageExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	return ExitUsage
}

// parse parses flags and positional arguments in any order. -h prints
// the command's usage; a flag error prints the error, the flag meant when
// one is near, and how to see them all — not the sixty lines of flags,
// which would scroll the error out of sight.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	full := fs.Usage
	if full == nil {
		full = func() {
			fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
		}
	}
	fs.Usage = func() {}
	defer func() { fs.Usage = full }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				full()
			} else {
				flagHint(fs, err)
			}
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		rest := fs.Args()
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// flagHint follows the flag package's line for err (which it printed)
// with the flag meant, when a defined one is a letter or two away, and
// where the rest are.
func flagHint(fs *flag.FlagSet, err error) {
	w := fs.Output()
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) }) // in name order
		best := problem.Suggest(name, names)
		switch strings.TrimPrefix(name, "-") {
		case "agent", "agent-file", "file", "config", "c":
			if fs.Lookup("f") != nil {
				best = "f" // the agent file, as other tools name it
			}
		}
		switch {
		case best == "" || len(name) < 2:
		case len(best) == 1:
			fmt.Fprintf(w, "Did you mean -%s?\n", best)
		default:
			fmt.Fprintf(w, "Did you mean --%s?\n", best)
		}
	}
	fmt.Fprintf(w, "Run '%s -h' for its flags.\n", fs.Name())
}

// commands are timebox's commands, for the one meant by a misspelt one.
var commands = []string{"run", "validate", "tool", "serve", "mcp", "worker", "runs", "stats", "schema", "version", "help"}

// unknownWord is the line for a subcommand of cmd that is none of known:
// `timebox runs: unknown subcommand "lsit" (did you mean list?)`, by the
// rule every misspelt name of timebox's is met with (problem.Suggest).
func unknownWord(cmd, word string, known []string) string {
	return fmt.Sprintf("timebox %s: unknown subcommand %q%s", cmd, word, problem.DidYouMean(word, known))
}

// tookLastWord reports whether the last of args is a word without a digit
// that a budget flag before it took as its value ("--max-steps hi"): no
// duration, count or size, so the person meant it as the prompt. It names
// the flag.
func tookLastWord(args []string) (name, value string, ok bool) {
	if len(args) < 2 {
		return "", "", false
	}
	prev, last := args[len(args)-2], args[len(args)-1]
	if strings.Contains(prev, "=") || strings.ContainsAny(last, "0123456789") {
		return "", "", false
	}
	for _, s := range config.Settings {
		if prev == "-"+s.Flag || prev == "--"+s.Flag {
			return prev, last, true
		}
	}
	return "", "", false
}

// loadToRun begins a command that runs tools (run, tool call, mcp serve,
// worker): it loads the agent file (loadConfig), stops the tool processes
// a timebox that died left running before this one runs any
// (reapOrphans), and returns ctx cancelled on an interrupt (interrupts),
// with the stop to defer. ok is false, with nothing begun, when the agent
// file cannot be used: its problems are printed.
func loadToRun(ctx context.Context, c *common, fs *flag.FlagSet, o IO) (_ *config.Agent, _ context.Context, stop func(), ok bool) {
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return nil, ctx, nil, false
	}
	reapOrphans(o)
	ctx, stop = interrupts(ctx, o)
	return cfg, ctx, stop, true
}

// loadConfig loads the agent file and prints every problem on failure.
func loadConfig(c *common, fs *flag.FlagSet, o IO) (*config.Agent, bool) {
	cfg, err := config.Load(c.file, c.overrides(fs, o))
	if err != nil {
		printConfigError(o.Err, err)
		if !flagSet(fs, "f") {
			if _, serr := os.Stat(c.file); errors.Is(serr, os.ErrNotExist) {
				fmt.Fprintf(o.Err, "No -f was given, so timebox looked for %s in this directory; name an agent file with -f FILE (the demo's: -f examples/demo/agent.yaml in a clone of timebox).\n", c.file)
			}
		}
		return nil, false
	}
	// A strategy this platform lacks, or cgroup where none is usable, is
	// refused here, before anything runs, not at each tool call.
	if err := proctree.Check(o.getenv(proctree.EnvStrategy)); err != nil {
		fmt.Fprintln(o.Err, err)
		return nil, false
	}
	if err := telemetry.Check(o.getenv); err != nil {
		fmt.Fprintln(o.Err, err)
		fmt.Fprintln(o.Err, "1 problem; nothing was run.")
		return nil, false
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(o.Err, "warning:", w)
	}
	return cfg, true
}

// startTracing sets up tracing from the OTEL_* variables
// (telemetry.FromEnv): nothing when they name no endpoint.
func startTracing(ctx context.Context, o IO) (*telemetry.Tracing, bool) {
	t, err := telemetry.FromEnv(ctx, o.getenv)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return nil, false
	}
	return t, true
}

// tracedEnds returns what a store tells of each turn it ends from outside
// its process — its own died, or a gateway ends a turn no worker runs —
// when spans are exported: the turn's invoke_agent span, which died with
// the process that began it, made again with its ids, so that the spans
// of its calls have their parent, and those of the calls that were
// running, which died with it too (docs/decisions/turn-span-of-a-lost-turn.md).
// Nil without tracing.
func tracedEnds(t *telemetry.Tracing) func(store.Ending) {
	if t == nil || t.Provider == nil {
		return nil
	}
	return func(e store.Ending) {
		agent.TraceEnded(t.Provider, e.TurnID, e.Started, &e.Record, e.Attempt, e.Calls...)
	}
}

// readerEnds is tracedEnds for a command that reads turns (runs, stats,
// validate) and traces nothing of its own, but whose store may end turns
// from outside as it opens — those of a timebox process that died, or of
// a gateway gone — and so makes their spans, or no one does. Tracing is
// started only when the OTEL_* variables ask for it, so nothing is slower
// without them; done exports what was made, after the store is closed.
// A tracing setting that cannot be used is a warning: the command reads
// on, and the spans are not made.
func readerEnds(ctx context.Context, o IO, cmd string) (ended func(store.Ending), done func()) {
	t, err := telemetry.FromEnv(ctx, o.getenv)
	if err != nil {
		fmt.Fprintf(o.Err, "timebox %s: %v; the spans of the turns it ends are not made\n", cmd, err)
		return nil, func() {}
	}
	if t.Provider == nil {
		return nil, func() {}
	}
	return tracedEnds(t), func() { stopTracing(t, o) }
}

// stopTracing exports the spans still buffered, waiting at most 5s for
// the collector.
func stopTracing(t *telemetry.Tracing, o IO) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		fmt.Fprintf(o.Err, "timebox: exporting the last spans to %s: %v\n", t.Endpoint, err)
	}
}

func printConfigError(w io.Writer, err error) {
	var errs config.Errors
	if errors.As(err, &errs) {
		for _, e := range errs {
			fmt.Fprintln(w, e.Error())
		}
		fmt.Fprintf(w, "%d problem%s; nothing was run.\n", len(errs), plural(len(errs)))
		return
	}
	fmt.Fprintln(w, "timebox:", err)
}

// errorMessage returns the message of a tool result that is an error
// object, or the result itself.
func errorMessage(result string) string {
	var v struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(result), &v) == nil && v.Error.Message != "" {
		return v.Error.Message
	}
	return result
}
