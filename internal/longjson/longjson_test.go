package longjson

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

type doc struct {
	Before string            `json:"before"`
	Text   string            `json:"text"`
	Nested map[string]string `json:"nested,omitempty"`
	After  int               `json:"after"`
}

// awkward are strings whose escaping differs from their bytes, cut where
// a piece would end.
func awkward() []string {
	var all strings.Builder
	for b := range 256 {
		all.WriteByte(byte(b))
	}
	cut := func(tail string) string { return strings.Repeat("x", piece-1) + tail + strings.Repeat("y", 10) }
	return []string{
		"",
		"plain",
		"<b>&amp;</b> \"quoted\" \\ \b\f\n\r\t \x00\x1f\x7f",
		"\u2028\u2029 é 日本 😀",
		all.String(),
		"\xe2\x82 \xff\xfe \xc3",
		cut("😀"),                        // a four-byte character across the cut
		cut("日"),                        // three bytes
		cut("\xe2\x82"),                 // a truncated sequence
		cut("\u2028"),                   // escaped as \u2028
		cut("\x80\x80\x80\x80\x80\x80"), // continuation bytes alone
		strings.Repeat("\x80", 3*piece),
		strings.Repeat("ab<>&\"\n日😀\xff", piece/3),
	}
}

func TestEscapedLenIsJSONs(t *testing.T) {
	for _, s := range awkward() {
		b, _ := json.Marshal(s)
		if got := EscapedLen(s); got != len(b)-2 {
			t.Errorf("EscapedLen(%.40q…) = %d, json.Marshal writes %d", s, got, len(b)-2)
		}
	}
}

func TestDocIsJSONMarshal(t *testing.T) {
	for _, s := range awkward() {
		v := doc{Before: "a \"text\":\"\" inside", Text: s, After: 3}
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		blank := v
		blank.Text = ""
		b, _ := json.Marshal(blank)
		d, ok := Split(b, Field{"text", s})
		if !ok {
			t.Fatalf("Split found no field in %s", b)
		}
		if got := d.Bytes(); !bytes.Equal(got, want) || cap(got) != len(want) {
			t.Errorf("Bytes of %.40q…: %d bytes (cap %d), json.Marshal %d; equal %v", s, len(got), cap(got), len(want), bytes.Equal(got, want))
		}
		var w bytes.Buffer
		n, err := d.WriteTo(&w)
		if err != nil || n != int64(len(want)) || !bytes.Equal(w.Bytes(), want) {
			t.Errorf("WriteTo of %.40q…: %d bytes (%v), equal %v", s, n, err, bytes.Equal(w.Bytes(), want))
		}
		if d.Len() != len(want) {
			t.Errorf("Len %d, want %d", d.Len(), len(want))
		}
	}
}

// TestSplitTwoFields: two strings apart, given in either order, and the
// document trimmed of its closing brace.
func TestSplitTwoFields(t *testing.T) {
	for _, s := range awkward() {
		v := doc{Before: s + "<", Text: s, After: 3}
		want, _ := json.Marshal(v)
		b, _ := json.Marshal(doc{After: 3})
		d, ok := Split(b, Field{"text", v.Text}, Field{"before", v.Before})
		if !ok {
			t.Fatalf("Split found no field in %s", b)
		}
		if got := d.Bytes(); !bytes.Equal(got, want) || cap(got) != len(want) {
			t.Errorf("Bytes of %.40q…: %d bytes (cap %d), json.Marshal %d; equal %v", s, len(got), cap(got), len(want), bytes.Equal(got, want))
		}
		var w bytes.Buffer
		if _, err := d.Trim(1).WriteTo(&w); err != nil || !bytes.Equal(w.Bytes(), want[:len(want)-1]) {
			t.Errorf("Trim(1).WriteTo of %.40q…: %v, equal %v", s, err, bytes.Equal(w.Bytes(), want[:len(want)-1]))
		}
		if _, whole := d.Raw(); whole {
			t.Errorf("Raw of %.40q…: whole, with two strings apart", s)
		}
	}
}

// TestRaw: a document with no string apart is its one buffer.
func TestRaw(t *testing.T) {
	b, _ := json.Marshal(doc{After: 3})
	if got, ok := Whole(b).Raw(); !ok || &got[0] != &b[0] || len(got) != len(b) {
		t.Errorf("Whole(b).Raw() = %s, %v; want b itself", got, ok)
	}
	if got, ok := (Doc{}).Raw(); !ok || got != nil {
		t.Errorf("Doc{}.Raw() = %q, %v; want nil, true", got, ok)
	}
	d, _ := Split(b, Field{"text", "x"})
	if _, ok := d.Raw(); ok {
		t.Error("Raw of a document with a string apart: whole")
	}
}

// TestSplitRefusesTwoFields: a nested field of the same name with an
// empty value leaves the value to be marshalled whole.
func TestSplitRefusesTwoFields(t *testing.T) {
	b, _ := json.Marshal(doc{Nested: map[string]string{"text": ""}})
	if _, ok := Split(b, Field{"text", "long"}); ok {
		t.Errorf("Split took one of two fields in %s", b)
	}
	if _, ok := Split([]byte(`{"other":""}`), Field{"text", "long"}); ok {
		t.Error("Split found a field that is not there")
	}
}

func FuzzDocIsJSONMarshal(f *testing.F) {
	for _, s := range awkward() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(doc{Text: s})
		b, _ := json.Marshal(doc{})
		d, ok := Split(b, Field{"text", s})
		if !ok {
			t.Fatal("no field")
		}
		if got := d.Bytes(); !bytes.Equal(got, want) {
			t.Errorf("%q: %s, want %s", s, got, want)
		}
		var w bytes.Buffer
		if _, err := d.WriteTo(&w); err != nil || !bytes.Equal(w.Bytes(), want) {
			t.Errorf("%q: WriteTo %s (%v), want %s", s, w.Bytes(), err, want)
		}
		if !utf8.ValidString(s) && EscapedLen(s) < len(s) {
			t.Errorf("%q: escaped shorter than the string", s)
		}
	})
}
