package config

import (
	"fmt"
	"regexp"
	"strings"
)

// The YAML reader's own words for a syntax error ("value is not allowed in
// this context") say neither what is wrong nor what to do, and often point
// at the line before the mistake. The commonest mistakes in a hand-written
// agent file are a tab and an indentation off by a space or two; when the
// reader fails, syntaxProblem looks for those in the text itself and names
// the line, the column and the fix. Anything it does not recognise keeps
// the reader's words, with a fix where one is known.

// syntaxProblem rewrites a YAML syntax error msg found at p into one with a
// fix, placed on the line to change.
func syntaxProblem(data []byte, p pos, msg string) (pos, string) {
	if at, problem := indentProblem(data); problem != "" {
		return at, problem
	}
	for _, f := range syntaxFixes {
		if strings.Contains(msg, f.says) {
			return p, "YAML syntax: " + msg + " (" + f.fix + ")"
		}
	}
	return p, "YAML syntax: " + msg
}

// syntaxFixes are the fixes for the reader's messages indentProblem does
// not explain.
var syntaxFixes = []struct{ says, fix string }{
	{"could not find end character of double-quoted text", `close the string with " on the same line`},
	{"could not find end character of single-quoted text", `close the string with ' on the same line`},
	{"']' not found", "close the list with ]"},
	{"',' or ']' must be specified", "a [ list above is not closed: close it with ], or separate its items with commas"},
	{"'}' not found", "close the mapping with }"},
	{"',' or '}' must be specified", "a { mapping above is not closed: close it with }, or separate its entries with commas"},
	{"mapping value is not allowed in this context", `a value that holds ": " must be quoted, as in description: "a: b"; otherwise check this line's indentation`},
	{"value is not allowed in this context", "check this line's indentation: each key of a mapping starts in the same column"},
}

// indented is a key or list item that starts a line, for indentProblem.
type indented struct {
	col   int    // spaces before it
	line  int    // 1-based
	key   string // the key; "" for a list item's dash
	value bool   // a key whose value follows it on its line
}

// keyRE is a key at the start of a line's text (after any dashes): a plain
// word or a quoted one, then a colon that ends the text or is followed by a
// space.
var keyRE = regexp.MustCompile(`^("[^"]*"|'[^']*'|[^\s#'"\[\]{},&*!|>%@` + "`" + `-][^#]*?|-[^\s#]*?)\s*:(\s+|$)`)

