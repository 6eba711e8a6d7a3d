package config

import (
	"fmt"
	"sort"
	"strings"
)

// Error is one configuration problem: where it is, which key, and a
// sentence that says how to fix it (spec §10).
//
// A problem in the agent file has File, Line and Col; Line and Col point
// at the offending value, or at the key when the key itself is the problem
// (unknown, or missing a required child). A problem in a flag or a
// TIMEBOX_* variable has an empty File and names the flag or variable in
// Key, because that is what the person has to change.
type Error struct {
	// File is the agent file as it was given to Load; empty for flags and
	// environment variables.
	File string
	// Line and Col are 1-based; zero when the problem has no position in
	// the file (a missing section, an unreadable file).
	Line, Col int
	// Key is the key path ("tools[2].timeout"), the flag ("--tool-timeout")
	// or the variable ("TIMEBOX_TOOL_TIMEOUT"); empty for YAML syntax
	// errors, which belong to no key.
	Key string
	// Msg says what is wrong and how to fix it.
	Msg string

	// other marks a problem in a file the agent file names (the script),
	// listed after the agent file's own.
	other bool
}

// Error renders the problem the way the spec writes it:
//
//	agent.yaml:14:14: tools[2].timeout: "10 mins" is not a duration (use 10m)
//	--tool-timeout: "abc" is not a duration (use Go syntax such as 90s)
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d:%d", e.Line, e.Col)
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem Load found, in reading order: the agent file's
// problems by line and column, then the environment's by variable name,
// then the flags' by flag name. Load returns it whole so that a person can
// fix everything in one pass.
type Errors []*Error

// Error renders every problem, one per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// rank orders the three places a problem can come from: the file first,
// because it is what `timebox validate` is about, then the environment,
// then the flags (the order in which a person usually sets them up).
func (e *Error) rank() int {
	switch {
	case e.File != "":
		return 0
	case strings.HasPrefix(e.Key, "--"):
		return 2
	}
	return 1
}

func (es Errors) sort() {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.rank() != b.rank() {
			return a.rank() < b.rank()
		}
		if a.other != b.other {
			return b.other
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		return a.Key < b.Key
	})
}
