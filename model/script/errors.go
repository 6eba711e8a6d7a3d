package script

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/internal/regular"
)

// ParseError is one problem of a script, in the form of every problem of
// a file timebox reads (internal/problem, spec §10):
//
//	script.jsonl:5:34: first_chunk_delay: 50 is not a duration (a duration is a string like "50ms")
//
// File is the script as it was named to Parse; Line and Col (1-based, Col
// in characters) point at the offending value, or at the key of an
// unknown field; Key is the path of the field in question
// ("tool_calls[0].name"), empty when the problem is the whole line's.
type ParseError = problem.Problem

// ParseErrors is every problem of a script, by line then column: Parse
// goes on past a bad line so that a person fixes every line in one pass.
// errors.As finds its first *ParseError.
type ParseErrors = problem.List

// Pos is a place in a script file: the file as problems name it, and a
// 1-based line and column (in characters).
type Pos struct {
	// File is the script file as problems name it.
	File string
	// Line and Col are 1-based; Col counts characters, not bytes.
	Line, Col int
}

// cutOff is the problem of a line whose JSON ends before its value does,
// the last line of a file cut short, typically.
const cutOff = "the line ends before its JSON value does — is it cut off?"

// oneObject is the fix of a line that is not one JSON object.
const oneObject = `each line is one JSON object, such as {"text": "Hello"}`

// lineParser reads one line of a script: it checks the line's JSON against
// the fields of Line and the values they take, noting every problem with
// its place and field, then decodes it.
type lineParser struct {
	name string
	n    int    // the line's number
	text []byte // the whole line, for columns
	b    []byte // the line's JSON value
	i    int    // the next byte of b to read
	// at is where each field's value starts in b, by field path, to place
	// the problems found once the line has decoded.
	at       map[string]int
	problems []*ParseError
	// colOff and colN are the last column counted (byte colOff of text is
	// column colN), so that the columns of a line's many tool calls are
	// counted on from the previous one, not from the line's start.
	colOff, colN int
}

// parseLine reads line n of the script: text is the whole line, raw the
// line without the spaces around it.
func parseLine(name string, n int, text, raw []byte) (Line, []*ParseError) {
	p := &lineParser{name: name, n: n, text: text, at: map[string]int{}}
	if off, problem := regular.NotUTF8(raw); off >= 0 {
		// The decoder would read each bad byte as U+FFFD, without a word.
		p.report(off, "", "the line is not UTF-8 text: "+problem)
		return Line{}, p.problems
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		var syn *json.SyntaxError
		switch {
		case errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &syn) && syn.Error() == "unexpected end of JSON input":
			p.report(len(raw), pathAt(raw), cutOff)
		case errors.As(err, &syn):
			off := min(max(int(syn.Offset)-1, 0), len(raw)-1)
			p.report(off, pathAt(raw[:off]), syntaxProblem(syn.Error(), raw, off))
		default:
			p.report(0, "", strings.TrimPrefix(err.Error(), "json: "))
		}
		return Line{}, p.problems
	}
	if end := int(dec.InputOffset()); end < len(raw) {
		p.report(end+len(raw[end:])-len(bytes.TrimLeft(raw[end:], " \t\r\n")), "",
			"one JSON object per line, found more after it")
		return Line{}, p.problems
	}
	p.b = v
	p.walk(lineType, "")
	if len(p.problems) > 0 {
		return Line{}, p.problems
	}
	var l Line
	d := json.NewDecoder(bytes.NewReader(v))
	d.DisallowUnknownFields()
	if err := d.Decode(&l); err != nil {
		// The checks above should have found it; say what the decoder
		// says rather than nothing.
		p.report(0, "", strings.TrimPrefix(err.Error(), "json: "))
		return Line{}, p.problems
	}
	for _, c := range l.check() {
		p.report(p.place(c.key), c.key, c.msg)
	}
	for j := range l.ToolCalls {
		l.ToolCalls[j].At = Pos{File: name, Line: n, Col: p.col(p.place(fmt.Sprintf("tool_calls[%d].name", j)))}
	}
	return l, p.problems
}

