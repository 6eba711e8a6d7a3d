package config

import (
	"strings"

	"github.com/timebox-run/timebox/internal/problem"
)

// Error is one configuration problem: where it is, which key, and a
// sentence that says how to fix it (spec §10). It is the form of every
// problem of a file timebox reads (internal/problem):
//
//	agent.yaml:14:14: tools[2].timeout: "10 mins" is not a duration (use 10m)
//	--tool-timeout: "abc" is not a duration (use Go syntax such as 90s)
//
// A problem in the agent file or in the script it names has File, Line
// and Col; Line and Col point at the offending value, or at the key when
// the key itself is the problem (unknown, or missing a required child). A
// problem in a flag or a TIMEBOX_* variable has an empty File and names the
// flag or variable in Key, because that is what the person has to change.
type Error = problem.Problem

// Errors is every problem Load found, in reading order: the agent file's
// problems by line and column, then those of the script it names, then
// the environment's by variable name, then the flags' by flag name. Load
// returns it whole so that a person can fix everything in one pass; its
// Error renders one problem per line.
type Errors = problem.List

// sortErrs puts the problems in the order Errors gives: the agent file
// first, because it is what `timebox validate` is about, then the files it
// names (the script), then the environment, then the flags (the order in
// which a person usually sets them up).
func (l *loader) sortErrs() {
	l.errs.SortBy(func(e *Error) int {
		switch {
		case e.File == l.path:
			return 0
		case e.File != "":
			return 1
		case strings.HasPrefix(e.Key, "--"):
			return 3
		}
		return 2
	})
}
