package config

import (
	"strings"
	"testing"

	"github.com/timebox-run/timebox/budget"
)

// TestMaxReply: limits.max_reply resolves flag > environment > file >
// default with the source and knob of where it came from, and a value
// outside 1KiB–16MiB, or not a size, is refused where it was written.
func TestMaxReply(t *testing.T) {
	const base = "model: {primary: 'openai:gpt-4o-mini'}\n"
	const inFile = base + "limits: {max_reply: 256KiB}\n"
	c := func(n int64, src budget.Source, knob string) budget.Count {
		return budget.Count{N: n, Source: src, Knob: knob}
	}
	cases := []struct {
		name  string
		file  string
		flags map[string]string
		env   []string
		want  budget.Count
		err   string // in the error, when the load must fail
	}{
		{name: "default", file: base, want: c(1<<20, budget.SourceDefault, budget.KeyMaxReply)},
		{name: "file", file: inFile, want: c(256<<10, budget.SourceFile, budget.KeyMaxReply)},
		{name: "env beats file", file: inFile, env: []string{"TIMEBOX_MAX_REPLY=2MiB"},
			want: c(2<<20, budget.SourceEnv, "TIMEBOX_MAX_REPLY")},
		{name: "flag beats env and file", file: inFile, env: []string{"TIMEBOX_MAX_REPLY=2MiB"},
			flags: map[string]string{budget.KeyMaxReply: "4MiB"}, want: c(4<<20, budget.SourceFlag, "--max-reply")},
		{name: "bytes without a unit", file: base + "limits: {max_reply: 65536}\n", want: c(64<<10, budget.SourceFile, budget.KeyMaxReply)},
		{name: "the largest", file: base + "limits: {max_reply: 16MiB}\n", want: c(16<<20, budget.SourceFile, budget.KeyMaxReply)},
		{name: "below the minimum in the file", file: base + "limits: {max_reply: 512}\n",
			err: "agent.yaml:2:21: limits.max_reply: 512 is below the minimum (use at least 1KiB)"},
		{name: "above the maximum by flag", file: base, flags: map[string]string{budget.KeyMaxReply: "17MiB"},
			err: `--max-reply: "17MiB" is above the maximum (use at most 16MiB)`},
		{name: "zero is not off", file: base, env: []string{"TIMEBOX_MAX_REPLY=0"}, err: "TIMEBOX_MAX_REPLY"},
		{name: "not a size", file: base + "limits: {max_reply: lots}\n", err: "limits.max_reply"},
		{name: "negative", file: base, env: []string{"TIMEBOX_MAX_REPLY=-1MiB"}, err: "TIMEBOX_MAX_REPLY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, tc.file), Overrides{Flags: tc.flags, Env: tc.env})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Limits.MaxReply != tc.want {
				t.Fatalf("max_reply %+v, want %+v", a.Limits.MaxReply, tc.want)
			}
		})
	}
}

// TestModelMaxTokens: model.max_tokens is a whole number of tokens, 1 to
// MaxMaxTokens, DefaultMaxTokens when the file says nothing.
func TestModelMaxTokens(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want int64
		err  string
	}{
		{name: "default", yaml: "model: {primary: 'openai:gpt-4o-mini'}\n", want: DefaultMaxTokens},
		{name: "set", yaml: "model: {primary: 'openai:gpt-4o-mini', max_tokens: 25000}\n", want: 25000},
		{name: "zero", yaml: "model: {primary: 'openai:gpt-4o-mini', max_tokens: 0}\n",
			err: "agent.yaml:1:52: model.max_tokens: 0 is below the minimum (use at least 1)"},
		{name: "too many", yaml: "model: {primary: 'openai:gpt-4o-mini', max_tokens: 2000000}\n",
			err: "model.max_tokens: 2000000 is above the maximum (use at most 1000000)"},
		{name: "not a number", yaml: "model: {primary: 'openai:gpt-4o-mini', max_tokens: lots}\n", err: "model.max_tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, tc.yaml), Overrides{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Model.MaxTokens != tc.want {
				t.Fatalf("max_tokens %d, want %d", a.Model.MaxTokens, tc.want)
			}
		})
	}
}
