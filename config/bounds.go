package config

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// Bounds of the agent file itself. goccy/go-yaml has no limits of its own,
// and its parser costs grow faster than the file: with the nesting (every
// node carries its whole path: 40,000 levels in 80 KB took 2.4 GB), with
// the keys of one block mapping (each key recurses and copies the ones
// before it: 20,000 keys took 2.8 s and 1.6 GB), and with aliases, which
// the loader expands. Load checks these bounds on the bytes and on the
// lexer's tokens before the parser runs, so that a hostile or broken file
// is refused in milliseconds (docs/decisions/agent-file-bounds.md).
const (
	// MaxFileBytes is the largest agent file Load reads; it reads no more
	// than this (and one byte to tell), whatever the file's size.
	MaxFileBytes = 1 << 20
	// MaxNesting is how deep mappings and lists may nest, flow ([ {) and
	// block (indentation, "- ") together. A real agent file needs about
	// ten levels; a JSON Schema a few more.
	MaxNesting = 100
	// MaxKeys is the most keys one block mapping may have.
	MaxKeys = 1000
	// MaxTokens bounds the file's YAML tokens (keys, values, and the
	// punctuation between them), so that the parser's work is bounded.
	MaxTokens = 100_000
	// MaxWords bounds the lexer's work: the tokens it may make, counted
	// on the bytes before it runs. The count is of words and punctuation
	// (a word of prose may start a token), which is why it is larger than
	// MaxTokens: 1 MiB of instructions is about 200,000 words, and one
	// token.
	MaxWords = 250_000
	// MaxAliasValues bounds the values that aliases (*name) stand for, all
	// aliases of the file together: an alias repeats its anchor's whole
	// value, and aliases of aliases multiply ("billion laughs").
	MaxAliasValues = 10_000
)

// fileTooLarge words the problem of a file over MaxFileBytes, placed where
// the limit was crossed. data holds at least MaxFileBytes bytes.
func fileTooLarge(data []byte) (pos, string) {
	return posAt(data, MaxFileBytes), fmt.Sprintf(
		"the file is larger than %s (an agent file holds settings and tool declarations; keep it under %s and put large data in the files it names)",
		fmtSize(MaxFileBytes), fmtSize(MaxFileBytes))
}

func fmtSize(n int) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// posAt is the line and column (in characters, as the YAML parser counts
// them) of byte offset off of data.
func posAt(data []byte, off int) pos {
	if off > len(data) {
		off = len(data)
	}
	line := 1 + bytes.Count(data[:off], []byte{'\n'})
	start := bytes.LastIndexByte(data[:off], '\n') + 1
	return pos{line, 1 + utf8.RuneCount(data[start:off])}
}

// tokenBound counts, on the bytes, an upper bound of the tokens goccy's
// lexer makes of data: every ASCII byte that is not a letter, a digit, a
// space or a line break may start a token (a tab too: the lexer makes an
// invalid token of a misplaced one), and so may each run of letters, digits and
// non-ASCII bytes; a token never starts inside such a run. A block
// scalar's | or > counts three times: the lexer may add an empty token and
// one for its text besides the header. It stops when
// the count passes max, and returns the count and where it passed max.
func tokenBound(data []byte, max int) (int, pos) {
	n := 0
	inRun := false
	for i, c := range data {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c >= 0x80:
			if inRun {
				continue
			}
			inRun = true
		case c == ' ', c == '\n', c == '\r':
			inRun = false
			continue
		case c == '|', c == '>':
			inRun = false
			n += 2
		default:
			inRun = false
		}
		n++
		if n > max {
			return n, posAt(data, i)
		}
	}
	return n, pos{}
}

// nestLevel is one open block collection: a mapping or a list, at the
// column of its keys or dashes.
type nestLevel struct {
	col int
	seq bool
	// n counts the entries so far; key is the last key's text (mappings).
	n   int
	key string
}

