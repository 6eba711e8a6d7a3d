package script

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzWalkAgreesWithDecoder: the check that finds every problem of a line
// (walk) refuses a JSON value exactly when encoding/json, which decodes
// the line afterwards, refuses it, so a line is never refused that would
// have played, and a problem is never left to the decoder's bare message;
// but for a field given twice, which the decoder takes (the last one) and
// the walk refuses, as the agent file and the API do.
func FuzzWalkAgreesWithDecoder(f *testing.F) {
	for _, s := range []string{
		`{"text": "hello", "Text": "x"}`,
		`{"chunks": ["a", 1], "first_chunk_delay": 50, "chunk_delay": null, "stall_after": 2.0}`,
		`{"tool_calls": [{"name": "x", "arguments": {"k": [1, 2.5, "é"]}}, {"nme": "y"}], "error": {"status": "429"}}`,
		`{"error": {"status": 1e400, "message": true, "retry_after": "-1s"}, "compaction": "true"}`,
		`{"tool_calls": {"name": "x"}, "chunks": "ab", "error": []}`,
		`[1, 2]`,
		`{"stall_after": 99999999999999999999, "text": {"a": "b"}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		raw := []byte(in)
		if !json.Valid(raw) || len(bytes.TrimSpace(raw)) != len(raw) {
			return
		}
		p := &lineParser{name: "s", n: 1, text: raw, b: raw, at: map[string]int{}}
		p.walk(lineType, "")
		var l Line
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		err := d.Decode(&l)
		twice := len(p.problems) > 0
		for _, pe := range p.problems {
			twice = twice && pe.Msg == givenTwice
		}
		if (err == nil) != (len(p.problems) == 0) && (err != nil || !twice) {
			t.Fatalf("%s: the decoder says %v; the walk found %v", in, err, ParseErrors(p.problems))
		}
		if p.i != len(raw) {
			t.Fatalf("%s: the walk stopped at %d of %d", in, p.i, len(raw))
		}
	})
}
