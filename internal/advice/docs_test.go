package advice_test

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/internal/doctest"
)

const statsDoc = "../../docs/stats.md"

// keys returns the names of a JSON object's fields, sorted.
func keys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestDocsShowTheReport: docs/stats.md shows the report as the code writes
// it — its JSON examples have the fields of a report, a tool and a model
// line, and no others; its text example has the tables' headers — so that
// the page cannot drift from the code.
func TestDocsShowTheReport(t *testing.T) {
	page, err := os.ReadFile(statsDoc)
	if err != nil {
		t.Fatal(err)
	}
	code := report()
	var buf bytes.Buffer
	if err := code.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var want struct {
		Tools  []json.RawMessage `json:"tools"`
		Models []json.RawMessage `json:"models"`
	}
	json.Unmarshal(buf.Bytes(), &want)
	var objects []string
	for _, b := range doctest.Blocks(page) {
		if b.Lang == "json" {
			objects = append(objects, b.Text)
		}
	}
	if len(objects) != 2 {
		t.Fatalf("%s: %d json blocks, want 2 (a report, a model line)", statsDoc, len(objects))
	}
	var doc struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal([]byte(objects[0]), &doc); err != nil || len(doc.Tools) == 0 {
		t.Fatalf("%s: the report example: %v", statsDoc, err)
	}
	for _, c := range []struct {
		what      string
		doc, code []byte
	}{
		{"the report", []byte(objects[0]), buf.Bytes()},
		{"a tool line", doc.Tools[0], want.Tools[0]},
		{"a model line", []byte(objects[1]), want.Models[0]},
	} {
		if d, w := keys(t, c.doc), keys(t, c.code); !slices.Equal(d, w) {
			t.Errorf("%s: %s has the fields %q; the code writes %q", statsDoc, c.what, d, w)
		}
	}
	var text bytes.Buffer
	code.WriteText(&text)
	space := regexp.MustCompile(` {2,}`)
	for _, line := range strings.Split(text.String(), "\n") {
		if strings.HasPrefix(line, "TOOL ") || strings.HasPrefix(line, "MODEL ") {
			if !strings.Contains(space.ReplaceAllString(string(page), " "), space.ReplaceAllString(line, " ")) {
				t.Errorf("%s does not show the header %q", statsDoc, line)
			}
		}
	}
	for _, f := range []string{advice.FlagTooFew, advice.FlagCutOff, advice.FlagIdleCutOff, advice.FlagCapped, advice.FlagProfile} {
		if !strings.Contains(string(page), "`"+f+"`") {
			t.Errorf("%s does not name the flag %s", statsDoc, f)
		}
	}
}