// nestingProblem checks the lexer's tokens against MaxNesting and MaxKeys
// before the parser sees them. Flow collections are counted exactly by
// their brackets; block collections by the columns of their keys and
// dashes, the way indentation nests them, a list at its parent key's
// column counting as a level of its own. Anchors and tags in a row count
// as levels too, because the parser nests a node for each. It returns
// where the first bound is passed, the key path there, and the problem.
func nestingProblem(tks token.Tokens, lim nestLimits) (pos, string, string) {
	var stack []nestLevel
	flow, props, lastLine := 0, 0, 0
	// flows are the flow collections open, innermost last. In a flow
	// sequence a key's colon opens a mapping of one pair, to the next
	// comma or the sequence's end: goccy parses "[a: {b}]" three deep.
	// flow counts the collections open and those pairs.
	var flows []flowLevel
	runCol, prevStart := 0, 0 // where the run of anchors and tags, and the previous node, start
	// prev is the previous token that is not a comment; prevBefore and
	// runBefore the tokens before its node and before the run.
	var prev, prevBefore, runBefore *token.Token
	for _, tk := range tks {
		if tk == nil || tk.Position == nil || tk.Type == token.CommentType {
			continue
		}
		p := tk.Position
		at := pos{p.Line, p.Column}
		if tk.Type == token.DocumentHeaderType {
			stack, prev, prevBefore, props = stack[:0], nil, nil, 0
			continue
		}
		// A dash on the line after an entry that is only an anchor or a
		// tag ("- !t") starts that entry's value, a list inside it, at any
		// column (goccy is lenient): it closes nothing.
		propValue := flow == 0 && tk.Type == token.SequenceEntryType && props > 0 && isProp(prev) &&
			prev.Position.Line < p.Line && runBefore != nil && runBefore.Type == token.SequenceEntryType
		if flow == 0 && p.Line != lastLine && tk.Type != token.MappingValueType && !propValue {
			// The first token of a line closes the block collections
			// indented deeper than it. Not a colon: the parser takes the
			// token before it as its key, even on an earlier line.
			for len(stack) > 0 && stack[len(stack)-1].col > p.Column {
				stack = stack[:len(stack)-1]
			}
		}
		lastLine = p.Line
		// start is where the node this token belongs to starts: at its
		// first anchor or tag, which belong to it; an anchor's or alias's
		// name is a token of its own.
		start, before := p.Column, prev
		switch {
		case tk.Type == token.AnchorType || tk.Type == token.TagType:
			if props == 0 {
				runCol, runBefore = p.Column, prev
			}
			props++
			start, before = runCol, runBefore
		case prev != nil && (prev.Type == token.AnchorType || prev.Type == token.AliasType):
			start, before = prevStart, prevBefore
		default:
			if props > 0 {
				start, before = runCol, runBefore
			}
			props = 0
		}
		if len(stack)+flow+props > lim.depth {
			return at, nestPath(stack), lim.nestProblem()
		}
		switch tk.Type {
		case token.SequenceStartType, token.MappingStartType:
			flows = append(flows, flowLevel{seq: tk.Type == token.SequenceStartType})
			flow++
			if len(stack)+flow > lim.depth {
				return at, nestPath(stack), lim.nestProblem()
			}
		case token.SequenceEndType, token.MappingEndType:
			if n := len(flows); n > 0 {
				flow -= flows[n-1].open()
				flows = flows[:n-1]
			}
		case token.CollectEntryType:
			if n := len(flows); n > 0 && flows[n-1].pair {
				flows[n-1].pair = false
				flow--
			}
		case token.SequenceEntryType, token.MappingValueType, token.MappingKeyType:
			if n := len(flows); n > 0 {
				if top := &flows[n-1]; top.seq && !top.pair && tk.Type != token.SequenceEntryType {
					top.pair = true
					flow++
					if len(stack)+flow > lim.depth {
						return at, nestPath(stack), lim.nestProblem()
					}
				}
				break
			}
			col, seq, key, inside := p.Column, tk.Type == token.SequenceEntryType, "", propValue
			if tk.Type == token.MappingValueType && isKey(prev) {
				col, key = prevStart, prev.Value // the key's column
				at = pos{prev.Position.Line, prevStart}
				// A key right after a dash is that entry's value even at
				// the dash's column, on the next line (goccy is lenient).
				inside = prevBefore != nil && prevBefore.Type == token.SequenceEntryType
			}
			var problem string
			stack, problem = enter(stack, col, seq, key, inside, lim.keys)
			if problem != "" {
				return at, nestPath(stack[:len(stack)-1]), problem
			}
			if len(stack)+flow > lim.depth {
				return at, nestPath(stack[:len(stack)-1]), lim.nestProblem()
			}
		}
		prev, prevStart, prevBefore = tk, start, before
	}
	return pos{}, "", ""
}

// flowLevel is a flow collection nestingProblem is in: a sequence or a
// mapping, and for a sequence whether a one-pair mapping is open in it.
type flowLevel struct{ seq, pair bool }

// open is how many levels of nesting l counts: itself, and its pair.
func (l flowLevel) open() int {
	if l.pair {
		return 2
	}
	return 1
}

// nestLimits are the bounds nestingProblem checks: MaxNesting and MaxKeys,
// smaller in tests.
type nestLimits struct{ depth, keys int }

var fileLimits = nestLimits{depth: MaxNesting, keys: MaxKeys}

// isProp reports whether tk is an anchor or a tag.
func isProp(tk *token.Token) bool {
	return tk != nil && tk.Position != nil && (tk.Type == token.AnchorType || tk.Type == token.TagType)
}

// isKey reports whether tk, the token before a colon, is its key: a
// scalar, a name, a closing bracket; not punctuation that opens a value.
func isKey(tk *token.Token) bool {
	if tk == nil || tk.Position == nil {
		return false
	}
	switch tk.Type {
	case token.SequenceEntryType, token.MappingValueType, token.MappingKeyType, token.CollectEntryType,
		token.SequenceStartType, token.MappingStartType, token.DocumentHeaderType:
		return false
	}
	return true
}

func (lim nestLimits) nestProblem() string {
	return fmt.Sprintf("nests more than %d levels deep (an agent file needs a handful; flatten it)", lim.depth)
}

