package config

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// SettingKind is the type of a process-wide setting's value.
type SettingKind string

// The kinds of setting.
const (
	// KindDuration is a Go duration: 750ms, 30s, 1h30m.
	KindDuration SettingKind = "duration"
	// KindCount is a whole number.
	KindCount SettingKind = "count"
	// KindBytes is a size in bytes: 1048576, 512KiB, 1MiB, 1GiB.
	KindBytes SettingKind = "bytes"
)

// Setting is one process-wide setting: a key of the agent file that a flag
// and a TIMEBOX_* variable may also set. Its value resolves flag >
// environment > agent file > default (spec §2).
type Setting struct {
	// Key is the agent-file key, "timeouts.tool". It is also the knob named
	// in messages when the value came from the file or the default.
	Key string
	// Flag is the command-line flag without its dashes, "tool-timeout".
	Flag string
	// Env is the environment variable, "TIMEBOX_TOOL_TIMEOUT".
	Env  string
	Kind SettingKind
	// Default is the built-in value as it would be written ("60s", "0",
	// "1MiB"); "0" means off.
	Default string
	// Min and Max bound the value: nanoseconds for a duration, the number
	// for a count, bytes for a size.
	Min, Max int64
	// ZeroOK allows 0 although it is below Min: it means off, or "at once"
	// for the graces.
	ZeroOK bool
	// Doc is a short description for flag help.
	Doc string
}

// Settings are the process-wide settings, in the order `timebox validate`
// lists them. The CLI registers one flag per entry; Load reads one
// variable per entry. Do not modify it.
var Settings = []Setting{
	dur(budget.KeyTool, "tool-timeout", "TIMEBOX_TOOL_TIMEOUT", "60s", false,
		"each tool call's wall clock, unless the tool sets its own"),
	dur(budget.KeyToolMax, "tool-max", "TIMEBOX_TOOL_MAX", "1h", false,
		"the largest timeout any tool may declare"),
	dur(budget.KeyLLMFirstChunk, "llm-first-chunk-timeout", "TIMEBOX_LLM_FIRST_CHUNK_TIMEOUT", "60s", true,
		"from sending a model request to its first stream chunk; 0 is off"),
	dur(budget.KeyLLMIdle, "llm-idle-timeout", "TIMEBOX_LLM_IDLE_TIMEOUT", "120s", true,
		"longest silence between chunks of one model stream; 0 is off"),
	dur(budget.KeyLLMBudget, "llm-budget", "TIMEBOX_LLM_BUDGET", "0", true,
		"total model-streaming time in a turn, tool time excluded; 0 is off"),
	dur(budget.KeyStep, "step-timeout", "TIMEBOX_STEP_TIMEOUT", "5m", true,
		"longest time a turn may go without any progress signal; 0 is off"),
	upTo(maxTurn, dur(budget.KeyTurn, "turn-timeout", "TIMEBOX_TURN_TIMEOUT", "30m", false,
		"the whole turn, wall clock")),
	dur(budget.KeyProgressNotice, "progress-notice", "TIMEBOX_PROGRESS_NOTICE", "30s", true,
		"interval of still_working notices for a long step; 0 is off"),
	dur(budget.KeyKillGrace, "kill-grace", "TIMEBOX_KILL_GRACE", "2s", true,
		"between the polite and the forced stop of a tool; 0 stops it at once"),
	dur(budget.KeyCompaction, "compaction-timeout", "TIMEBOX_COMPACTION_TIMEOUT", "60s", false,
		"one history-compaction model call"),
	count(budget.KeyMaxSteps, "max-steps", "TIMEBOX_MAX_STEPS", "25", 1, 100_000, false,
		"model calls per turn"),
	count(budget.KeyMaxToolCalls, "max-tool-calls", "TIMEBOX_MAX_TOOL_CALLS", "50", 1, 1_000_000, false,
		"tool calls per turn"),
	count(budget.KeyParallelTools, "parallel-tools", "TIMEBOX_PARALLEL_TOOLS", "4", 1, 1024, false,
		"tool calls of one batch running at once"),
	{Key: budget.KeyMaxToolOutput, Flag: "max-tool-output", Env: "TIMEBOX_MAX_TOOL_OUTPUT", Kind: KindBytes,
		Default: "1MiB", Min: 1 << 10, Max: 1 << 30,
		Doc: "bytes of one tool result kept (such as 512KiB, 1MiB)"},
	count(budget.KeyIdleBreaker, "idle-breaker", "TIMEBOX_IDLE_BREAKER", "3", 1, 1000, false,
		"consecutive model idle timeouts that stop the turn"),
	// A reply is held in memory whole, several times over (the stream,
	// the answer, the event log); 16MiB is far past any model's output.
	{Key: budget.KeyMaxReply, Flag: "max-reply", Env: "TIMEBOX_MAX_REPLY", Kind: KindBytes,
		Default: "1MiB", Min: 1 << 10, Max: 16 << 20,
		Doc: "bytes of one model reply, text plus tool calls; past it the stream is closed and the turn stops"},
	count(KeyCompactAt, "compact-at", "TIMEBOX_COMPACT_AT", "100000", 1, 100_000_000, true,
		"estimated prompt tokens above which older history is summarised; 0 is off"),
	dur(KeyShutdownGrace, "shutdown-grace", "TIMEBOX_SHUTDOWN_GRACE", "10s", true,
		"how long running turns may go on after SIGTERM; 0 cancels them at once"),
}

