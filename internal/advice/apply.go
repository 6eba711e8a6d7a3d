package advice

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Edit is one budget to write into the agent file.
type Edit struct {
	// Tool is the tool's name as its records have it: an entry's name, or
	// for a tool an MCP server lists, ENTRY__TOOL (docs/decisions/mcp-tool-names.md).
	Tool string
	// Key is "timeout" or "idle_timeout".
	Key   string
	Value time.Duration
}

// Apply returns the agent file src with each edit made where its tool is
// declared: in the tool's entry of tools, or for a tool an MCP server
// lists, under overrides in the server's entry (by the server's name for
// it). A key that is there gets its value replaced; one that is not is
// added — in a block mapping on a line of its own, after the entry's exec
// or mcp line (idle_timeout after timeout) when that is one line, else
// after its name; in a flow mapping before its closing brace. Every other
// byte is kept: comments, blank lines, quoting, order. An edit that cannot
// be made — its tool is not in the file (a Go tool), its entry is an alias,
// the file has no tools list — is skipped, and why is in skipped.
//
// The edits are made one after the other, each on the file the one
// before left, so that they never see stale positions.
//
// A file whose every line ends in CRLF is edited as the same file with LF
// endings, and written back with CRLF: the YAML reader's positions do not
// follow CRLF lines everywhere (after a comment, say), and edits made by
// them landed on the wrong lines.
func Apply(src []byte, edits []Edit) (out []byte, skipped []string, err error) {
	crlf := bytes.Contains(src, []byte("\r\n")) && bytes.Count(src, []byte("\r\n")) == bytes.Count(src, []byte("\n"))
	if crlf {
		src = bytes.ReplaceAll(src, []byte("\r\n"), []byte("\n"))
		defer func() {
			if out != nil {
				out = bytes.ReplaceAll(out, []byte("\n"), []byte("\r\n"))
			}
		}()
	}
	out = src
	for _, e := range edits {
		next, why, err := apply1(out, e)
		if err != nil {
			return nil, nil, err
		}
		if why != "" {
			skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Tool, e.Key, why))
			continue
		}
		out = next
	}
	return out, skipped, nil
}

// file is the agent file being edited: its bytes and where each line
// starts.
type file struct {
	src   []byte
	lines []int // byte offset of each line's start; lines[0] is line 1
	nl    string
}

func newFile(src []byte) *file {
	f := &file{src: src, lines: []int{0}, nl: "\n"}
	for i, c := range src {
		if c == '\n' {
			f.lines = append(f.lines, i+1)
		}
	}
	if bytes.Contains(src, []byte("\r\n")) {
		f.nl = "\r\n"
	}
	return f
}

// offset returns the byte offset of a token's first character (goccy
// counts columns in characters).
func (f *file) offset(tk *token.Token) (int, bool) {
	if tk == nil || tk.Position == nil || tk.Position.Line < 1 || tk.Position.Line > len(f.lines) {
		return 0, false
	}
	off := f.lines[tk.Position.Line-1]
	for col := 1; col < tk.Position.Column; col++ {
		if off >= len(f.src) || f.src[off] == '\n' {
			return 0, false
		}
		_, size := utf8.DecodeRune(f.src[off:])
		off += size
	}
	return off, true
}

// lineEnd returns the offset just past the end of line n (its newline).
func (f *file) lineEnd(n int) int {
	if n < len(f.lines) {
		return f.lines[n]
	}
	return len(f.src)
}

// indentAt returns the spaces that put a line's key in column col.
func indentAt(col int) string { return strings.Repeat(" ", max(col-1, 0)) }

func (f *file) splice(at, end int, text string) []byte {
	out := make([]byte, 0, len(f.src)+len(text))
	out = append(out, f.src[:at]...)
	out = append(out, text...)
	return append(out, f.src[end:]...)
}

// insertLine inserts a line before offset at, which starts a line (or is
// the end of a file without a final newline).
func (f *file) insertLine(at int, line string) []byte {
	if at == len(f.src) && len(f.src) > 0 && f.src[len(f.src)-1] != '\n' {
		return f.splice(at, at, f.nl+line)
	}
	return f.splice(at, at, line+f.nl)
}

