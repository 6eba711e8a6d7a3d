package script_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/script-model.md")

const (
	scriptDoc  = "../../docs/script-model.md"
	regenerate = "`go test ./model/script -run TestDocs -update`"
)

// TestDocsExamplesParse: every jsonl block of docs/script-model.md is a
// script the script model plays.
func TestDocsExamplesParse(t *testing.T) {
	page, err := os.ReadFile(scriptDoc)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range doctest.Blocks(page) {
		if b.Lang != "jsonl" {
			continue
		}
		n++
		lines, err := script.Parse(strings.NewReader(b.Text), "docs/script-model.md block at line "+itoa(b.Line))
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if _, err := script.New(lines); err != nil {
			t.Errorf("the block at line %d: %v", b.Line, err)
		}
	}
	if n < 5 {
		t.Errorf("only %d jsonl blocks in %s", n, scriptDoc)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// jsonFields lists the JSON names of t's fields and of the structs they
// hold.
func jsonFields(t reflect.Type, seen map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		seen[name] = true
		jsonFields(f.Type, seen)
	}
}

var fieldRowRE = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|")

// TestDocsFieldTable: the field table of docs/script-model.md lists every
// field a script line may have (script.Line and what it holds), and no
// other.
func TestDocsFieldTable(t *testing.T) {
	page, err := os.ReadFile(scriptDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(page), "## Fields of a line")
	if !ok {
		t.Fatal("no section \"Fields of a line\"")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	documented := map[string]bool{}
	for _, m := range fieldRowRE.FindAllStringSubmatch(table, -1) {
		documented[m[1]] = true
	}
	fields := map[string]bool{}
	jsonFields(reflect.TypeFor[script.Line](), fields)
	for _, name := range sorted(fields) {
		if !documented[name] {
			t.Errorf("%s: the field table lacks %s", scriptDoc, name)
		}
	}
	for _, name := range sorted(documented) {
		if !fields[name] {
			t.Errorf("%s: the field table lists %s, which a script line does not have", scriptDoc, name)
		}
	}
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDocsRecorded: the recording shown in docs/script-model.md is what
// script.Recording writes for the calls the page describes. Time is
// synthetic (synctest), so the timings are exact.
func TestDocsRecorded(t *testing.T) {
	var buf bytes.Buffer
	synctest.Test(t, func(t *testing.T) {
		live, err := script.Parse(strings.NewReader(`{"chunks": ["The report ", "has three ", "sections."], "first_chunk_delay": "1.2s", "chunk_delay": "80ms"}
{"text": "Checking.", "first_chunk_delay": "900ms", "tool_calls": [{"name": "word_count", "arguments": {"text": "the report"}}]}
{"error": {"status": 429, "message": "Rate limit reached for requests", "retry_after": "2s"}, "first_chunk_delay": "150ms"}
{"chunks": ["Summary: "], "first_chunk_delay": "700ms", "stall_after": 1}`), "live")
		if err != nil {
			t.Fatal(err)
		}
		lp, err := script.New(live)
		if err != nil {
			t.Fatal(err)
		}
		rec := script.NewRecording(&buf)
		p := rec.Wrap(lp)
		for range 4 {
			ctx, cancel := context.WithCancelCause(t.Context())
			w := model.Open(ctx, p, model.Request{}, model.Watchdog{Idle: budget.Duration{D: 5 * time.Second}}, "m")
			for {
				if _, err := w.Recv(); err != nil {
					break
				}
			}
			w.Close()
			cancel(nil)
		}
		if err := rec.Err(); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := script.Parse(bytes.NewReader(buf.Bytes()), "recorded"); err != nil {
		t.Fatalf("the recording does not parse: %v", err)
	}
	doctest.Part(t, scriptDoc, "recorded", "```jsonl\n"+buf.String()+"```\n", *update, regenerate)
}
