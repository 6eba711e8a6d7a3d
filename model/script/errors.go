package script

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ParseError is a problem of one line of a script: where it is (1-based
// line and column) and what is wrong, with a fix where there is one. Its
// text is "file:line:col: message", the form of spec §10.
type ParseError struct {
	File      string
	Line, Col int
	Msg       string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// lineError words the problem err found in line n of the script, and
// places it in the line as well as the decoder tells: at the offset of a
// syntax or type error, at the key of an unknown field, else at the
// line's first character.
func lineError(name string, n int, line []byte, err error) *ParseError {
	e := &ParseError{File: name, Line: n, Col: at(line, 0), Msg: err.Error()}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		e.Col = at(line, int(syn.Offset)-1)
		e.Msg = strings.TrimPrefix(e.Msg, "json: ") + " (each line is one JSON object)"
	case errors.As(err, &typ):
		e.Col = at(line, int(typ.Offset)-1)
		e.Msg = fmt.Sprintf("%s is %s, not %s", typ.Field, typ.Value, typ.Type)
	case strings.HasPrefix(e.Msg, `json: unknown field "`):
		field := strings.TrimSuffix(strings.TrimPrefix(e.Msg, `json: unknown field "`), `"`)
		if i := bytes.Index(trimmed(line), []byte(`"`+field+`"`)); i >= 0 {
			e.Col = at(line, i)
		}
		e.Msg = fmt.Sprintf("unknown field %q (%s)", field, fieldHint(field))
	}
	return e
}

// trimmed is what Parse decodes of a line: the line without the spaces
// around it.
func trimmed(line []byte) []byte { return bytes.TrimSpace(line) }

// at is the 1-based column, in characters, of byte offset off of the
// trimmed line within the whole line.
func at(line []byte, off int) int {
	lead := len(line) - len(bytes.TrimLeftFunc(line, unicode.IsSpace))
	off = min(max(lead+off, 0), len(line))
	return 1 + utf8.RuneCount(line[:off])
}

// fieldHint suggests the field meant, or lists the fields of a line.
func fieldHint(field string) string {
	names := fieldNames()
	best, bestD := "", len(field)/3+1
	for _, n := range names {
		if d := distance(strings.ToLower(field), n); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" {
		return "did you mean " + best + "?"
	}
	return "the fields are " + strings.Join(names, ", ")
}

// fieldNames are the JSON names of Line and what it holds, sorted.
func fieldNames() []string {
	seen := map[string]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" || seen[name] {
				continue
			}
			seen[name] = true
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[Line]())
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// distance is the edit distance of a and b, a swap of two neighbours
// counting as one edit (optimal string alignment).
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// check reports what is wrong with a line that decoded, or "".
func (l Line) check() string {
	if l.Text != "" && len(l.Chunks) > 0 {
		return "give text or chunks, not both"
	}
	if l.Compaction && len(l.ToolCalls) > 0 {
		return "a compaction line is a summary: it cannot have tool_calls"
	}
	if l.StallAfter != nil && *l.StallAfter < 0 {
		return fmt.Sprintf("stall_after is %d (give a number of chunks, 0 or more)", *l.StallAfter)
	}
	for i, c := range l.ToolCalls {
		if c.Name == "" {
			return fmt.Sprintf("tool_calls[%d]: name is required", i)
		}
	}
	if f := l.Error; f != nil && f.Status != 0 && (f.Status < 100 || f.Status > 599) {
		return fmt.Sprintf("error.status %d is not an HTTP status (give 100 to 599, or 0 for a connection failure)", f.Status)
	}
	return ""
}