// Keys of the process-wide settings that live outside timeouts and limits.
const (
	KeyCompactAt     = "context.compact_at"
	KeyShutdownGrace = "server.shutdown_grace"
)

// Variables timebox reads that are not settings. Load knows them so that it
// does not warn about them as unknown.
var otherEnv = []string{
	"TIMEBOX_TOKEN",    // bearer token of `timebox serve`
	"TIMEBOX_DB",       // the store
	"TIMEBOX_ADDR",     // the address `timebox serve` binds
	"TIMEBOX_PROCTREE", // how subprocess trees are tracked
	"TIMEBOX_CALL",     // set by timebox in tool subprocesses
}

func dur(key, flag, env, def string, zeroOK bool, doc string) Setting {
	return Setting{Key: key, Flag: flag, Env: env, Kind: KindDuration, Default: def,
		Min: minDuration, Max: maxDuration, ZeroOK: zeroOK, Doc: doc}
}

// maxTurn is the bound of timeouts.turn: long agentic tasks run for days,
// and the turn is the ceiling of them all (spec §2).
const maxTurn = int64(7 * 24 * time.Hour)

// upTo gives s a larger upper bound than its kind's.
func upTo(max int64, s Setting) Setting {
	s.Max = max
	return s
}

func count(key, flag, env, def string, lo, hi int64, zeroOK bool, doc string) Setting {
	return Setting{Key: key, Flag: flag, Env: env, Kind: KindCount, Default: def,
		Min: lo, Max: hi, ZeroOK: zeroOK, Doc: doc}
}

// SettingByKey returns the setting with the agent-file key, such as
// "timeouts.tool".
func SettingByKey(key string) (Setting, bool) {
	for _, s := range Settings {
		if s.Key == key {
			return s, true
		}
	}
	return Setting{}, false
}

func (s Setting) bounds() bounds { return bounds{min: s.Min, max: s.Max, zeroOK: s.ZeroOK} }

// Bounds renders the values s accepts, as the reference tables write
// them: "1ms–24h", "0 (off) or 1ms–24h", "1–100000", "1KiB–1GiB". The
// tables in README.md are checked against it.
func (s Setting) Bounds() string {
	r := s.format(s.Min) + "–" + s.format(s.Max)
	if d := time.Duration(s.Max); s.Kind == KindDuration && d > 24*time.Hour && d%(24*time.Hour) == 0 {
		r += fmt.Sprintf(" (%d days)", d/(24*time.Hour))
	}
	if !s.ZeroOK {
		return r
	}
	zero := "0 (off)"
	if s.Key == budget.KeyKillGrace || s.Key == KeyShutdownGrace {
		zero = "0 (at once)"
	}
	return zero + " or " + r
}

// example is the value a fix suggests for s: its default, or a sensible
// value when the default is off.
func (s Setting) example() string {
	if s.Default != "0" {
		return s.Default
	}
	if s.Kind == KindDuration {
		return "10m"
	}
	return "1"
}

// parse reads a value of s and checks its bounds. It returns the value (in
// nanoseconds, a count or bytes) or the problem.
func (s Setting) parse(v value) (int64, string) {
	switch s.Kind {
	case KindDuration:
		d, p := checkDuration(v, s.bounds(), s.example())
		return int64(d), p
	case KindBytes:
		return checkSize(v, s.bounds())
	}
	return checkCount(v, s.bounds())
}

// format renders a value of s for the budget table.
func (s Setting) format(n int64) string {
	switch s.Kind {
	case KindDuration:
		if n == 0 {
			if s.Key == budget.KeyKillGrace || s.Key == KeyShutdownGrace {
				return "0s"
			}
			return "off"
		}
		return fmtDuration(time.Duration(n))
	case KindBytes:
		return budget.FormatBytes(n)
	}
	if n == 0 && s.ZeroOK {
		return "off"
	}
	return strconv.FormatInt(n, 10)
}

// envNames returns every TIMEBOX_* variable timebox knows, sorted.
func envNames() []string {
	names := append([]string(nil), otherEnv...)
	for _, s := range Settings {
		names = append(names, s.Env)
	}
	sort.Strings(names)
	return names
}