// syntaxProblem words the JSON syntax error msg, found at byte off of the
// line's JSON b, with a fix for the common slips.
func syntaxProblem(msg string, b []byte, off int) string {
	c := b[off]
	before := bytes.TrimRight(b[:off], " \t\r\n")
	lookingForValue := strings.HasSuffix(msg, "looking for beginning of value")
	fix := oneObject
	switch {
	case strings.HasSuffix(msg, "after array element"):
		fix = "a comma or ] is missing before it"
	case strings.HasSuffix(msg, "after object key:value pair"):
		fix = "a comma or } is missing before it"
	case strings.HasSuffix(msg, "after object key"):
		fix = "a colon is missing after the key"
	case (c == '}' || c == ']') && bytes.HasSuffix(before, []byte(",")):
		fix = "remove the comma before it: JSON allows none after the last item"
	case (c == '}' || c == ',') && bytes.HasSuffix(before, []byte(":")):
		fix = "the value is missing after the colon"
	case c == '\'':
		fix = "JSON strings are in double quotes"
	case lookingForValue && unicode.IsLetter(rune(c)):
		fix = `a string is in double quotes, such as "hello"`
	case strings.HasSuffix(msg, "looking for beginning of object key string"):
		fix = `a key is a string in double quotes, such as "text"`
	}
	return msg + " (" + fix + ")"
}

// pathAt is the field path at the end of b, the start of a line whose
// JSON went wrong there: the key whose value was being read, or the list
// or object it was in. b need not be valid JSON.
func pathAt(b []byte) string {
	type frame struct {
		list bool
		key  string // an object's key whose value is being read, or ""
		done bool   // the key's value is complete
		n    int    // a list's item
	}
	var stack []frame
	expectKey := false
	for i := 0; i < len(b); i++ {
		top := len(stack) - 1
		switch b[i] {
		case '"':
			start := i
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			switch {
			case top < 0 || stack[top].list || i >= len(b):
			case expectKey:
				var key string
				if json.Unmarshal(b[start:i+1], &key) == nil {
					stack[top].key = key
				}
			default:
				stack[top].done = true
			}
		case '{':
			stack = append(stack, frame{})
			expectKey = true
		case '[':
			stack = append(stack, frame{list: true})
			expectKey = false
		case '}', ']':
			if top >= 0 {
				stack = stack[:top]
			}
			if top > 0 {
				stack[top-1].done = true
			}
			expectKey = false
		case ':':
			expectKey = false
		case ',':
			if top >= 0 {
				if stack[top].list {
					stack[top].n++
				} else {
					stack[top].key, stack[top].done, expectKey = "", false, true
				}
			}
		}
	}
	path := ""
	for k, f := range stack {
		switch {
		case f.list && k < len(stack)-1:
			path += "[" + strconv.Itoa(f.n) + "]"
		case !f.list && f.key != "" && !f.done:
			path = join(path, f.key)
		case !f.list:
			return path
		}
	}
	return path
}

// report notes a problem at byte offset off of the line's JSON. A key
// path longer than maxKeyShown (a line nested ten thousand deep) is shown
// by its start and end.
func (p *lineParser) report(off int, key, msg string) {
	if len(key) > maxKeyShown {
		key = strings.ToValidUTF8(key[:maxKeyShown/2], "") + "…" + strings.ToValidUTF8(key[len(key)-maxKeyShown/2:], "")
	}
	p.problems = append(p.problems, &ParseError{File: p.name, Line: p.n, Col: p.col(off), Key: key, Msg: msg})
}

// givenTwice is the problem of a field given twice.
const givenTwice = "given twice (give each field once)"

// maxKeyShown is the longest key path a problem shows whole.
const maxKeyShown = 120

// col is the 1-based column, in characters, of byte offset off of the
// line's JSON within the whole line.
func (p *lineParser) col(off int) int {
	lead := len(p.text) - len(bytes.TrimLeftFunc(p.text, unicode.IsSpace))
	off = min(max(lead+off, 0), len(p.text))
	if off < p.colOff {
		p.colOff, p.colN = 0, 0
	}
	p.colN += utf8.RuneCount(p.text[p.colOff:off])
	p.colOff = off
	return 1 + p.colN
}