func apply1(src []byte, e Edit) (out []byte, skip string, err error) {
	doc, err := parse(src)
	if err != nil {
		return nil, "", err
	}
	f := newFile(src)
	root, ok := doc.(*ast.MappingNode)
	if !ok {
		return nil, "the agent file is not a mapping", nil
	}
	tools, ok := valueOf(root, "tools").(*ast.SequenceNode)
	if !ok {
		return nil, "the agent file has no tools list", nil
	}
	value := Format(e.Value)
	var mcpEntry *ast.MappingNode
	var serverName string
	for _, item := range tools.Values {
		entry, ok := item.(*ast.MappingNode)
		if !ok {
			continue
		}
		name := scalarText(valueOf(entry, "name"))
		if name == e.Tool {
			return f.setKey(entry, e.Key, value, anchorsFor(e.Key))
		}
		if rest, ok := strings.CutPrefix(e.Tool, name+"__"); ok && name != "" && valueOf(entry, "mcp") != nil && rest != "" {
			mcpEntry, serverName = entry, rest
		}
	}
	if mcpEntry == nil {
		return nil, "not declared in the agent file (a Go tool's budget is set in code)", nil
	}
	switch ov := valueOf(mcpEntry, "overrides").(type) {
	case nil:
		return f.insertKey(mcpEntry, "overrides", fmt.Sprintf("{%s: {%s: %s}}", yamlKey(serverName), e.Key, value), []string{"mcp", "name"})
	case *ast.MappingNode:
		switch o := valueOf(ov, serverName).(type) {
		case nil:
			if hasKey(ov, serverName) {
				return nil, fmt.Sprintf("overrides.%s is empty: give it a mapping by hand", serverName), nil
			}
			return f.insertKey(ov, yamlKey(serverName), fmt.Sprintf("{%s: %s}", e.Key, value), nil)
		case *ast.MappingNode:
			return f.setKey(o, e.Key, value, anchorsFor(e.Key))
		default:
			return nil, fmt.Sprintf("overrides.%s is not a mapping", serverName), nil
		}
	default:
		return nil, "its entry's overrides is not a mapping", nil
	}
}

// anchorsFor lists the keys after whose line a new key is added, in order
// of preference.
func anchorsFor(key string) []string {
	if key == "idle_timeout" {
		return []string{"timeout", "exec", "mcp", "name"}
	}
	return []string{"exec", "mcp", "name"}
}

// setKey replaces the value of key in m, or adds key: value.
func (f *file) setKey(m *ast.MappingNode, key, value string, anchors []string) ([]byte, string, error) {
	for _, mv := range m.Values {
		if scalarText(mv.Key) != key {
			continue
		}
		at, end, ok := f.scalarSpan(mv.Value)
		if !ok {
			return nil, fmt.Sprintf("its %s is not a plain value (an alias, a tag or a block); edit it by hand", key), nil
		}
		return f.splice(at, end, value), "", nil
	}
	return f.insertKey(m, key, value, anchors)
}

// insertKey adds key: value to m.
func (f *file) insertKey(m *ast.MappingNode, key, value string, anchors []string) ([]byte, string, error) {
	if m.IsFlowStyle {
		end, ok := f.offset(m.End)
		if !ok {
			return nil, "the position of its mapping is unknown", nil
		}
		i := end
		for i > 0 && (f.src[i-1] == ' ' || f.src[i-1] == '\t' || f.src[i-1] == '\n' || f.src[i-1] == '\r') {
			i--
		}
		sep := ", "
		if i > 0 && f.src[i-1] == '{' {
			sep = ""
		}
		return f.splice(i, i, sep+key+": "+value), "", nil
	}
	if len(m.Values) == 0 || m.Values[0].Key == nil {
		return nil, "its mapping is empty", nil
	}
	first := m.Values[0].Key.GetToken()
	col := first.Position.Column
	line := indentAt(col) + key + ": " + value
	for _, a := range anchors {
		for _, mv := range m.Values {
			if scalarText(mv.Key) == a {
				if n, ok := f.oneLine(mv); ok {
					return f.insertLine(f.lineEnd(n), line), "", nil
				}
			}
		}
	}
	// Before the first key, when it starts its line.
	at, ok := f.offset(first)
	if ok && strings.TrimLeft(string(f.src[f.lines[first.Position.Line-1]:at]), " ") == "" {
		return f.insertLine(f.lines[first.Position.Line-1], line), "", nil
	}
	return nil, "found no line to add it after; add it by hand", nil
}

