package config

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// The agent file is read as a YAML syntax tree rather than decoded into Go
// structs, because the tree keeps the line and column of every key and
// value: each problem can then point at the exact spot (spec §10), and the
// check can go on past the first problem to find all of them.

// pos is a 1-based line and column; the zero pos is "no position".
type pos struct{ line, col int }

func tokenPos(tk *token.Token) pos {
	if tk == nil || tk.Position == nil {
		return pos{}
	}
	return pos{tk.Position.Line, tk.Position.Column}
}

// posOf returns where a node starts. A block mapping's own token is the
// colon of its first entry, which is not where a reader looks, so a mapping
// is placed at its first key.
func posOf(n ast.Node) pos {
	switch n := n.(type) {
	case nil:
		return pos{}
	case *ast.DocumentNode:
		if n.Body != nil {
			return posOf(n.Body)
		}
		return pos{}
	case *ast.MappingNode:
		if !n.IsFlowStyle && len(n.Values) > 0 && n.Values[0] != nil && n.Values[0].Key != nil {
			return posOf(n.Values[0].Key)
		}
		return tokenPos(n.Start)
	case *ast.MappingValueNode:
		if n.Key != nil {
			return posOf(n.Key)
		}
		return tokenPos(n.Start)
	}
	return tokenPos(n.GetToken())
}

// parseYAML parses the agent file within the bounds of bounds.go: words
// are counted on the bytes before the lexer runs; tokens, the nesting and
// the keys of each mapping on the lexer's tokens before the parser runs;
// the aliases on the parsed tree before the loader expands any. goccy's parser
// is third-party code fed arbitrary bytes; a panic in it is turned into a
// syntax error so that a bad file can never crash the process that loads
// it. A problem comes back with its position, its key path (if it has
// one) and its message.
func parseYAML(data []byte) (f *ast.File, p pos, key, msg string) {
	defer func() {
		if r := recover(); r != nil {
			f, p, key, msg = nil, pos{}, "", fmt.Sprintf("YAML syntax: the file could not be parsed (%v)", r)
		}
	}()
	if n, at := tokenBound(data, MaxWords); n > MaxWords {
		return nil, at, "", fmt.Sprintf("the file has more than %d words and punctuation marks; an agent file needs far fewer (keep it to settings and tool declarations)", MaxWords)
	}
	tks := lexer.Tokenize(string(data))
	if len(tks) > MaxTokens {
		return nil, tokenPos(tks[MaxTokens]), "", fmt.Sprintf("the file has more than %d YAML tokens (keys, values and punctuation); an agent file needs far fewer (keep it to settings and tool declarations)", MaxTokens)
	}
	if at, key, problem := nestingProblem(tks, fileLimits); problem != "" {
		return nil, at, key, problem
	}
	f, err := parser.Parse(tks, 0)
	if err == nil {
		if at, key, problem := checkAliases(f); problem != "" {
			return nil, at, key, problem
		}
		return f, pos{}, "", ""
	}
	var ye yaml.Error
	if errors.As(err, &ye) {
		// GetMessage, never Error: goccy's Error renders the source around
		// the problem, which costs gigabytes on a long line.
		msg := firstLine(ye.GetMessage())
		if m := duplicateKeyRE.FindStringSubmatch(msg); m != nil {
			// A key set twice is ambiguous: which one did the author mean?
			return nil, tokenPos(ye.GetToken()), "", fmt.Sprintf("%q is set twice (first at line %s); keep one", m[1], m[2])
		}
		p, msg := syntaxProblem(data, tokenPos(ye.GetToken()), msg)
		return nil, p, "", msg
	}
	p, msg = syntaxProblem(data, pos{}, firstLine(err.Error()))
	return nil, p, "", msg
}

var duplicateKeyRE = regexp.MustCompile(`^mapping key "(.*)" already defined at \[(\d+):\d+\]`)

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// entry is one key: value of a mapping.
type entry struct {
	key   string
	keyAt pos
	val   ast.Node // unresolved: may be an alias, anchor or tag
}

// maxDepth bounds alias chains, merges and nesting, so that a
// self-referencing alias cannot loop forever.
const maxDepth = 64

// anchorDef is one &name in the file.
type anchorDef struct {
	offset int
	node   ast.Node
}

