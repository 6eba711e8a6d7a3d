// Package longjson writes JSON that holds one long string — a turn's
// answer of megabytes, a tool's long result — byte for byte as
// encoding/json writes it, without building the document whole: the
// string is escaped a piece at a time, into the writer or into a buffer
// of the exact size.
//
// json.Marshal of such a value holds the text three times over for a
// moment: its buffer grows by doubling, then is copied out (issue 29,
// docs/decisions/reply-text.md). Here the value is marshalled with the
// long field left empty, and the string goes where its empty value was.
package longjson

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"unicode/utf8"
)

// Long is the length from which a string is worth writing apart: shorter
// ones go through encoding/json as they are.
const Long = 64 << 10

// piece is how much of the string is escaped at a time.
const piece = 32 << 10

// Doc is a JSON document with string values left out: the bytes
// json.Marshal returns for the value with those strings in place.
type Doc struct {
	// parts alternate: JSON as it is, a string to escape, JSON…; the
	// first and the last are JSON.
	parts []part
}

type part struct {
	raw []byte
	s   string
}

// Field is a string field of a document: its key and its text.
type Field struct {
	Key, Text string
}

// Split finds in b — JSON made by encoding/json of a value whose fields
// were left empty — each field's empty string, and returns the document
// with their texts in place. ok is false when b does not have exactly one
// field of each key with an empty string (a nested object may have one
// too): the caller marshals the value whole then.
//
// Inside a string encoding/json writes every quote as \", so `"key":""`
// is found only where it is a key and its value.
func Split(b []byte, fields ...Field) (d Doc, ok bool) {
	type at struct {
		quote int // the empty string's closing quote
		s     string
	}
	var cuts []at
	for _, f := range fields {
		field := []byte(`"` + f.Key + `":""`)
		if bytes.Count(b, field) != 1 {
			return Doc{}, false
		}
		cuts = append(cuts, at{bytes.Index(b, field) + len(field) - 1, f.Text})
	}
	slices.SortFunc(cuts, func(x, y at) int { return x.quote - y.quote })
	from := 0
	for _, c := range cuts {
		d.parts = append(d.parts, part{raw: b[from:c.quote]}, part{s: c.s})
		from = c.quote
	}
	d.parts = append(d.parts, part{raw: b[from:]})
	return d, true
}

// Whole returns b as a document with no string apart.
func Whole(b []byte) Doc { return Doc{parts: []part{{raw: b}}} }

// Len returns the document's length in bytes.
func (d Doc) Len() int {
	n := 0
	for _, p := range d.parts {
		n += len(p.raw) + EscapedLen(p.s)
	}
	return n
}

// Trim returns the document without its last n bytes (a closing brace,
// to write more fields after it). n must be no more than what follows the
// last string.
func (d Doc) Trim(n int) Doc {
	d.parts = slices.Clone(d.parts)
	last := &d.parts[len(d.parts)-1]
	last.raw = last.raw[:len(last.raw)-n]
	return d
}

// Bytes returns the document in one buffer of its exact length.
func (d Doc) Bytes() []byte {
	out := make([]byte, 0, d.Len())
	for _, p := range d.parts {
		out = append(out, p.raw...)
		escape(p.s, func(b []byte) error {
			out = append(out, b...)
			return nil
		})
	}
	return out
}

// Raw returns the document's bytes when it has no string apart: it is
// one buffer then, b of Whole(b) or a Split that found no field.
func (d Doc) Raw() ([]byte, bool) {
	switch len(d.parts) {
	case 0:
		return nil, true
	case 1:
		return d.parts[0].raw, true
	}
	return nil, false
}

// WriteTo writes the document to w, its strings a piece at a time.
func (d Doc) WriteTo(w io.Writer) (int64, error) {
	var n int64
	write := func(p []byte) error {
		if len(p) == 0 {
			return nil
		}
		m, err := w.Write(p)
		n += int64(m)
		return err
	}
	for _, p := range d.parts {
		if err := write(p.raw); err != nil {
			return n, err
		}
		if err := escape(p.s, write); err != nil {
			return n, err
		}
	}
	return n, nil
}

// escape calls f with s escaped as json.Marshal escapes a string (HTML
// characters too), without its quotes, a piece at a time. Pieces are cut
// before a byte that starts a character (or is not part of a valid one),
// so that no valid UTF-8 sequence is split: encoding/json escapes an
// invalid byte by itself, so the pieces escape to what the whole does.
func escape(s string, f func([]byte) error) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for len(s) > 0 {
		n := min(len(s), piece)
		if n < len(s) {
			for back := 0; back < utf8.UTFMax-1 && !utf8.RuneStart(s[n]); back++ {
				n--
			}
			if !utf8.RuneStart(s[n]) {
				// Four continuation bytes in a row: s[n] is in no valid
				// sequence, and no valid sequence crosses n.
				n += utf8.UTFMax - 1
			}
		}
		buf.Reset()
		if err := enc.Encode(s[:n]); err != nil {
			return err
		}
		b := buf.Bytes()
		if err := f(b[1 : len(b)-2]); err != nil { // without "…"\n
			return err
		}
		s = s[n:]
	}
	return nil
}

// EscapedLen returns the length of s as json.Marshal writes it, without
// its quotes.
func EscapedLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			switch {
			case b == '\\' || b == '"' || b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t':
				n += 2
			case b < 0x20 || b == '<' || b == '>' || b == '&':
				n += 6 // \u00XX
			default:
				n++
			}
			i++
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:min(len(s), i+utf8.UTFMax)])
		switch {
		case c == utf8.RuneError && size == 1:
			n += 6 // \ufffd
		case c == '\u2028' || c == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