// oneLine returns the line of an entry whose key and value are on one
// line (a plain or quoted value, or a flow collection closed there).
func (f *file) oneLine(mv *ast.MappingValueNode) (int, bool) {
	kt := mv.Key.GetToken()
	if kt == nil || kt.Position == nil || mv.Value == nil {
		return 0, false
	}
	n := kt.Position.Line
	switch v := mv.Value.(type) {
	case *ast.MappingNode:
		return n, v.IsFlowStyle && v.End != nil && v.End.Position != nil && v.End.Position.Line == n
	case *ast.SequenceNode:
		return n, v.IsFlowStyle && v.End != nil && v.End.Position != nil && v.End.Position.Line == n
	case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		vt := v.GetToken()
		return n, vt.Position != nil && vt.Position.Line == n && !strings.Contains(vt.Value, "\n")
	}
	return 0, false
}

// scalarSpan returns where a plain or quoted single-line scalar's text is.
func (f *file) scalarSpan(n ast.Node) (int, int, bool) {
	switch n.(type) {
	case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode:
	default:
		return 0, 0, false
	}
	tk := n.GetToken()
	at, ok := f.offset(tk)
	if !ok || strings.Contains(tk.Value, "\n") {
		return 0, 0, false
	}
	switch q := f.src[at]; q {
	case '"', '\'':
		for i := at + 1; i < len(f.src) && f.src[i] != '\n'; i++ {
			switch {
			case q == '"' && f.src[i] == '\\':
				i++
			case f.src[i] == q && q == '\'' && i+1 < len(f.src) && f.src[i+1] == '\'':
				i++
			case f.src[i] == q:
				return at, i + 1, true
			}
		}
		return 0, 0, false
	}
	end := at + len(tk.Value)
	if end > len(f.src) || string(f.src[at:end]) != tk.Value {
		return 0, 0, false
	}
	return at, end, true
}

// parse parses the agent file; goccy's parser is third-party code, and a
// panic in it is an error here.
func parse(src []byte) (body ast.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			body, err = nil, fmt.Errorf("the agent file could not be parsed (%v)", r)
		}
	}()
	f, err := parser.ParseBytes(src, parser.ParseComments)
	if err != nil {
		return nil, fmt.Errorf("the agent file could not be parsed: %w", err)
	}
	if len(f.Docs) != 1 || f.Docs[0] == nil {
		return nil, fmt.Errorf("the agent file holds %d YAML documents, not one", len(f.Docs))
	}
	return f.Docs[0].Body, nil
}

// valueOf returns the value of key in m, nil when m has no such key or
// it is empty.
func valueOf(m *ast.MappingNode, key string) ast.Node {
	for _, mv := range m.Values {
		if scalarText(mv.Key) == key {
			if _, null := mv.Value.(*ast.NullNode); null {
				return nil
			}
			return mv.Value
		}
	}
	return nil
}

func hasKey(m *ast.MappingNode, key string) bool {
	for _, mv := range m.Values {
		if scalarText(mv.Key) == key {
			return true
		}
	}
	return false
}

// scalarText returns a scalar node's value, "" for anything else.
func scalarText(n ast.Node) string {
	switch n := n.(type) {
	case *ast.StringNode:
		return n.Value
	case *ast.MappingKeyNode:
		return scalarText(n.Value)
	case nil:
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		switch n.(type) {
		case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
			return tk.Value
		}
	}
	return ""
}

var plainKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)

// yamlKey writes a server's tool name as a mapping key: plain when it can
// be, double-quoted otherwise.
func yamlKey(s string) string {
	if plainKeyRE.MatchString(s) {
		return s
	}
	return strconv.Quote(s)
}
