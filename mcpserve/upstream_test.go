package mcpserve

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/tool"
)

func f(v float64) *float64 { return &v }

// MCP wants every notification's progress above the last one; a tool's
// reports need not be. Each case is one call's reports in order, and what
// is sent for each: progress, total.
func TestUpstreamProgressAlwaysIncreases(t *testing.T) {
	type sent struct{ progress, total float64 }
	for _, tc := range []struct {
		name    string
		reports []tool.Report
		want    []sent
	}{
		{"counts up with a total", []tool.Report{{Progress: f(1), Total: f(3)}, {Progress: f(2), Total: f(3)}, {Progress: f(3), Total: f(3)}},
			[]sent{{1, 3}, {2, 3}, {3, 3}}},
		{"messages only", []tool.Report{{Message: "a"}, {Message: "b"}, {Message: "c"}}, []sent{{0, 0}, {1, 0}, {2, 0}}},
		{"starts at zero", []tool.Report{{Progress: f(0), Total: f(10)}, {Progress: f(5), Total: f(10)}}, []sent{{0, 10}, {5, 10}}},
		{"a message between numbers", []tool.Report{{Progress: f(2), Total: f(10)}, {Message: "m"}, {Progress: f(5), Total: f(10)}},
			[]sent{{2, 10}, {3, 0}, {5, 10}}},
		{"a phase that starts again", []tool.Report{{Progress: f(8), Total: f(10)}, {Progress: f(1), Total: f(10)}, {Progress: f(2), Total: f(10)}},
			[]sent{{8, 10}, {9, 0}, {10, 0}}},
		{"the same value twice", []tool.Report{{Progress: f(4)}, {Progress: f(4)}}, []sent{{4, 0}, {5, 0}}},
		{"a total below the progress is left out", []tool.Report{{Progress: f(7), Total: f(5)}}, []sent{{7, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &upstream{token: "tok"}
			for i, r := range tc.reports {
				p := u.params(r)
				if p.ProgressToken != "tok" || p.Message != r.Message || p.Progress != tc.want[i].progress || p.Total != tc.want[i].total {
					t.Errorf("report %d %+v: sent progress %v total %v message %q, want %v", i, r, p.Progress, p.Total, p.Message, tc.want[i])
				}
			}
		})
	}
}

func TestObjectSchema(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{"", `{"type":"object"}`, ""},
		{`{"type": "object", "properties": {"a": {"type": "string"}}}`, `{"type": "object", "properties": {"a": {"type": "string"}}}`, ""},
		{`{"properties": {"a": {"type": "string"}}}`, `{"properties":{"a":{"type":"string"}},"type":"object"}`, ""},
		{`{"type": "string"}`, "", "MCP needs a tool's input to be an object"},
		{`[1]`, "", "not a JSON object"},
	} {
		got, err := objectSchema(json.RawMessage(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}
