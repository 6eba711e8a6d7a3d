package exectool

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/timebox-run/timebox/tool"
)

var reportLines = []string{
	`{}`,
	` { } `,
	`{"progress": 3, "total": 10, "message": "fetching page 3"}`,
	`{"progress":1.5e2,"total":-0.25E-3}`,
	`{"message": "héllo"}`,
	`{"progress": 1, "progress": 2}`,
	`{"message": "a\"b"}`,
	`{"message": "tab\there"}`,
	`{"Progress": 3}`,
	`{"progress": null}`,
	`{"progress": "3"}`,
	`{"progress": 01}`,
	`{"progress": 1.}`,
	`{"progress": 1e999}`,
	`{"progress": -}`,
	`{"other": 1}`,
	`{"progress": 1,}`,
	`{"progress": 1} x`,
	`{"message": "` + "\xff" + `"}`,
	`{"progress": 1`,
	`{"progress" 1}`,
	`[1]`,
}

func show(r tool.Report) string {
	f := func(p *float64) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("%s/%s/%q", f(r.Progress), f(r.Total), r.Message)
}

// checkQuick fails if quickReport accepts b and reads it differently from
// encoding/json.
func checkQuick(t *testing.T, b []byte) bool {
	t.Helper()
	q, ok := quickReport(b)
	if !ok {
		return false
	}
	var r tool.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%q: quickReport accepted what encoding/json refuses (%v): %s", b, err, show(q))
	}
	if show(q) != show(r) {
		t.Fatalf("%q: quickReport read %s, encoding/json %s", b, show(q), show(r))
	}
	return true
}

func TestQuickReport(t *testing.T) {
	quick := 0
	for _, l := range reportLines {
		if checkQuick(t, []byte(l)) {
			quick++
		}
	}
	// The usual shapes take the quick path.
	if quick != 6 {
		t.Fatalf("%d lines took the quick path, want 6", quick)
	}
}

func FuzzQuickReport(f *testing.F) {
	for _, l := range reportLines {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkQuick(t, b) })
}
