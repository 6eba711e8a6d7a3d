package budget

import (
	"fmt"
	"strconv"
	"time"
)

// Kind is the type of a knob's value.
type Kind string

// The kinds of knob.
const (
	// KindDuration is a Go duration: 750ms, 30s, 1h30m. Values are in
	// nanoseconds.
	KindDuration Kind = "duration"
	// KindCount is a whole number.
	KindCount Kind = "count"
	// KindBytes is a size in bytes: 1048576, 512KiB, 1MiB, 1GiB.
	KindBytes Kind = "bytes"
)

// SourceRequest is the source of a budget a turn's caller set for that turn
// alone: the "budgets" of POST /v1/turns, or agent.Input.Budgets.
const SourceRequest Source = "request"

// Knob is one budget of a turn: its agent-file key, the flag and variable
// that also set it, its default and bounds, whether it can be off, whether
// one request may set it for its own turn, and where its resolved value
// lives in Budgets or Limits. Everything that names, resolves, checks or
// explains a budget reads it from Knobs, so that adding a budget is one
// entry there (docs/decisions/one-table-of-knobs.md).
type Knob struct {
	// Key is the agent-file key, "timeouts.turn". It is the knob named in
	// messages when the value came from the file or the default.
	Key string
	// Name is the key without its section, "turn": a request's "budgets"
	// and server.request_max use it.
	Name string
	// Flag is the command-line flag without its dashes, "turn-timeout".
	Flag string
	// Env is the environment variable, "TIMEBOX_TURN_TIMEOUT".
	Env string
	// Kind says what the value is: a duration, a count or a size.
	Kind Kind
	// Default is the built-in value: nanoseconds, a count or bytes. Zero
	// is off (or "at once" for a grace).
	Default int64
	// Min and Max bound a value other than zero.
	Min, Max int64
	// CanBeOff allows 0 although it is below Min: it means off, or "at
	// once" for the kill grace.
	CanBeOff bool
	// Request says whether one turn's caller may set it for that turn.
	Request bool
	// Doc is a short description for flag help and the reference docs.
	Doc string
	// Stops is the stop reason of a turn this budget ended, if it can end
	// one.
	Stops StopReason

	dur   func(*Budgets) *Duration
	count func(*Limits) *Count
}

// The usual bounds of a duration knob.
const (
	MinDuration = int64(time.Millisecond)
	MaxDuration = int64(24 * time.Hour)
	// MaxTurn bounds timeouts.turn: long agentic tasks run for days, and
	// the turn is the ceiling of them all (spec §2).
	MaxTurn = int64(7 * 24 * time.Hour)
)

func durKnob(key, flag, env string, def time.Duration, canBeOff, request bool, doc string, at func(*Budgets) *Duration) Knob {
	return Knob{Key: key, Name: name(key), Flag: flag, Env: env, Kind: KindDuration, Default: int64(def),
		Min: MinDuration, Max: MaxDuration, CanBeOff: canBeOff, Request: request, Doc: doc, dur: at}
}

func countKnob(key, flag, env string, def, lo, hi int64, request bool, doc string, at func(*Limits) *Count) Knob {
	return Knob{Key: key, Name: name(key), Flag: flag, Env: env, Kind: KindCount, Default: def,
		Min: lo, Max: hi, Request: request, Doc: doc, count: at}
}

func bytesKnob(key, flag, env string, def, lo, hi int64, doc string, at func(*Limits) *Count) Knob {
	return Knob{Key: key, Name: name(key), Flag: flag, Env: env, Kind: KindBytes, Default: def,
		Min: lo, Max: hi, Doc: doc, count: at}
}

func name(key string) string {
	for i := range len(key) {
		if key[i] == '.' {
			return key[i+1:]
		}
	}
	return key
}

