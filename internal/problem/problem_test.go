package problem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/problem"
)

// TestListReadsInOrder: a list renders one problem per line, in the order
// of its ranks and then of the file, and errors.As finds its first problem.
func TestListReadsInOrder(t *testing.T) {
	l := problem.List{
		{Key: "--tool-timeout", Msg: "flag"},
		{File: "s.jsonl", Line: 2, Col: 5, Key: "text", Msg: "b"},
		{File: "a.yaml", Line: 3, Col: 1, Msg: "c"},
		{File: "s.jsonl", Line: 2, Col: 1, Msg: "a"},
		{File: "a.yaml", Key: "model.primary", Msg: "d"},
	}
	l.SortBy(func(p *problem.Problem) int {
		switch p.File {
		case "a.yaml":
			return 0
		case "":
			return 2
		}
		return 1
	})
	want := strings.Join([]string{
		"a.yaml: model.primary: d",
		"a.yaml:3:1: c",
		"s.jsonl:2:1: a",
		"s.jsonl:2:5: text: b",
		"--tool-timeout: flag",
	}, "\n")
	if l.Error() != want {
		t.Fatalf("got\n%s\nwant\n%s", l.Error(), want)
	}
	var p *problem.Problem
	if err := error(l); !errors.As(err, &p) || p.Msg != "d" {
		t.Fatalf("errors.As found %v", p)
	}
	l.Sort() // one rank: by line, column and key only
	if l[0].Msg != "flag" || l[1].Msg != "d" || l[2].Msg != "a" || l[4].Msg != "c" {
		t.Fatalf("reading order: %v", l)
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"text", "chunks", "tool_calls", "parallel_tools"}
	for in, want := range map[string]string{
		"txt": "text", "Chunk": "chunks", "tool_cals": "tool_calls", "parallel": "parallel_tools", "x": "", "delay": "",
	} {
		if got := problem.Suggest(in, names); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", in, got, want)
		}
	}
	if got := problem.DidYouMean("txt", names); got != " (did you mean text?)" {
		t.Errorf("DidYouMean: %q", got)
	}
}
