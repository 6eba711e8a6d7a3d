package agent

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// TestFingerprintSaysTimeNotes: a runner and a worker that differ only in
// whether the model is told its time make different requests, so their
// agents are not taken for the same one (agent_mismatch).
func TestFingerprintSaysTimeNotes(t *testing.T) {
	mk := func(notes bool) string {
		a, err := New(Config{Name: "a", Models: []model.Endpoint{{Provider: nopProvider{}, ProviderName: "script", Model: "m"}}, TimeNotes: notes})
		if err != nil {
			t.Fatal(err)
		}
		return a.Ref().Fingerprint
	}
	on, off := mk(true), mk(false)
	if on == off {
		t.Error("an agent that tells the model its time has the fingerprint of one that does not")
	}
	if again := mk(false); again != off {
		t.Error("the fingerprint is not stable")
	}
}

// TestFingerprintSaysApprovals: whether a tool may ask for approval, and
// its own approval timeout, make a different agent (a runner that asks and
// a worker that does not would not run the same turn); a timeout that
// follows the turn's, or one of a tool that never asks, does not. An
// agent without approvals keeps the fingerprint it had before they
// existed.
func TestFingerprintSaysApprovals(t *testing.T) {
	mk := func(edit func(*Tool)) string {
		t.Helper()
		tl := Tool{Tool: tool.NewFunc("deploy", "deploys", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil })}
		edit(&tl)
		a, err := New(Config{Name: "a", Models: []model.Endpoint{{Provider: nopProvider{}, ProviderName: "script", Model: "m"}}, Tools: []Tool{tl}})
		if err != nil {
			t.Fatal(err)
		}
		return a.Ref().Fingerprint
	}
	own := budget.Duration{D: time.Hour, Source: budget.SourceTool, Knob: "tools[deploy].approval_timeout in agent.yaml"}
	follows := budget.Duration{D: 24 * time.Hour, Source: budget.SourceDefault, Knob: budget.KeyApproval}
	// before is the fingerprint of this agent before approvals existed.
	const before = "42a7e5ba356841794a828c61e212f63e441ba0175a28fa33ba46de2df7ba4403"
	none := mk(func(*Tool) {})
	if none != before {
		t.Errorf("an agent without approvals has the fingerprint %s, it had %s", none, before)
	}
	asks := mk(func(tl *Tool) { tl.NeedsApproval = ApprovalRequired })
	asksOwn := mk(func(tl *Tool) { tl.NeedsApproval, tl.ApprovalTimeout = ApprovalRequired, own })
	for _, c := range []struct {
		name      string
		got, want string
		same      bool
	}{
		{"asks", asks, none, false},
		{"asks with its own timeout", asksOwn, asks, false},
		{"asks with another timeout", mk(func(tl *Tool) {
			tl.NeedsApproval, tl.ApprovalTimeout = ApprovalRequired, budget.Duration{D: 2 * time.Hour, Source: budget.SourceTool}
		}), asksOwn, false},
		{"asks following the turn's timeout", mk(func(tl *Tool) { tl.NeedsApproval, tl.ApprovalTimeout = ApprovalRequired, follows }), asks, true},
		{"never asks, with a timeout", mk(func(tl *Tool) { tl.ApprovalTimeout = own }), none, true},
		{"asks, stable", mk(func(tl *Tool) { tl.NeedsApproval, tl.ApprovalTimeout = ApprovalRequired, own }), asksOwn, true},
	} {
		if (c.got == c.want) != c.same {
			t.Errorf("%s: fingerprint %s, compared with %s: same %v, want %v", c.name, c.got[:12], c.want[:12], c.got == c.want, c.same)
		}
	}
}

// nopProvider is a provider never called.
type nopProvider struct{}

func (nopProvider) Stream(context.Context, model.Request) (model.Stream, error) {
	return nil, errors.New("not called")
}