// collectAnchors records every anchor of the tree, in document order, so
// that an alias resolves to the latest anchor of its name before it, as
// YAML says.
func collectAnchors(n ast.Node, out map[string][]anchorDef, depth int) {
	if n == nil || depth > 10*maxDepth {
		return
	}
	switch n := n.(type) {
	case *ast.DocumentNode:
		collectAnchors(n.Body, out, depth+1)
	case *ast.MappingNode:
		for _, mv := range n.Values {
			if mv == nil {
				continue
			}
			collectAnchors(mv.Key, out, depth+1)
			collectAnchors(mv.Value, out, depth+1)
		}
	case *ast.MappingValueNode:
		collectAnchors(n.Key, out, depth+1)
		collectAnchors(n.Value, out, depth+1)
	case *ast.MappingKeyNode:
		collectAnchors(n.Value, out, depth+1)
	case *ast.SequenceNode:
		for _, v := range n.Values {
			collectAnchors(v, out, depth+1)
		}
	case *ast.TagNode:
		collectAnchors(n.Value, out, depth+1)
	case *ast.AnchorNode:
		if n.Name != nil && n.Start != nil && n.Start.Position != nil {
			name := nodeText(n.Name)
			out[name] = append(out[name], anchorDef{offset: n.Start.Position.Offset, node: n.Value})
		}
		collectAnchors(n.Value, out, depth+1)
	}
}