// Knobs are the budgets of a turn, in the order `timebox validate` lists
// them. Do not modify it.
var Knobs = []Knob{
	durKnob(KeyTool, "tool-timeout", "TIMEBOX_TOOL_TIMEOUT", 60*time.Second, false, true,
		"each tool call's wall clock, unless the tool sets its own",
		func(b *Budgets) *Duration { return &b.Tool }),
	durKnob(KeyToolMax, "tool-max", "TIMEBOX_TOOL_MAX", time.Hour, false, false,
		"the largest timeout any tool may declare",
		func(b *Budgets) *Duration { return &b.ToolMax }),
	durKnob(KeyLLMFirstChunk, "llm-first-chunk-timeout", "TIMEBOX_LLM_FIRST_CHUNK_TIMEOUT", 60*time.Second, true, false,
		"from sending a model request to its first stream chunk; 0 is off",
		func(b *Budgets) *Duration { return &b.LLMFirstChunk }),
	durKnob(KeyLLMIdle, "llm-idle-timeout", "TIMEBOX_LLM_IDLE_TIMEOUT", 120*time.Second, true, false,
		"longest silence between chunks of one model stream; 0 is off",
		func(b *Budgets) *Duration { return &b.LLMIdle }),
	stops(LLMBudgetExhausted, durKnob(KeyLLMBudget, "llm-budget", "TIMEBOX_LLM_BUDGET", 0, true, true,
		"total model-streaming time in a turn, tool time excluded; 0 is off",
		func(b *Budgets) *Duration { return &b.LLMBudget })),
	stops(NoProgress, durKnob(KeyStep, "step-timeout", "TIMEBOX_STEP_TIMEOUT", 5*time.Minute, true, true,
		"longest time a turn may go without any progress signal; 0 is off",
		func(b *Budgets) *Duration { return &b.Step })),
	stops(TurnTimeout, upTo(MaxTurn, durKnob(KeyTurn, "turn-timeout", "TIMEBOX_TURN_TIMEOUT", 30*time.Minute, false, true,
		"the whole turn, wall clock",
		func(b *Budgets) *Duration { return &b.Turn }))),
	durKnob(KeyProgressNotice, "progress-notice", "TIMEBOX_PROGRESS_NOTICE", 30*time.Second, true, false,
		"interval of still_working notices for a long step; 0 is off",
		func(b *Budgets) *Duration { return &b.ProgressNotice }),
	durKnob(KeyKillGrace, "kill-grace", "TIMEBOX_KILL_GRACE", 2*time.Second, true, false,
		"between the polite and the forced stop of a tool; 0 stops it at once",
		func(b *Budgets) *Duration { return &b.KillGrace }),
	durKnob(KeyCompaction, "compaction-timeout", "TIMEBOX_COMPACTION_TIMEOUT", 60*time.Second, false, false,
		"one history-compaction model call",
		func(b *Budgets) *Duration { return &b.Compaction }),
	// A person's decision may take a weekend: up to a week, like the
	// turn (docs/decisions/approvals.md).
	upTo(MaxTurn, durKnob(KeyApproval, "approval-timeout", "TIMEBOX_APPROVAL_TIMEOUT", 24*time.Hour, false, false,
		"how long a tool call that needs approval waits for a person's decision; the turn's ceiling does not count the wait",
		func(b *Budgets) *Duration { return &b.Approval })),
	stops(MaxSteps, countKnob(KeyMaxSteps, "max-steps", "TIMEBOX_MAX_STEPS", 25, 1, 100_000, true,
		"model calls per turn",
		func(l *Limits) *Count { return &l.MaxSteps })),
	stops(MaxToolCalls, countKnob(KeyMaxToolCalls, "max-tool-calls", "TIMEBOX_MAX_TOOL_CALLS", 50, 1, 1_000_000, true,
		"tool calls per turn",
		func(l *Limits) *Count { return &l.MaxToolCalls })),
	countKnob(KeyParallelTools, "parallel-tools", "TIMEBOX_PARALLEL_TOOLS", 4, 1, 1024, false,
		"tool calls of one batch running at once",
		func(l *Limits) *Count { return &l.ParallelTools }),
	bytesKnob(KeyMaxToolOutput, "max-tool-output", "TIMEBOX_MAX_TOOL_OUTPUT", 1<<20, 1<<10, 1<<30,
		"bytes of one tool result kept (such as 512KiB, 1MiB)",
		func(l *Limits) *Count { return &l.MaxToolOutput }),
	stops(ModelUnresponsive, countKnob(KeyIdleBreaker, "idle-breaker", "TIMEBOX_IDLE_BREAKER", 3, 1, 1000, false,
		"consecutive model idle timeouts that stop the turn",
		func(l *Limits) *Count { return &l.IdleBreaker })),
	// A reply is held in memory whole, several times over (the stream,
	// the answer, the event log); 16MiB is far past any model's output.
	stops(ReplyTooLong, bytesKnob(KeyMaxReply, "max-reply", "TIMEBOX_MAX_REPLY", 1<<20, 1<<10, 16<<20,
		"bytes of one model reply, text plus tool calls; past it the stream is closed and the turn stops",
		func(l *Limits) *Count { return &l.MaxReply })),
}

func upTo(max int64, k Knob) Knob {
	k.Max = max
	return k
}

func stops(r StopReason, k Knob) Knob {
	k.Stops = r
	return k
}

// KnobFor returns the knob whose budget ends a turn with stop reason r.
func KnobFor(r StopReason) (Knob, bool) {
	for _, k := range Knobs {
		if k.Stops == r && r != "" {
			return k, true
		}
	}
	return Knob{}, false
}

