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
		if got := bytes.Join(d.Pieces(), nil); !bytes.Equal(got, want) {
			t.Errorf("Pieces of %.40q…: equal %v", s, bytes.Equal(got, want))
		}
	}
}

// TestPiecesEscapeAStringOnce: two fields of the same string are one
// escaped buffer; two equal strings that are not the same string are two.
func TestPiecesEscapeAStringOnce(t *testing.T) {
	s := strings.Repeat("<a \"b\">\n", 1000)
	b, _ := json.Marshal(doc{})
	for _, tc := range []struct {
		before string
		once   bool
	}{{s, true}, {strings.Clone(s), false}} {
		v := doc{Before: tc.before, Text: s}
		want, _ := json.Marshal(v)
		d, ok := Split(b, Field{"text", s}, Field{"before", tc.before})
		if !ok {
			t.Fatalf("Split found no field in %s", b)
		}
		pieces := d.Pieces()
		if got := bytes.Join(pieces, nil); !bytes.Equal(got, want) {
			t.Fatalf("Pieces: %.100s, want %.100s", got, want)
		}
		var long [][]byte
		for _, p := range pieces {
			if len(p) >= len(s) {
				long = append(long, p)
			}
		}
		if len(long) != 2 {
			t.Fatalf("%d escaped strings, want 2", len(long))
		}
		if same := &long[0][0] == &long[1][0]; same != tc.once {
			t.Errorf("one buffer for both strings: %v, want %v", same, tc.once)
		}
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
		if got := bytes.Join(d.Pieces(), nil); !bytes.Equal(got, want) {
			t.Errorf("%q: Pieces %s, want %s", s, got, want)
		}
		if !utf8.ValidString(s) && EscapedLen(s) < len(s) {
			t.Errorf("%q: escaped shorter than the string", s)
		}
	})
}