// nodeText is a scalar node's text, unquoted.
func nodeText(n ast.Node) string {
	switch n := n.(type) {
	case nil:
		return ""
	case *ast.StringNode:
		return n.Value
	case *ast.LiteralNode:
		if n.Value != nil {
			return n.Value.Value
		}
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

// tree is the parsed file with its anchors, and the loader it reports to.
type tree struct {
	l       *loader
	anchors map[string][]anchorDef
	// merged counts the entries merge keys have produced. Merges of
	// merges grow exponentially (the "billion laughs" of YAML), so the
	// total is bounded; exhausted reports that once.
	merged    int
	exhausted bool
}

// maxMerged bounds the entries all merge keys of a file may produce.
const maxMerged = 10_000

// resolved is a node with aliases, anchors and tags looked through.
type resolved struct {
	n ast.Node // nil for an explicit or implicit null
	// at is where the value was written (an alias's own position, not its
	// anchor's, so that a problem points at the line that used it).
	at pos
	// str is set by a !!str tag: the scalar is text whatever it looks like.
	str bool
}

// resolve looks through anchors, tags and aliases. It reports a problem
// with path and returns ok false when an alias has no anchor or a tag is
// one timebox does not read.
func (t *tree) resolve(n ast.Node, path string) (resolved, bool) {
	r := resolved{at: posOf(n)}
	for i := 0; ; i++ {
		if i > maxDepth {
			t.l.errAt(r.at, path, "aliases refer to each other in a loop")
			return r, false
		}
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			tag := ""
			if v.Start != nil {
				tag = v.Start.Value
			}
			switch tag {
			case "!!str":
				r.str = true
			case "!!int", "!!float", "!!bool", "!!null", "!!map", "!!seq":
			default:
				t.l.errAt(posOf(v), path, fmt.Sprintf("the tag %s is not supported (remove it)", tag))
				return r, false
			}
			n = v.Value
		case *ast.AliasNode:
			name := nodeText(v.Value)
			off := -1
			if v.Start != nil && v.Start.Position != nil {
				off = v.Start.Position.Offset
			}
			var target ast.Node
			found := false
			for _, d := range t.anchors[name] {
				if d.offset < off {
					target, found = d.node, true
				}
			}
			if !found {
				t.l.errAt(posOf(v), path, fmt.Sprintf("alias *%s refers to no anchor &%s above it", name, name))
				return r, false
			}
			n = target
		case *ast.NullNode:
			r.n = nil
			return r, true
		default:
			r.n = n
			return r, true
		}
	}
}

// typeName names what a node is, for "expected X, found Y" messages.
func typeName(n ast.Node) string {
	switch n.(type) {
	case nil, *ast.NullNode:
		return "nothing"
	case *ast.MappingNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "true/false"
	}
	return "a " + n.Type().String()
}

// mapping returns the entries of a mapping node. A null (an empty section,
// `timeouts:`) is an empty mapping. Anything else is reported as the wrong
// type. Merge keys (<<: *base) are expanded, the mapping's own keys
// winning over merged ones.
func (t *tree) mapping(n ast.Node, path, what string) ([]entry, bool) {
	return t.mappingDepth(n, path, what, 0)
}

func (t *tree) mappingDepth(n ast.Node, path, what string, depth int) ([]entry, bool) {
	r, ok := t.resolve(n, path)
	if !ok {
		return nil, false
	}
	if r.n == nil {
		return nil, true
	}
	m, isMap := r.n.(*ast.MappingNode)
	if !isMap {
		fix := ""
		switch r.n.(type) {
		case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
			if strings.Contains(what, "{") {
				break // what already shows the mapping
			}
			fix = " (write its keys on the lines below it, indented, or as {key: value, …} on its line)"
		}
		t.l.errAt(r.at, path, fmt.Sprintf("expected %s, found %s%s", what, typeName(r.n), fix))
		return nil, false
	}
	if depth > maxDepth {
		t.l.errAt(r.at, path, "merge keys (<<) nest too deeply")
		return nil, false
	}
	var own, merged []entry
	ok = true
	for _, mv := range m.Values {
		if mv == nil {
			continue
		}
		if _, isMerge := mv.Key.(*ast.MergeKeyNode); isMerge {
			if t.merged > maxMerged {
				if !t.exhausted {
					t.l.errAt(posOf(mv.Key), path, "merge keys (<<) expand to too many entries; write the keys out")
					t.exhausted = true
				}
				ok = false
				continue
			}
			more, mok := t.merge(mv.Value, path, what, depth)
			t.merged += len(more)
			ok = ok && mok
			merged = append(merged, more...)
			continue
		}
		k, kok := t.key(mv.Key, path)
		if !kok {
			ok = false
			continue
		}
		own = append(own, entry{key: k, keyAt: posOf(mv.Key), val: mv.Value})
	}
	if len(merged) == 0 {
		return own, ok
	}
	seen := map[string]bool{}
	for _, e := range own {
		seen[e.key] = true
	}
	for _, e := range merged {
		if !seen[e.key] {
			seen[e.key] = true
			own = append(own, e)
		}
	}
	return own, ok
}

// merge expands the value of a << key: a mapping, or a list of mappings of
// which the earlier win.
func (t *tree) merge(n ast.Node, path, what string, depth int) ([]entry, bool) {
	r, ok := t.resolve(n, path)
	if !ok {
		return nil, false
	}
	if seq, isSeq := r.n.(*ast.SequenceNode); isSeq {
		var out []entry
		for _, v := range seq.Values {
			es, ok := t.mappingDepth(v, path, "a mapping to merge", depth+1)
			if !ok {
				return nil, false
			}
			out = append(out, es...)
		}
		return out, true
	}
	return t.mappingDepth(n, path, "a mapping to merge", depth+1)
}

// key returns a mapping key's text. Keys are plain words in an agent file;
// a list or mapping used as a key is reported.
func (t *tree) key(k ast.MapKeyNode, path string) (string, bool) {
	var n ast.Node = k
	if mk, ok := k.(*ast.MappingKeyNode); ok {
		n = mk.Value
	}
	r, ok := t.resolve(n, path)
	if !ok {
		return "", false
	}
	switch r.n.(type) {
	case *ast.MappingNode, *ast.SequenceNode:
		t.l.errAt(posOf(k), path, fmt.Sprintf("a key must be a word, not %s", typeName(r.n)))
		return "", false
	case nil:
		return "", true
	}
	return nodeText(r.n), true
}

// fields checks a mapping's keys against the known ones, reporting each
// unknown key with a suggestion, and returns the known entries by key.
// hint may give a better suggestion for a specific unknown key (one that
// belongs in another section, say).
func (t *tree) fields(es []entry, path string, known []string, hint func(key string) string) map[string]entry {
	out := make(map[string]entry, len(es))
	for _, e := range es {
		if path == "" && strings.HasPrefix(e.key, "x-") {
			// Top-level x- keys hold anchors for the rest of the file to
			// use (x-defaults: &defaults {...}), as in Compose files. The
			// prefix is deliberate, so it cannot be a typo.
			continue
		}
		if contains(known, e.key) {
			out[e.key] = e
			continue
		}
		msg := "unknown key"
		h := ""
		if hint != nil {
			h = hint(e.key)
		}
		if h == "" {
			h = didYouMean(e.key, known)
		}
		if h == "" {
			sorted := append([]string(nil), known...)
			sort.Strings(sorted)
			h = " (known keys: " + strings.Join(sorted, ", ") + ")"
		}
		t.l.errAt(e.keyAt, join(path, e.key), msg+h)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// join appends a key to a path: "timeouts" + "tool" → "timeouts.tool".
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// scalar reads a scalar value. A null is reported as missing, a mapping or
// list as the wrong type; what says what was expected ("a duration").
func (t *tree) scalar(n ast.Node, path, what string) (value, pos, bool) {
	r, ok := t.resolve(n, path)
	if !ok {
		return value{}, r.at, false
	}
	switch v := r.n.(type) {
	case nil:
		t.l.errAt(r.at, path, fmt.Sprintf("has no value (give %s, or remove the key)", what))
		return value{}, r.at, false
	case *ast.StringNode, *ast.LiteralNode:
		return value{text: nodeText(v)}, r.at, true
	case *ast.BoolNode:
		return value{text: nodeText(v), bare: !r.str}, r.at, true
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return value{text: nodeText(v), number: !r.str}, r.at, true
	}
	if s, ok := glued(r.n); ok {
		return value{text: s}, r.at, true // what YAML means by it
	}
	t.l.errAt(r.at, path, fmt.Sprintf("expected %s, found %s", what, typeName(r.n)))
	return value{}, r.at, false
}

// glued returns the text of a mapping of one pair written "key:value",
// without a space after the colon, and whether n is one. YAML reads that
// as one string, but the YAML reader (goccy/go-yaml) reads it inside a
// flow list as a mapping: `fallbacks: [openai:gpt-4o-mini]` in a flow
// mapping, `exec: [echo, a:b]`. Where a scalar is expected, it is read as
// YAML means it.
func glued(n ast.Node) (string, bool) {
	m, ok := n.(*ast.MappingNode)
	if !ok || len(m.Values) != 1 {
		return "", false
	}
	kv := m.Values[0]
	k, v := kv.Key.GetToken(), kv.Value.GetToken()
	if k == nil || v == nil || k.Position == nil || v.Position == nil {
		return "", false
	}
	switch kv.Value.(type) {
	case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
	default:
		return "", false
	}
	if k.Position.Line != v.Position.Line || v.Position.Column != k.Position.Column+len([]rune(k.Value))+1 {
		return "", false
	}
	return k.Value + ":" + v.Value, true
}

// str reads a scalar as text. Numbers and booleans are taken as written:
// `exec: [./x, --depth, 2]` means the argument "2".
func (t *tree) str(n ast.Node, path, what string) (string, pos, bool) {
	v, at, ok := t.scalar(n, path, what)
	return v.text, at, ok
}

// list returns the items of a list node; a null is an empty list. notList
// is the message when the node is a string or number (a shell string where
// an argv goes, say); empty uses the generic "expected a list".
func (t *tree) list(n ast.Node, path, notList string) ([]ast.Node, pos, bool) {
	r, ok := t.resolve(n, path)
	if !ok {
		return nil, r.at, false
	}
	switch v := r.n.(type) {
	case nil:
		return nil, r.at, true
	case *ast.SequenceNode:
		return v.Values, r.at, true
	case *ast.MappingNode:
		t.l.errAt(r.at, path, "expected a list, found a mapping")
		return nil, r.at, false
	}
	if notList != "" {
		t.l.errAt(r.at, path, notList)
	} else {
		t.l.errAt(r.at, path, fmt.Sprintf("expected a list, found %s", typeName(r.n)))
	}
	return nil, r.at, false
}

// maxJSONNodes bounds the size of an input_schema after aliases are
// expanded, so that a few lines of nested aliases cannot make gigabytes.
const maxJSONNodes = 100_000

// toJSON converts a YAML value to a Go value that encoding/json renders:
// mappings become objects (keys must be strings), lists arrays.
func (t *tree) toJSON(n ast.Node, path string, depth int, left *int) (any, bool) {
	*left--
	if *left < 0 {
		t.l.errAt(posOf(n), path, "is too large")
		return nil, false
	}
	if depth > maxDepth {
		t.l.errAt(posOf(n), path, "nests too deeply")
		return nil, false
	}
	r, ok := t.resolve(n, path)
	if !ok {
		return nil, false
	}
	switch v := r.n.(type) {
	case nil:
		return nil, true
	case *ast.MappingNode:
		es, ok := t.mappingDepth(v, path, "a mapping", depth)
		if !ok {
			return nil, false
		}
		m := make(map[string]any, len(es))
		for _, e := range es {
			x, ok := t.toJSON(e.val, join(path, e.key), depth+1, left)
			if !ok {
				return nil, false
			}
			m[e.key] = x
		}
		return m, true
	case *ast.SequenceNode:
		out := make([]any, 0, len(v.Values))
		for i, item := range v.Values {
			x, ok := t.toJSON(item, fmt.Sprintf("%s[%d]", path, i), depth+1, left)
			if !ok {
				return nil, false
			}
			out = append(out, x)
		}
		return out, true
	case *ast.StringNode, *ast.LiteralNode:
		return nodeText(v), true
	case *ast.BoolNode:
		if r.str {
			return nodeText(v), true
		}
		return v.Value, true
	case *ast.IntegerNode:
		if r.str {
			return nodeText(v), true
		}
		return v.Value, true
	case *ast.FloatNode:
		if r.str {
			return nodeText(v), true
		}
		return v.Value, true
	case *ast.InfinityNode, *ast.NanNode:
		if r.str {
			return nodeText(v), true
		}
		t.l.errAt(r.at, path, fmt.Sprintf("%s has no JSON form (use a finite number)", nodeText(v)))
		return nil, false
	}
	t.l.errAt(r.at, path, fmt.Sprintf("%s has no JSON form", typeName(r.n)))
	return nil, false
}