// KnobByKey returns the knob with the agent-file key, "timeouts.turn".
func KnobByKey(key string) (Knob, bool) {
	for _, k := range Knobs {
		if k.Key == key {
			return k, true
		}
	}
	return Knob{}, false
}

// KnobByName returns the knob with the short name a request uses, "turn".
func KnobByName(name string) (Knob, bool) {
	for _, k := range Knobs {
		if k.Name == name {
			return k, true
		}
	}
	return Knob{}, false
}

// IsDuration reports whether the knob's value lives in Budgets (a
// Duration) rather than in Limits (a Count).
func (k Knob) IsDuration() bool { return k.dur != nil }

// Duration returns where the knob's value lives in b; nil for a count.
func (k Knob) Duration(b *Budgets) *Duration {
	if k.dur == nil {
		return nil
	}
	return k.dur(b)
}

// Count returns where the knob's value lives in l; nil for a duration.
func (k Knob) Count(l *Limits) *Count {
	if k.count == nil {
		return nil
	}
	return k.count(l)
}

// Get returns the knob's resolved value in b or l: nanoseconds, a count or
// bytes, with its source and knob text.
func (k Knob) Get(b *Budgets, l *Limits) (int64, Source, string) {
	if d := k.Duration(b); d != nil {
		return int64(d.D), d.Source, d.Knob
	}
	c := k.Count(l)
	return c.N, c.Source, c.Knob
}

// Set stores a resolved value of the knob in b or l.
func (k Knob) Set(b *Budgets, l *Limits, n int64, src Source, knob string) {
	if d := k.Duration(b); d != nil {
		*d = Duration{D: time.Duration(n), Source: src, Knob: knob}
		return
	}
	*k.Count(l) = Count{N: n, Source: src, Knob: knob}
}

// Check says why n, a resolved value of the knob (0 is off where it
// CanBeOff), is not one it takes, or "". config.Load words the file's
// values with their fixes itself; Check holds what a value set elsewhere
// (a request, Go code) must keep to.
func (k Knob) Check(n int64) string {
	switch {
	case n < 0:
		return fmt.Sprintf("%s: %s is negative", k.Key, k.Format(n))
	case n == 0 && k.CanBeOff:
		return ""
	case n == 0:
		return fmt.Sprintf("%s cannot be off", k.Key)
	case n < k.Min:
		return fmt.Sprintf("%s is under %s, the least %s accepts", k.Format(n), k.Format(k.Min), k.Key)
	case n > k.Max:
		return fmt.Sprintf("%s is over %s, the most %s accepts", k.Format(n), k.Format(k.Max), k.Key)
	}
	return ""
}

// Format renders a value of the knob as the agent file writes it: "60s",
// "2m", "1MiB", "25", or "off" for a zero that means off.
func (k Knob) Format(n int64) string {
	switch {
	case n == 0 && k.CanBeOff && k.Key != KeyKillGrace:
		return "off"
	case k.Kind == KindDuration:
		return FormatDuration(time.Duration(n))
	case k.Kind == KindBytes:
		return FormatBytes(n)
	}
	return strconv.FormatInt(n, 10)
}

// Value returns the knob's resolved value in b or l as turn_started,
// turn_finished and `timebox validate` show it.
func (k Knob) Value(b *Budgets, l *Limits) BudgetValue {
	n, src, knob := k.Get(b, l)
	v := BudgetValue{Key: k.Key, Value: k.Format(n), Source: src, Knob: knob}
	if k.Kind == KindDuration {
		v.MS = time.Duration(n).Milliseconds()
	} else {
		v.N = n
	}
	return v
}

// BudgetValue is one resolved budget as events and `timebox validate` show
// it. Value is written as the agent file would ("60s", "25", "1MiB") or
// "off".
type BudgetValue struct {
	// Key is the agent-file key, "timeouts.turn". turn_started's map is
	// keyed by it and leaves it out.
	Key string `json:"key,omitempty"`
	// Value is the value as the agent file writes it: a duration ("60s",
	// "1.5s"), a count ("25"), a size ("1MiB"), or "off".
	Value string `json:"value"`
	// MS is a duration's value in milliseconds; 0 (omitted) for counts,
	// sizes and a budget that is off.
	MS int64 `json:"ms,omitempty"`
	// N is a count's or a size's value; 0 (omitted) for durations.
	N int64 `json:"n,omitempty"`
	// Source is where the value came from.
	Source Source `json:"source"`
	// Knob is what changes it: the agent-file key, the flag
	// ("--tool-timeout") or the variable ("TIMEBOX_TOOL_TIMEOUT") that set
	// it, or "budgets.NAME in the request".
	Knob string `json:"knob"`
}
