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
			StderrTail: tricky, PartialOutput: tricky, Field: "/q", Overran: true}},
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
