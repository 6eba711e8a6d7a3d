// Package budget holds timebox's time and count budgets: their values and
// where those values came from, the phases of an agent turn, and the typed
// errors that say which budget ended a call or a turn and which knob changes
// it.
//
// The package is pure logic. It does no I/O and starts no goroutines; the
// turn loop, the tool runner and the model watchdogs build on it.
package budget

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Source says where a resolved budget value came from. Records, events and
// `timebox validate` carry it so that an operator can tell which layer of
// configuration to change.
type Source string

// The sources of a resolved value. A tool's own timeout that names a profile
// has the source "profile:NAME"; see ProfileSource.
const (
	SourceTool    Source = "tool"    // the tool's own entry (timeout, idle_timeout)
	SourceFlag    Source = "flag"    // a command-line flag
	SourceEnv     Source = "env"     // a TIMEBOX_* environment variable
	SourceFile    Source = "file"    // the agent file's timeouts/limits section
	SourceDefault Source = "default" // the built-in default
	SourceCode    Source = "code"    // set from Go code through the library API
)

// ProfileSource returns the source of a tool timeout taken from the named
// profile, such as "profile:slow".
func ProfileSource(name string) Source { return Source("profile:" + name) }

// Duration is a resolved time budget: its value, where the value came from,
// and the knob that changes it. Once resolved (it has a source) a zero D
// means the budget is off where the spec allows that; the zero Duration is
// unset (see Unset).
type Duration struct {
	// D is the value.
	D time.Duration `json:"-"`
	// Source is where D came from (SourceFile, SourceFlag, …); a value
	// given in Go code without one gets SourceCode where it is resolved
	// (agent.New).
	Source Source `json:"source"`
	// Knob names the setting that changes the value, as a person would type
	// it: "timeouts.turn", "tools[crawl].timeout in agent.yaml",
	// "--tool-timeout" or "TIMEBOX_TOOL_TIMEOUT".
	Knob string `json:"knob"`
}

// Unset reports whether d was never given a value: the zero Duration, with
// no value and no source. This is the one rule by which timebox tells "not
// set, take the default" from "off": where budgets are resolved (config.Load,
// agent.New) an unset Duration takes its knob's default, and every resolved
// Duration has a source, so a resolved zero is off (or "at once" for a
// grace) where its knob CanBeOff. A Go caller turns a budget off by giving
// it a source: Duration{Source: budget.SourceCode}.
func (d Duration) Unset() bool { return d.D == 0 && d.Source == "" }

// Off reports whether the budget is disabled (zero).
func (d Duration) Off() bool { return d.D <= 0 }

// MS returns the value in whole milliseconds, as events and records carry it.
func (d Duration) MS() int64 { return d.D.Milliseconds() }

// String returns the value in Go duration syntax, or "off".
func (d Duration) String() string {
	if d.Off() {
		return "off"
	}
	return d.D.String()
}

// Count is a resolved count or size limit with its source and knob.
type Count struct {
	// N is the value: a count, or a size in bytes.
	N int64 `json:"n"`
	// Source is where N came from, as in Duration.
	Source Source `json:"source"`
	// Knob names the setting that changes the value, as in Duration:
	// "limits.max_steps".
	Knob string `json:"knob"`
}

// Enforcement is how a tool's own budget is enforced (spec §3).
type Enforcement string

// The enforcement modes.
const (
	// Hard stops the call at its deadline: a subprocess's whole tree is sent
	// SIGTERM, then SIGKILL after the kill grace; an MCP call is cancelled.
	Hard Enforcement = "hard"
	// Cooperative cancels the call's context at its deadline and abandons
	// the call if it has not returned after the kill grace.
	Cooperative Enforcement = "cooperative"
	// Advisory never interrupts the call because of its own budget; an
	// overrun is measured and recorded and the result is always used.
	Advisory Enforcement = "advisory"
)

// Valid reports whether e is one of the three modes.
func (e Enforcement) Valid() bool {
	switch e {
	case Hard, Cooperative, Advisory:
		return true
	}
	return false
}

