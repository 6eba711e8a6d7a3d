package tool_test

import (
	"encoding/json"
	"testing"

	"github.com/timebox-run/timebox/tool"
)

// marshalled is what ErrorInfo.String wrote with encoding/json before it
// was written by hand: it must stay byte for byte the same.
func marshalled(t testing.TB, e tool.ErrorInfo) string {
	b, err := json.Marshal(struct {
		Error tool.ErrorInfo `json:"error"`
	}{e})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestErrorInfoStringIsJSONMarshal(t *testing.T) {
	code, neg := 137, -1
	tricky := "a \"quoted\" \\ <b>&</b> \n\r\t\b\f\x00\x1f\x7f é 日本 \u2028\u2029 \xff\xfe bad \xe2\x82 cut 🙂"
	for _, tc := range []struct {
		name string
		e    tool.ErrorInfo
	}{
		{"empty", tool.ErrorInfo{}},
		{"cancelled", tool.ErrorInfo{Type: "tool_cancelled", Tool: "wait", Phase: "turn", Elapsed: "13.005s",
			Message: `Tool "wait" was stopped after 13.005s because the turn was stopped (turn limit of 13s, timeouts.turn).`}},
		{"every field", tool.ErrorInfo{Type: "tool_timeout", Tool: "crawl", Reason: "limit", Phase: "tool", Limit: "10s",
			Elapsed: "10.001s", Source: "file", Knob: "tools[crawl].timeout", ExitCode: &code, Message: tricky,
			StderrTail: tricky, PartialOutput: tricky, PartialTruncated: true, LastProgress: tricky, Field: "/q", Overran: true}},
		{"negative exit", tool.ErrorInfo{Type: "tool_error", Tool: "x", ExitCode: &neg, Message: "m"}},
		{"tricky", tool.ErrorInfo{Type: tricky, Tool: tricky, Reason: tricky, Phase: tricky, Limit: tricky, Elapsed: tricky,
			Source: tricky, Knob: tricky, Message: tricky, Field: tricky}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := tc.e.String(), marshalled(t, tc.e); got != want {
				t.Errorf("String() =\n%s\nwant (json.Marshal)\n%s", got, want)
			}
		})
	}
	for c := range 0x80 {
		e := tool.ErrorInfo{Message: "<" + string(rune(c)) + ">"}
		if got, want := e.String(), marshalled(t, e); got != want {
			t.Errorf("byte %#x: String() = %s, want %s", c, got, want)
		}
	}
}

func FuzzErrorInfoString(f *testing.F) {
	f.Add("tool_error", "x", "m\n<&>\u2028\xff", "tail")
	f.Fuzz(func(t *testing.T, typ, name, msg, tail string) {
		e := tool.ErrorInfo{Type: typ, Tool: name, Message: msg, StderrTail: tail, PartialOutput: msg + tail}
		if got, want := e.String(), marshalled(t, e); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})
}

// TestCutAt: a cut at max bytes moves back to the start of the character
// max falls inside, and only then.
func TestCutAt(t *testing.T) {
	for _, tc := range []struct {
		b        string
		max, cut int
	}{
		{"abcdef", 3, 3},
		{"ab", 5, 2},
		{"aé", 2, 1},             // inside é's two bytes
		{"aé", 3, 3},             // after it
		{"a日本", 2, 1},            // inside 日's three bytes, after its first
		{"a日本", 3, 1},            // after its second
		{"a日本", 4, 4},            // at 本's start
		{"a🙂b", 4, 1},            // inside a four-byte character
		{"a\x80\x80\x80b", 2, 2}, // not UTF-8: cut where asked
		{"\xe2\x82", 1, 1},       // a sequence that never ends
	} {
		if got := tool.CutAt([]byte(tc.b), tc.max); got != tc.cut {
			t.Errorf("CutAt(%q, %d) = %d, want %d", tc.b, tc.max, got, tc.cut)
		}
	}
}
