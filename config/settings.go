package config

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// SettingKind is the type of a process-wide setting's value.
type SettingKind = budget.Kind

// The kinds of setting.
const (
	// KindDuration is a Go duration: 750ms, 30s, 1h30m.
	KindDuration = budget.KindDuration
	// KindCount is a whole number.
	KindCount = budget.KindCount
	// KindBytes is a size in bytes: 1048576, 512KiB, 1MiB, 1GiB.
	KindBytes = budget.KindBytes
	// KindSwitch is on or off, held as 1 or 0. No budget is a switch, so
	// budget.Knobs never has one: only the settings that are not a
	// turn's budgets, such as context.time_notes, do.
	KindSwitch SettingKind = "switch"
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
	Env string
	// Kind says what the value is: a duration, a count, a size or a
	// switch.
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
	// ServeOnly tells that only `timebox serve` reads it: the other
	// commands take no flag for it (validate does, to check it).
	ServeOnly bool
}

// Settings are the process-wide settings, in the order `timebox validate`
// lists them: one per entry of budget.Knobs, then the three that are not a
// turn's budgets. The CLI registers one flag per entry; Load reads one
// variable per entry. Do not modify it.
var Settings = append(fromKnobs(),
	count(KeyCompactAt, "compact-at", "TIMEBOX_COMPACT_AT", "100000", 1, 100_000_000, true,
		"estimated prompt tokens above which older history is summarised; 0 is off"),
	Setting{Key: KeyTimeNotes, Flag: "time-notes", Env: "TIMEBOX_TIME_NOTES", Kind: KindSwitch, Default: "on",
		Min: 0, Max: 1, Doc: "tell the model its time: each tool's budget, the turn's time and tool calls left, each result's duration; on or off"},
	serveOnly(dur(KeyShutdownGrace, "shutdown-grace", "TIMEBOX_SHUTDOWN_GRACE", "10s", true,
		"how long running turns may go on after SIGTERM; 0 cancels them at once")),
)

func serveOnly(s Setting) Setting {
	s.ServeOnly = true
	return s
}

// fromKnobs returns a Setting for each budget of budget.Knobs.
func fromKnobs() []Setting {
	out := make([]Setting, 0, len(budget.Knobs)+2)
	for _, k := range budget.Knobs {
		def := "0"
		switch {
		case k.Default == 0:
		case k.Kind == budget.KindDuration:
			def = fmtDuration(time.Duration(k.Default))
		case k.Kind == budget.KindBytes:
			def = budget.FormatBytes(k.Default)
		default:
			def = strconv.FormatInt(k.Default, 10)
		}
		out = append(out, Setting{Key: k.Key, Flag: k.Flag, Env: k.Env, Kind: k.Kind, Default: def,
			Min: k.Min, Max: k.Max, ZeroOK: k.CanBeOff, Doc: k.Doc})
	}
	return out
}

// Keys of the process-wide settings that live outside timeouts and limits.
const (
	KeyCompactAt     = "context.compact_at"
	KeyTimeNotes     = "context.time_notes"
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
	// The engine turns run on, and Temporal's side of it (run, serve,
	// worker: --engine, --temporal-address, --temporal-namespace,
	// --task-queue, --worker-heartbeat).
	"TIMEBOX_ENGINE",
	"TIMEBOX_TEMPORAL_ADDRESS",
	"TIMEBOX_TEMPORAL_NAMESPACE",
	"TIMEBOX_TEMPORAL_TASK_QUEUE",
	"TIMEBOX_TEMPORAL_WORKER_HEARTBEAT",
}

func dur(key, flag, env, def string, zeroOK bool, doc string) Setting {
	return Setting{Key: key, Flag: flag, Env: env, Kind: KindDuration, Default: def,
		Min: minDuration, Max: maxDuration, ZeroOK: zeroOK, Doc: doc}
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
	if s.Kind == KindSwitch {
		return "on or off"
	}
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
	if s.Default != "0" || s.Kind == KindSwitch {
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
	case KindSwitch:
		return checkSwitch(v)
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
	case KindSwitch:
		if n == 0 {
			return "off"
		}
		return "on"
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
