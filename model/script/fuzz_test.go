package script_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/timebox-run/timebox/model/script"
)

// FuzzParse feeds arbitrary text to the script parser. The problems must
// be ParseErrors, each placed on a real line and column of the input, in
// the order of the input; lines that parse must print back to JSON that
// parses to the same lines (parse(print(x)) == x), so a recorded script
// replays as recorded. The corpus is testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"text": "hello"}`,
		`{"chunks": ["a", "b"], "first_chunk_delay": "1s", "chunk_delay": "50ms", "stall_after": 1}`,
		`{"tool_calls": [{"name": "x", "arguments": {"k": [1, 2.5, "é"]}}, {"name": "y", "arguments": "not json"}]}`,
		`{"error": {"status": 429, "message": "slow down", "retry_after": "2s"}}`,
		"// comment\n\n{\"text\": \"a\"}\r\n{\"txt\": 1}",
		`{"text": "a"} {"text": "b"}`,
		`{"text": "\u00e9\ud800"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		lines, err := script.Parse(strings.NewReader(in), "s.jsonl")
		if err != nil {
			var list script.ParseErrors
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("not ParseErrors: %v", err)
			}
			rows := strings.Split(in, "\n")
			for i, pe := range list {
				if pe.File != "s.jsonl" || pe.Line < 1 || pe.Line > len(rows) || pe.Msg == "" {
					t.Fatalf("misplaced: %+v", pe)
				}
				if row := rows[pe.Line-1]; pe.Col < 1 || pe.Col > utf8.RuneCountInString(row)+1 {
					t.Fatalf("column %d outside line %d (%q)", pe.Col, pe.Line, row)
				}
				if i > 0 && (pe.Line < list[i-1].Line || pe.Line == list[i-1].Line && pe.Col < list[i-1].Col) {
					t.Fatalf("out of order: %v", err)
				}
			}
			return
		}
		printed := print(t, lines)
		again, err := script.Parse(strings.NewReader(printed), "printed")
		if err != nil {
			t.Fatalf("printed lines do not parse: %v\n%s", err, printed)
		}
		if p2 := print(t, again); p2 != printed {
			t.Fatalf("parse(print(x)) != x:\n%s\n%s", printed, p2)
		}
	})
}

// print writes lines as a script, one JSON object per line.
func print(t *testing.T, lines []script.Line) string {
	var b bytes.Buffer
	for _, l := range lines {
		j, err := json.Marshal(l)
		if err != nil {
			t.Fatalf("a parsed line does not print: %v (%+v)", err, l)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}
