package exectool

import (
	"strconv"
	"unicode/utf8"

	"github.com/timebox-run/timebox/tool"
)

// quickReport decodes the usual shape of a progress object — the keys
// progress, total and message, with number and plain string values —
// without encoding/json's reflection, which costs a flooding tool's reader
// a few microseconds a line. It returns false for anything else (escapes,
// invalid UTF-8, null, other keys or other spellings of these, numbers
// out of range), which json.Unmarshal then decodes as before, so that a
// line means exactly what encoding/json says it means
// (FuzzQuickReport checks it).
func quickReport(b []byte) (tool.Report, bool) {
	var r tool.Report
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return r, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return r, skipSpace(b, i+1) == len(b)
	}
	for {
		key, j, ok := plainString(b, i)
		if !ok {
			return r, false
		}
		i = skipSpace(b, j)
		if i == len(b) || b[i] != ':' {
			return r, false
		}
		i = skipSpace(b, i+1)
		switch string(key) {
		case "progress", "total":
			v, j, ok := number(b, i)
			if !ok {
				return r, false
			}
			if key[0] == 'p' {
				r.Progress = &v
			} else {
				r.Total = &v
			}
			i = j
		case "message":
			s, j, ok := plainString(b, i)
			if !ok {
				return r, false
			}
			r.Message = string(s)
			i = j
		default:
			return r, false
		}
		i = skipSpace(b, i)
		if i == len(b) {
			return r, false
		}
		switch b[i] {
		case '}':
			return r, skipSpace(b, i+1) == len(b)
		case ',':
			i = skipSpace(b, i+1)
		default:
			return r, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at b[i] that needs no unescaping: no
// backslash, no control character, valid UTF-8. It returns its contents
// and the index after its closing quote.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i == len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s := b[i+1 : j]
			return s, j + 1, utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// number reads a JSON number at b[i] and returns its value and the index
// after it.
func number(b []byte, i int) (float64, int, bool) {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return 0, 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return 0, 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return 0, 0, false
		}
		i = j
	}
	v, err := strconv.ParseFloat(string(b[start:i]), 64)
	return v, i, err == nil
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}