// enter records a key or a dash at col: an entry of the open collection at
// that column, or the first of a new one inside it; always a new one when
// inside is set.
func enter(stack []nestLevel, col int, seq bool, key string, inside bool, maxKeys int) ([]nestLevel, string) {
	for len(stack) > 0 && !inside {
		top := &stack[len(stack)-1]
		switch {
		case top.col > col:
			// Not at a line's start (a: b: c); the deeper level is over.
			stack = stack[:len(stack)-1]
			continue
		case top.col < col:
		case top.seq == seq:
			top.n++
			top.key = key
			if !seq && top.n > maxKeys {
				return stack, fmt.Sprintf("has more than %d keys (an agent file needs far fewer; split the data into a file the tool reads)", maxKeys)
			}
			return stack, ""
		case top.seq:
			// A key at the column of a list that hangs under a key:
			// the list is over.
			stack = stack[:len(stack)-1]
			continue
		}
		break
	}
	return append(stack, nestLevel{col: col, seq: seq, n: 1, key: key}), ""
}

// nestPath renders the open block collections as a key path
// (tools[2].input_schema), its first levels only when it is long.
func nestPath(stack []nestLevel) string {
	var b strings.Builder
	for i, lv := range stack {
		if i == maxPathLevels {
			b.WriteString("…")
			break
		}
		if lv.seq {
			fmt.Fprintf(&b, "[%d]", lv.n-1)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(lv.key)
	}
	return b.String()
}

// maxPathLevels is how much of a deep key path a message shows.
const maxPathLevels = 6

// aliasBudget counts, in document order, the values each alias stands for
// (its anchor's value, with the aliases inside it expanded), and reports
// the alias that takes the total past MaxAliasValues, or one that refers
// to the value it is inside. The walk never follows an alias: an anchor's
// size is known once its value has been walked, and an alias can only
// refer to an anchor above it, so the cost is that of the file.
type aliasBudget struct {
	// sizes holds the latest anchor of each name: the values its value
	// holds with aliases expanded, or -1 while it is being walked.
	sizes map[string]int
	total int
	path  []string

	at      pos
	key     string
	problem string
}

func checkAliases(f *ast.File) (pos, string, string) {
	c := &aliasBudget{sizes: map[string]int{}}
	for _, d := range f.Docs {
		if d != nil && !c.walk(d.Body) {
			return c.at, c.key, c.problem
		}
	}
	return pos{}, "", ""
}

// walk returns false once a problem is found.
func (c *aliasBudget) walk(n ast.Node) bool {
	_, ok := c.size(n)
	return ok
}

func (c *aliasBudget) size(n ast.Node) (int, bool) {
	switch n := n.(type) {
	case nil:
		return 0, true
	case *ast.MappingNode:
		total := 1
		for _, mv := range n.Values {
			s, ok := c.size(mv)
			if !ok {
				return 0, false
			}
			total += s
		}
		return total, true
	case *ast.MappingValueNode:
		k, ok := c.size(n.Key)
		if !ok {
			return 0, false
		}
		c.path = append(c.path, keyText(n.Key))
		v, ok := c.size(n.Value)
		c.path = c.path[:len(c.path)-1]
		return k + v, ok
	case *ast.MappingKeyNode:
		return c.size(n.Value)
	case *ast.SequenceNode:
		total := 1
		for i, v := range n.Values {
			c.path = append(c.path, fmt.Sprintf("[%d]", i))
			s, ok := c.size(v)
			c.path = c.path[:len(c.path)-1]
			if !ok {
				return 0, false
			}
			total += s
		}
		return total, true
	case *ast.TagNode:
		return c.size(n.Value)
	case *ast.AnchorNode:
		name := nodeText(n.Name)
		c.sizes[name] = -1
		s, ok := c.size(n.Value)
		c.sizes[name] = s
		return s, ok
	case *ast.AliasNode:
		name := nodeText(n.Value)
		s, found := c.sizes[name]
		switch {
		case !found:
			return 0, true // reported by the loader: no anchor above it
		case s < 0:
			c.fail(n, fmt.Sprintf("alias *%s is inside the value of its own anchor &%s, so it would repeat itself for ever (refer to a value that is complete)", name, name))
			return 0, false
		}
		c.total += s
		if c.total > MaxAliasValues {
			c.fail(n, fmt.Sprintf("aliases stand for more than %d values in all (*%s repeats %d); an alias repeats its anchor's whole value, so aliases of aliases multiply (write the values out, or use fewer aliases)", MaxAliasValues, name, s))
			return 0, false
		}
		return s, true
	}
	return 1, true
}

func (c *aliasBudget) fail(n ast.Node, problem string) {
	c.at, c.problem = posOf(n), problem
	var b strings.Builder
	for i, s := range c.path {
		if i == maxPathLevels {
			b.WriteString("…")
			break
		}
		if b.Len() > 0 && !strings.HasPrefix(s, "[") {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	c.key = b.String()
}

// keyText is a mapping key as a path segment.
func keyText(k ast.MapKeyNode) string {
	switch k := k.(type) {
	case *ast.MergeKeyNode:
		return "<<"
	case *ast.MappingKeyNode:
		return nodeText(k.Value)
	case ast.Node:
		return nodeText(k)
	}
	return ""
}