// place is where the value of the field at path starts, or that of the
// nearest field that holds it ("tool_calls[0]" for a missing
// "tool_calls[0].name"), or the line's start.
func (p *lineParser) place(path string) int {
	for path != "" {
		if off, ok := p.at[path]; ok {
			return off
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

var (
	lineType     = reflect.TypeFor[Line]()
	durationType = reflect.TypeFor[Duration]()
	rawType      = reflect.TypeFor[json.RawMessage]()
)

// shape says what a value of a line's object or list must be and how to
// write one.
type shape struct {
	what, fix string
	// owner names an object in a message: "text is a field of the line".
	owner string
}

var shapes = map[reflect.Type]shape{
	lineType:                    {"an object", oneObject, "the line"},
	reflect.TypeFor[Call]():     {"a call", `a call is an object, such as {"name": "search", "arguments": {}}`, "a call in tool_calls"},
	reflect.TypeFor[Failure]():  {"an object", `such as {"status": 503, "message": "overloaded"}`, "error"},
	reflect.TypeFor[[]string](): {"a list of strings", `such as ["Hel", "lo"]`, ""},
	reflect.TypeFor[[]Call]():   {"a list of calls", `such as [{"name": "search", "arguments": {}}], even for one call`, ""},
}

// objects are the objects of a line, in the order a hint looks for the
// one a misplaced field belongs to.
var objects = []reflect.Type{lineType, reflect.TypeFor[Call](), reflect.TypeFor[Failure]()}

// walk checks the JSON value at p.i against t, the Go type it decodes
// into, as encoding/json will decode it: null is the zero value of any
// field, and a key matches a field whatever its case. Each problem is
// noted under path, the value's field path, and the walk goes on.
func (p *lineParser) walk(t reflect.Type, path string) {
	p.ws()
	start := p.i
	if path != "" {
		p.at[path] = start
	}
	if p.b[start] == 'n' {
		p.skip()
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == rawType:
		p.skip()
	case t == durationType:
		lit, s, isStr := p.scalar()
		switch {
		case !isStr:
			p.report(start, path, p.notA(lit, "duration", `a duration is a string like "50ms"`))
		default:
			if _, problem := parseDuration(s); problem != "" {
				p.report(start, path, problem)
			}
		}
	case t.Kind() == reflect.Struct:
		p.object(t, path)
	case t.Kind() == reflect.Slice:
		if p.b[start] != '[' {
			p.wrong(t, path)
			return
		}
		p.i++
		for k := 0; ; k++ {
			p.ws()
			if p.b[p.i] == ']' {
				p.i++
				return
			}
			if k > 0 {
				p.i++ // the comma
			}
			p.walk(t.Elem(), path+"["+strconv.Itoa(k)+"]")
			p.ws()
		}
	case t.Kind() == reflect.String:
		if lit, _, isStr := p.scalar(); !isStr {
			p.report(start, path, p.notA(lit, "string", "put it in quotes: "+strconv.Quote(string(lit))))
		}
	case t.Kind() == reflect.Bool:
		lit, s, isStr := p.scalar()
		switch {
		case isStr && (s == "true" || s == "false"):
			p.report(start, path, p.notA(lit, "boolean", "write it without quotes: "+s))
		case string(lit) != "true" && string(lit) != "false":
			p.report(start, path, p.notA(lit, "boolean", "give true or false"))
		}
	case t.Kind() == reflect.Int:
		lit, s, isStr := p.scalar()
		if isStr {
			fix := "give a whole number, without quotes"
			if _, err := strconv.Atoi(s); err == nil {
				fix = "write it without quotes: " + s
			}
			p.report(start, path, p.notA(lit, "whole number", fix))
			return
		}
		if _, err := strconv.ParseInt(string(lit), 10, strconv.IntSize); err != nil {
			f, ferr := strconv.ParseFloat(string(lit), 64)
			switch {
			case ferr != nil || math.Abs(f) >= 1e18:
				p.report(start, path, fmt.Sprintf("%s is too large", clip(lit)))
			case f == math.Trunc(f):
				p.report(start, path, p.notA(lit, "whole number", "write "+strconv.FormatInt(int64(f), 10)))
			default:
				p.report(start, path, p.notA(lit, "whole number", "give a whole number"))
			}
		}
	default:
		// A kind no field of a line has today: encoding/json decides.
		p.skip()
	}
}

// object checks the object at p.i against the struct t.
func (p *lineParser) object(t reflect.Type, path string) {
	if p.b[p.i] != '{' {
		p.wrong(t, path)
		return
	}
	p.i++
	seen := map[string]bool{}
	for k := 0; ; k++ {
		p.ws()
		if p.b[p.i] == '}' {
			p.i++
			return
		}
		if k > 0 {
			p.i++ // the comma
			p.ws()
		}
		keyAt := p.i
		_, key, _ := p.scalar()
		p.ws()
		p.i++ // the colon
		f, ok := field(t, key)
		if !ok {
			p.report(keyAt, join(path, key), "unknown field ("+unknownHint(t, path, key)+")")
			p.ws()
			p.skip()
			continue
		}
		if name := jsonName(f); seen[name] {
			// The decoder would keep the last of them without a word, as
			// the agent file and the API refuse to.
			p.report(keyAt, join(path, name), givenTwice)
			p.ws()
			p.skip()
			continue
		} else {
			seen[name] = true
		}
		p.walk(f.Type, join(path, jsonName(f)))
	}
}

// wrong reports a value at p.i that is not the object or list t, and
// skips it.
func (p *lineParser) wrong(t reflect.Type, path string) {
	start := p.i
	found := kindOf(p.b[start])
	p.skip()
	s, ok := shapes[t]
	if !ok {
		s.what = "a " + t.Kind().String()
	}
	msg := fmt.Sprintf("expected %s, found %s", s.what, found)
	if path == "" {
		msg = fmt.Sprintf("the line is %s, not an object", found)
	}
	if s.fix != "" {
		msg += " (" + s.fix + ")"
	}
	p.report(start, path, msg)
}

// notA words a scalar lit that is not what a field takes: 50 is not a
// duration (fix). An object or a list is named by its kind.
func (p *lineParser) notA(lit []byte, what, fix string) string {
	if c := lit[0]; c == '{' || c == '[' {
		return fmt.Sprintf("expected a %s, found %s", what, kindOf(c))
	}
	return fmt.Sprintf("%s is not a %s (%s)", clip(lit), what, fix)
}

// kindOf names the kind of the JSON value that starts with c.
func kindOf(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// clip shortens a value quoted in a message.
func clip(lit []byte) string {
	const max = 40
	if utf8.RuneCount(lit) <= max {
		return string(lit)
	}
	r := []rune(string(lit))
	return string(r[:max]) + "…"
}

// field finds the field of struct t that key names, as encoding/json
// does: exactly, else whatever the case.
func field(t reflect.Type, key string) (reflect.StructField, bool) {
	var folded reflect.StructField
	found := false
	for f := range t.Fields() {
		name := jsonName(f)
		if name == "" {
			continue
		}
		if name == key {
			return f, true
		}
		if !found && strings.EqualFold(name, key) {
			folded, found = f, true
		}
	}
	return folded, found
}

// jsonName is the JSON name of a field, or "" for one that is not read.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	return name
}

// fieldsOf lists the JSON names of struct t, sorted.
func fieldsOf(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		if name := jsonName(f); name != "" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// unknownHint is the fix of an unknown key of struct t at path: the field
// meant, the object the key belongs to, or the fields there are.
func unknownHint(t reflect.Type, path, key string) string {
	names := fieldsOf(t)
	if c := problem.Suggest(key, names); c != "" {
		return "did you mean " + c + "?"
	}
	for _, other := range objects {
		if other == t {
			continue
		}
		if _, ok := field(other, key); ok {
			where := path
			if where == "" {
				where = "the line"
			}
			return fmt.Sprintf("%s is a field of %s, not of %s", key, shapes[other].owner, where)
		}
	}
	return "the fields of " + shapes[t].owner + " are " + strings.Join(names, ", ")
}

// join appends a key to a path: "error" + "status" → "error.status".
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// ws skips the spaces JSON allows between tokens.
func (p *lineParser) ws() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// scalar reads the value at p.i (any value; a string is decoded into s)
// and returns it as written.
func (p *lineParser) scalar() (lit []byte, s string, isStr bool) {
	start := p.i
	p.skip()
	lit = p.b[start:p.i]
	if lit[0] == '"' {
		_ = json.Unmarshal(lit, &s) // valid: the line decoded
		return lit, s, true
	}
	return lit, "", false
}

// skip moves p.i past the value at p.i. The line's JSON is valid (it
// decoded), so only strings and nesting need care.
func (p *lineParser) skip() {
	depth := 0
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			for p.i++; p.b[p.i] != '"'; p.i++ {
				if p.b[p.i] == '\\' {
					p.i++
				}
			}
			p.i++
		case c == '{' || c == '[':
			depth++
			p.i++
			continue
		case c == '}' || c == ']':
			if depth == 0 {
				return // the end of a number, true, false or null
			}
			depth--
			p.i++
		case depth == 0 && (c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return
		default:
			p.i++ // a byte of a number, true, false or null, or between values
			continue
		}
		if depth == 0 {
			return
		}
	}
}

// parseDuration reads a duration as a script writes it ("50ms"), or says
// what is wrong with s and how to fix it.
func parseDuration(s string) (Duration, string) {
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fmt.Sprintf("%q is not a duration (use Go syntax like \"50ms\" or \"2s\")", s)
	case v < 0:
		return 0, fmt.Sprintf("%q is negative (give 0 or more, like \"50ms\")", s)
	}
	return Duration(v), ""
}

// lineProblem is a problem of a line that decoded: the field and what is
// wrong with it.
type lineProblem struct{ key, msg string }

// check reports what is wrong with a line that decoded, every problem.
func (l Line) check() []lineProblem {
	var out []lineProblem
	if l.Text != "" && len(l.Chunks) > 0 {
		out = append(out, lineProblem{"chunks", "give text or chunks, not both"})
	}
	if l.Compaction && len(l.ToolCalls) > 0 {
		out = append(out, lineProblem{"tool_calls", "a compaction line is a summary: it cannot have tool_calls"})
	}
	if l.StallAfter != nil && *l.StallAfter < 0 {
		out = append(out, lineProblem{"stall_after", fmt.Sprintf("%d is negative (give a number of chunks, 0 or more)", *l.StallAfter)})
	}
	for i, e := range l.ExpectInRequest {
		if e == "" {
			out = append(out, lineProblem{fmt.Sprintf("expect_in_request[%d]", i), "an empty text is in every request (give the text the request must contain)"})
		}
	}
	for i, c := range l.ToolCalls {
		if c.Name == "" {
			out = append(out, lineProblem{fmt.Sprintf("tool_calls[%d].name", i), `a call needs the name of its tool (such as "name": "search")`})
		}
	}
	if f := l.Error; f != nil && f.Status != 0 && (f.Status < 100 || f.Status > 599) {
		out = append(out, lineProblem{"error.status", fmt.Sprintf("%d is not an HTTP status (give 100 to 599, or 0 for a connection failure)", f.Status)})
	}
	return out
}

// UnknownTools returns a problem for each call of lines to a tool that is
// not one of tools (the agent's tools, in the order to list them), placed
// at the call's name. A script may call a missing tool on purpose (the
// model is told, as a real model would be), so these are warnings, for
// `timebox validate`.
func UnknownTools(lines []Line, tools []string) ParseErrors {
	has := make(map[string]bool, len(tools))
	for _, t := range tools {
		has[t] = true
	}
	list := "it has no tools"
	if len(tools) > 0 {
		list = "its tools: " + strings.Join(tools, ", ")
	}
	var out ParseErrors
	for _, l := range lines {
		for j, c := range l.ToolCalls {
			if has[c.Name] {
				continue
			}
			hint := list
			if s := problem.Suggest(c.Name, tools); s != "" {
				hint = "did you mean " + s + "? " + list
			}
			out = append(out, &ParseError{File: c.At.File, Line: c.At.Line, Col: c.At.Col, Key: fmt.Sprintf("tool_calls[%d].name", j),
				Msg: fmt.Sprintf("%q is not a tool of this agent (%s)", c.Name, hint)})
		}
	}
	return out
}
