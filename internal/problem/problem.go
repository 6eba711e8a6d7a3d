// Package problem is the form of every problem timebox finds in a file it
// reads (spec §10): where it is (file:line:col), which key, what is wrong
// and how to fix it. The agent file (config) and the script model's file
// (model/script) both report through it, so that a problem reads the same
// wherever it is, and both report every problem at once, in reading order,
// so that a person fixes everything in one pass.
package problem

import (
	"fmt"
	"sort"
	"strings"
)

// Problem is one problem: where it is, which key, and a sentence that says
// what is wrong and how to fix it.
//
// A problem in a file has File, Line and Col; Line and Col point at the
// offending value, or at the key when the key itself is the problem
// (unknown, or missing a required child). A problem with no place in a
// file (a flag, an environment variable) has an empty File and names what
// the person has to change in Key.
type Problem struct {
	// File is the file as it was given (as the person can open it); empty
	// for flags and environment variables.
	File string
	// Line and Col are 1-based, Col in characters; zero when the problem
	// has no position in the file (a missing section, an unreadable file).
	Line, Col int
	// Key is the key path ("tools[2].timeout", "tool_calls[0].name"), the
	// flag ("--tool-timeout") or the variable ("TIMEBOX_TOOL_TIMEOUT");
	// empty for syntax errors, which belong to no key.
	Key string
	// Msg says what is wrong and how to fix it.
	Msg string
}

// Error renders the problem the way the spec writes it:
//
//	agent.yaml:14:14: tools[2].timeout: "10 mins" is not a duration (use 10m)
//	script.jsonl:5:40: first_chunk_delay: 50 is not a duration (a duration is a string like "50ms")
//	--tool-timeout: "abc" is not a duration (use Go syntax such as 90s)
func (p *Problem) Error() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d:%d", p.Line, p.Col)
		}
		b.WriteString(": ")
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// List is every problem found, returned whole as one error.
type List []*Problem

// Error renders every problem, one per line.
func (l List) Error() string {
	lines := make([]string, len(l))
	for i, p := range l {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap gives the problems to errors.As and errors.Is: errors.As(err,
// &p) with p a *Problem finds the first.
func (l List) Unwrap() []error {
	out := make([]error, len(l))
	for i, p := range l {
		out[i] = p
	}
	return out
}

// Sort puts the problems in reading order: by line, then column, then key.
func (l List) Sort() { l.SortBy(nil) }

// SortBy puts the problems in the order of rank (lowest first; nil ranks
// every problem the same), and those of one rank in reading order: by
// line, then column, then key. The sort is stable.
func (l List) SortBy(rank func(*Problem) int) {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if rank != nil {
			if ra, rb := rank(a), rank(b); ra != rb {
				return ra < rb
			}
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
