package config

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// TestApproval reads approval and approval_timeout from exec tools, an mcp
// entry and its overrides: what ApprovalFor says of each tool, with the
// source and the knob of its wait, named as the tool's timeout is.
func TestApproval(t *testing.T) {
	path := writeAgent(t, `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {approval: 2h}
tools:
  - {name: plain, exec: [true]}
  - {name: never, exec: [true], approval: never}
  - {name: asks, exec: [true], approval: required}
  - {name: own, exec: [true], approval: required, approval_timeout: 30m}
  - name: server
    mcp: {command: [true]}
    approval: required
    approval_timeout: 4h
    overrides:
      read: {approval: never}
      slow: {approval_timeout: 168h}
      fast: {timeout: 5s}
  - name: quiet
    mcp: {url: "http://127.0.0.1:1/mcp"}
    approval_timeout: 1h
    overrides:
      write: {approval: required}
      delete: {approval: required, approval_timeout: 10m}
`)
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Warnings) != 0 {
		t.Errorf("warnings: %q", a.Warnings)
	}
	fromFile := budget.Duration{D: 2 * time.Hour, Source: budget.SourceFile, Knob: budget.KeyApproval}
	own := func(d time.Duration, knob string) budget.Duration {
		return budget.Duration{D: d, Source: budget.SourceTool, Knob: knob + " in agent.yaml"}
	}
	byName := map[string]Tool{}
	for _, tl := range a.Tools {
		byName[tl.Name] = tl
	}
	cases := []struct {
		tool, remote string
		required     bool
		timeout      budget.Duration
	}{
		{"plain", "", false, fromFile},
		{"never", "", false, fromFile},
		{"asks", "", true, fromFile},
		{"own", "", true, own(30*time.Minute, "tools[own].approval_timeout")},
		{"server", "search", true, own(4*time.Hour, "tools[server].approval_timeout")},
		{"server", "read", false, own(4*time.Hour, "tools[server].approval_timeout")},
		{"server", "slow", true, own(7*24*time.Hour, "tools[server].overrides[slow].approval_timeout")},
		{"server", "fast", true, own(4*time.Hour, "tools[server].approval_timeout")},
		{"quiet", "read", false, own(time.Hour, "tools[quiet].approval_timeout")},
		{"quiet", "write", true, own(time.Hour, "tools[quiet].approval_timeout")},
		{"quiet", "delete", true, own(10*time.Minute, "tools[quiet].overrides[delete].approval_timeout")},
	}
	for _, c := range cases {
		tl, ok := byName[c.tool]
		if !ok {
			t.Fatalf("no tool %s", c.tool)
		}
		required, timeout := tl.ApprovalFor(c.remote)
		if required != c.required || timeout != c.timeout {
			t.Errorf("%s[%s]: required %v, timeout %+v; want %v, %+v", c.tool, c.remote, required, timeout, c.required, c.timeout)
		}
	}
	if got := byName["plain"].Approval; got != ApprovalNever {
		t.Errorf("plain: approval %q, want %q (Load fills in the default)", got, ApprovalNever)
	}
	if o := byName["server"].MCP.Overrides["fast"]; o.Approval != "" || o.ApprovalTimeout.Source != "" {
		t.Errorf("an override that says nothing of approvals has %+v", o)
	}

	// validate's table: which tools wait for a person, for how long,
	// from where.
	var table bytes.Buffer
	if err := WriteTable(&table, a); err != nil {
		t.Fatal(err)
	}
	got := table.String()
	got = got[:strings.Index(got, "\nBUDGET")]
	checkGolden(t, goldenDir(t), "approval_table", got)
}

// TestApprovalTimeoutChain resolves timeouts.approval flag > variable >
// file > default, up to 7 days, and checks that a tool without its own
// approval_timeout follows it while one with its own beats every layer.
func TestApprovalTimeoutChain(t *testing.T) {
	const withFile = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
timeouts: {approval: 1h}
tools:
  - {name: follows, exec: [true], approval: required}
  - {name: own, exec: [true], approval: required, approval_timeout: 5m}
`
	const withoutFile = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
tools:
  - {name: follows, exec: [true], approval: required}
  - {name: own, exec: [true], approval: required, approval_timeout: 5m}
`
	d := func(v time.Duration, src budget.Source, knob string) budget.Duration {
		return budget.Duration{D: v, Source: src, Knob: knob}
	}
	cases := []struct {
		name  string
		file  string
		flags map[string]string
		env   []string
		want  budget.Duration
	}{
		{"default", withoutFile, nil, nil, d(24*time.Hour, budget.SourceDefault, budget.KeyApproval)},
		{"file", withFile, nil, nil, d(time.Hour, budget.SourceFile, budget.KeyApproval)},
		{"env beats file", withFile, nil, []string{"TIMEBOX_APPROVAL_TIMEOUT=3h"},
			d(3*time.Hour, budget.SourceEnv, "TIMEBOX_APPROVAL_TIMEOUT")},
		{"flag beats env", withFile, map[string]string{budget.KeyApproval: "168h"}, []string{"TIMEBOX_APPROVAL_TIMEOUT=3h"},
			d(7*24*time.Hour, budget.SourceFlag, "--approval-timeout")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, tc.file), Overrides{Flags: tc.flags, Env: tc.env})
			if err != nil {
				t.Fatal(err)
			}
			if a.Budgets.Approval != tc.want {
				t.Errorf("timeouts.approval %+v, want %+v", a.Budgets.Approval, tc.want)
			}
			for _, tl := range a.Tools {
				_, got := tl.ApprovalFor("")
				want := tc.want
				if tl.Name == "own" {
					want = d(5*time.Minute, budget.SourceTool, "tools[own].approval_timeout in agent.yaml")
				}
				if got != want {
					t.Errorf("%s: approval timeout %+v, want %+v", tl.Name, got, want)
				}
			}
		})
	}
}

// TestApprovalBounds: timeouts.approval and approval_timeout go up to 7
// days (budget.MaxTurn), from a flag, a variable or the file, and neither
// can be 0.
func TestApprovalBounds(t *testing.T) {
	const file = `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
tools:
  - {name: t, exec: [true], approval: required, approval_timeout: %s}
`
	cases := []struct {
		name  string
		tool  string
		flags map[string]string
		env   []string
		want  string // in the error; "" for none
	}{
		{"a week is allowed", "168h", map[string]string{budget.KeyApproval: "168h"}, nil, ""},
		{"tool over a week", "169h", nil, nil, `tools[0].approval_timeout: "169h" is above 168h, the largest allowed`},
		{"tool zero", "0", nil, nil, "tools[0].approval_timeout: 0 is not allowed"},
		{"tool below 1ms", "1us", nil, nil, "is below 1ms"},
		{"flag over a week", "1h", map[string]string{budget.KeyApproval: "169h"}, nil, "--approval-timeout"},
		{"env zero", "1h", nil, []string{"TIMEBOX_APPROVAL_TIMEOUT=0"}, "TIMEBOX_APPROVAL_TIMEOUT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeAgent(t, strings.Replace(file, "%s", tc.tool, 1)), Overrides{Flags: tc.flags, Env: tc.env})
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && err == nil:
				t.Fatalf("no error, want one with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q lacks %q", err, tc.want)
			}
		})
	}
}