// indentProblem finds the first line that a tab indents, or whose
// indentation lines up with no key it could belong to, and says how to
// indent it. It gives up (returns "") at what it cannot follow: a flow
// list or mapping, or a quoted string, that runs over more than one line.
func indentProblem(data []byte) (pos, string) {
	var open []indented // the keys and dashes the current line may be inside
	block := -1         // within a block scalar: the column of its key
	flow := 0           // [ and { left open by the lines above
	lines := strings.Split(string(data), "\n")
	for i, text := range lines {
		line := i + 1
		text = strings.TrimSuffix(text, "\r")
		trimmed := strings.TrimLeft(text, " \t")
		lead := text[:len(text)-len(trimmed)]
		if block >= 0 {
			if trimmed == "" || len(lead) > block && !strings.Contains(lead[:block+1], "\t") {
				continue // the block scalar's text, tabs and all
			}
			block = -1
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if tab := strings.IndexByte(lead, '\t'); tab >= 0 {
			return pos{line, tab + 1}, "a tab indents this line; YAML indents with spaces only (replace the tab with spaces)"
		}
		if strings.HasPrefix(text, "---") || strings.HasPrefix(text, "...") {
			open = open[:0]
			continue
		}
		if flow > 0 {
			flow, _ = flowDepth(trimmed, flow)
			continue // inside a [ list ] or { mapping } begun above
		}
		if strings.HasPrefix(trimmed, "?") {
			return pos{}, "" // a complex key: not followed here
		}
		var quoted bool
		if flow, quoted = flowDepth(trimmed, 0); quoted || flow < 0 {
			return pos{}, ""
		}
		// This line's dashes and key, each at its column.
		var here []indented
		col, rest := len(lead), trimmed
		for rest == "-" || strings.HasPrefix(rest, "- ") {
			here = append(here, indented{col: col, line: line})
			after := strings.TrimLeft(rest[1:], " ")
			col += len(rest) - len(after)
			rest = after
		}
		if m := keyRE.FindStringSubmatch(rest); m != nil {
			v := strings.TrimSpace(stripComment(rest[len(m[0]):]))
			// An anchor or a tag alone leaves the value to the lines below.
			if strings.HasPrefix(v, "&") || strings.HasPrefix(v, "!") {
				if _, after, ok := strings.Cut(v, " "); ok {
					v = strings.TrimSpace(after)
				} else {
					v = ""
				}
			}
			if strings.HasPrefix(v, "|") || strings.HasPrefix(v, ">") {
				block, v = col, ""
			}
			here = append(here, indented{col: col, line: line, key: strings.Trim(m[1], `"'`), value: v != ""})
		} else if len(here) == 0 {
			continue // a plain value running on from the line before
		} else if rest != "" {
			here[len(here)-1].value = true // "- a value"
		}
		if block >= 0 && len(here) > 0 && here[len(here)-1].key == "" {
			block = here[len(here)-1].col
		}
		first := here[0]
		var left *indented // the nearest deeper key this line moved out of
		for len(open) > 0 && open[len(open)-1].col > first.col {
			if k := open[len(open)-1]; k.key != "" {
				left = &k
			}
			open = open[:len(open)-1]
		}
		if len(open) > 0 && open[len(open)-1].col < first.col && first.key != "" {
			top := open[len(open)-1]
			if left != nil {
				return pos{line, first.col + 1}, misaligned(first, *left, open)
			}
			if top.value {
				what := fmt.Sprintf("%q on line %d", top.key, top.line)
				if top.key == "" {
					what = fmt.Sprintf("the list item on line %d", top.line)
				}
				return pos{line, first.col + 1}, fmt.Sprintf("%q is indented %s, deeper than %s, which already has its value on its line; indent it %s to line it up with the key above it, or, if it belongs under that key, move that key's value into it",
					first.key, spaces(first.col), what, spaces(top.col))
			}
		}
		if n := len(open); n > 0 && first.key != "" && open[n-1].key == "" && open[n-1].col == first.col &&
			(n < 2 || open[n-2].col != first.col) {
			// A key in the column of a list's dash, where the list is
			// not the value of a key in that same column.
			dash := open[n-1]
			return pos{line, first.col + 1}, fmt.Sprintf("%q is indented %s, like the dash of the list item on line %d; indent it %s to put it in that item",
				first.key, spaces(first.col), dash.line, spaces(first.col+2))
		}
		for n := len(open); n > 0 && open[n-1].col == first.col; n-- {
			if first.key == "" && open[n-1].key != "" && !open[n-1].value {
				break // key:, then its list in the key's column
			}
			open = open[:n-1] // a sibling ends the one before it
		}
		open = append(open, here...)
	}
	return pos{}, ""
}

// misaligned says that k lines up with no key above it: not with left,
// the deeper key it comes back from, nor with the keys still open.
func misaligned(k, left indented, open []indented) string {
	s := fmt.Sprintf("%q is indented %s, which lines up with no key above it; indent it %s to put it beside %q (line %d)",
		k.key, spaces(k.col), spaces(left.col), left.key, left.line)
	for j := len(open) - 1; j >= 0; j-- {
		if o := open[j]; o.key != "" && o.col < k.col {
			return s + fmt.Sprintf(", or %s to put it beside %q (line %d)", spaces(o.col), o.key, o.line)
		}
	}
	return s + ", or 0 to make it a top-level key"
}

func spaces(n int) string {
	if n == 1 {
		return "1 space"
	}
	return fmt.Sprintf("%d spaces", n)
}

// flowDepth returns how many flow lists and mappings ([ and {) a line
// leaves open, starting depth deep, and whether it leaves a quoted string
// open.
func flowDepth(s string, depth int) (int, bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'':
			if c == '\'' && i > 0 && !strings.ContainsRune(" [{,:", rune(s[i-1])) {
				continue // an apostrophe inside a plain word
			}
			end := i + 1
			for end < len(s) && s[end] != c {
				if c == '"' && s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) {
				return depth, true
			}
			i = end
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		case '#':
			if i == 0 || s[i-1] == ' ' {
				return depth, false
			}
		}
	}
	return depth, false
}

// stripComment removes a trailing # comment (one after a space).
func stripComment(s string) string {
	if strings.HasPrefix(s, "#") {
		return ""
	}
	if i := strings.Index(s, " #"); i >= 0 {
		return s[:i]
	}
	return s
}