// Budgets are the process-wide time budgets of a turn, resolved (spec §2).
// A field that is unset (Duration.Unset: no value and no source) takes its
// default where budgets are resolved (config.Load, agent.New); a resolved
// zero, one with a source, is off where the spec allows that. Defaults
// returns the spec's defaults.
type Budgets struct {
	Tool           Duration `json:"tool"`            // default tool call timeout (60s)
	ToolMax        Duration `json:"tool_max"`        // the largest timeout a tool may declare (1h)
	LLMFirstChunk  Duration `json:"llm_first_chunk"` // request sent → first stream chunk (60s)
	LLMIdle        Duration `json:"llm_idle"`        // longest silence inside one stream (120s)
	LLMBudget      Duration `json:"llm_budget"`      // total model streaming time per turn (off)
	Step           Duration `json:"step"`            // longest time without any progress signal (5m)
	Turn           Duration `json:"turn"`            // the whole turn, wall clock (30m)
	ProgressNotice Duration `json:"progress_notice"` // still_working interval (30s)
	KillGrace      Duration `json:"kill_grace"`      // polite stop → forced stop (2s)
	Compaction     Duration `json:"compaction"`      // one compaction model call (60s)
	Approval       Duration `json:"approval"`        // how long a call waits for a person's decision (24h)
}

// Limits are the count and size limits of a turn, resolved (spec §2).
type Limits struct {
	MaxSteps      Count `json:"max_steps"`       // model calls per turn (25)
	MaxToolCalls  Count `json:"max_tool_calls"`  // tool calls per turn (50)
	ParallelTools Count `json:"parallel_tools"`  // tool calls of one batch at once (4)
	MaxToolOutput Count `json:"max_tool_output"` // bytes of one tool result kept (1 MiB)
	IdleBreaker   Count `json:"idle_breaker"`    // consecutive llm_idle timeouts (3)
	MaxReply      Count `json:"max_reply"`       // bytes of one model reply: text plus tool calls (1 MiB)
}

// Key names of the process-wide budgets, as written in the agent file.
const (
	KeyTool           = "timeouts.tool"
	KeyToolMax        = "timeouts.tool_max"
	KeyLLMFirstChunk  = "timeouts.llm_first_chunk"
	KeyLLMIdle        = "timeouts.llm_idle"
	KeyLLMBudget      = "timeouts.llm_budget"
	KeyStep           = "timeouts.step"
	KeyTurn           = "timeouts.turn"
	KeyProgressNotice = "timeouts.progress_notice"
	KeyKillGrace      = "timeouts.kill_grace"
	KeyCompaction     = "timeouts.compaction"
	KeyApproval       = "timeouts.approval"
	KeyMaxSteps       = "limits.max_steps"
	KeyMaxToolCalls   = "limits.max_tool_calls"
	KeyParallelTools  = "limits.parallel_tools"
	KeyMaxToolOutput  = "limits.max_tool_output"
	KeyIdleBreaker    = "limits.idle_breaker"
	KeyMaxReply       = "limits.max_reply"
)

// Defaults returns the spec's default budgets, each with source "default"
// and its agent-file key as knob, from Knobs.
func Defaults() Budgets {
	var b Budgets
	for _, k := range Knobs {
		if k.IsDuration() {
			k.Set(&b, nil, k.Default, SourceDefault, k.Key)
		}
	}
	return b
}

// DefaultLimits returns the spec's default limits, from Knobs.
func DefaultLimits() Limits {
	var l Limits
	for _, k := range Knobs {
		if !k.IsDuration() {
			k.Set(nil, &l, k.Default, SourceDefault, k.Key)
		}
	}
	return l
}

// DefaultProfiles returns the built-in timeout profiles.
func DefaultProfiles() map[string]time.Duration {
	return map[string]time.Duration{
		"fast":     5 * time.Second,
		"standard": 60 * time.Second,
		"slow":     10 * time.Minute,
	}
}

// ToolBudget is the resolved budget of one tool's calls.
type ToolBudget struct {
	// Timeout is the absolute maximum wall clock of one call. It is never
	// extended by progress.
	Timeout Duration `json:"timeout"`
	// IdleTimeout is the longest silence between progress reports of one
	// call; zero is off.
	IdleTimeout Duration `json:"idle_timeout"`
	// Enforcement says how Timeout and IdleTimeout are enforced.
	Enforcement Enforcement `json:"enforcement"`
	// KillGrace is the time between the polite and the forced stop; zero
	// (resolved) stops at once.
	KillGrace Duration `json:"-"`
}

// Round returns d rounded for a person to read: whole milliseconds below a
// minute, whole seconds above.
func Round(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// RoundHuman rounds for a sentence: whole seconds above ten seconds,
// tenths below.
func RoundHuman(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// FormatDuration renders d the way a person writes it in the agent file:
// whole seconds under two minutes as "60s", whole minutes as "5m", whole
// hours as "2h", and Go's syntax otherwise ("1m30s", "750ms").
func FormatDuration(d time.Duration) string {
	if d > 0 && d < 2*time.Minute && d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// FormatBytes renders a byte count the way the agent file accepts it.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
