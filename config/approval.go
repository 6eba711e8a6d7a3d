package config

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
)

// Approval is a tool's approval key (spec §15): whether each call waits
// for a person's decision before it runs.
type Approval string

// The values of approval.
const (
	// ApprovalNever runs every call without asking; it is the default.
	ApprovalNever Approval = "never"
	// ApprovalRequired has every call wait for a person's decision, for at
	// most its approval timeout (then it expires, not run).
	ApprovalRequired Approval = "required"
)

var approvalNames = []string{string(ApprovalRequired), string(ApprovalNever)}

// approvalBounds bound approval_timeout: a person's decision may take a
// weekend, so it goes up to a week like timeouts.approval; it cannot be 0,
// which would expire every call before anyone could see it.
var approvalBounds = bounds{min: minDuration, max: budget.MaxTurn}

// decodeApproval reads the approval and approval_timeout keys of a tool
// entry or an mcp override at path.
func (l *loader) decodeApproval(fs map[string]entry, path string) rawApproval {
	var ra rawApproval
	if e, ok := fs["approval"]; ok {
		ra.approval = l.approval(e, path+".approval")
	}
	if e, ok := fs["approval_timeout"]; ok {
		ra.timeoutKeyAt = e.keyAt
		ra.timeout = l.approvalTimeout(e, path+".approval_timeout")
	}
	return ra
}

func (l *loader) approval(e entry, path string) Approval {
	v, at, ok := l.t.scalar(e.val, path, "required or never")
	if !ok {
		return ""
	}
	s := strings.TrimSpace(v.text)
	switch Approval(s) {
	case ApprovalRequired, ApprovalNever:
		return Approval(s)
	}
	hint := didYouMean(s, approvalNames)
	if hint == "" {
		switch strings.ToLower(s) {
		case "true", "yes", "on", "always", "require", "requires", "ask":
			hint = " (use required: every call waits for a person's decision)"
		case "false", "no", "off", "none", "0":
			hint = " (use never, the default: calls run without asking)"
		default:
			hint = " (use required or never)"
		}
	}
	l.errAt(at, path, fmt.Sprintf("%s is not an approval%s", v.show(), hint))
	return ""
}

func (l *loader) approvalTimeout(e entry, path string) *rawDuration {
	v, at, ok := l.t.scalar(e.val, path, "a duration such as 1h")
	if !ok {
		return nil
	}
	d, problem := checkDuration(v, approvalBounds, "24h")
	if problem != "" {
		l.errAt(at, path, problem)
		return nil
	}
	return &rawDuration{d: d, at: at}
}

// resolveApproval sets t's approval and approval timeout, and its
// overrides', from rt; knob and oknob name a key of the entry and of an
// override as the tool's timeout does. An approval_timeout by which no
// call would ever wait is an error: a setting that would be ignored is a
// typo that becomes a default (spec §10).
func (l *loader) resolveApproval(rt *rawTool, t *Tool, knob func(string) string, overrides map[string]Override, oknob func(name, key string) string) {
	t.Approval = ApprovalNever
	if rt.approval.approval != "" {
		t.Approval = rt.approval.approval
	}
	t.ApprovalTimeout = l.a.Budgets.Approval
	if at := rt.approval.timeout; at != nil {
		t.ApprovalTimeout = budget.Duration{D: at.d, Source: budget.SourceTool, Knob: knob("approval_timeout")}
		used := t.Approval == ApprovalRequired
		for _, ro := range rt.overrides {
			used = used || ro.approval.approval == ApprovalRequired
		}
		if !used {
			what := "the tool does not need approval (add approval: required, or remove approval_timeout)"
			if t.Kind == tool.KindMCP {
				what = "neither the entry nor any of its overrides needs approval (add approval: required, or remove approval_timeout)"
			}
			l.errAt(rt.approval.timeoutKeyAt, rt.path+".approval_timeout", "is set, but "+what)
		}
	}
	for _, ro := range rt.overrides {
		o := overrides[ro.name]
		o.Approval = ro.approval.approval
		if at := ro.approval.timeout; at != nil {
			o.ApprovalTimeout = budget.Duration{D: at.d, Source: budget.SourceTool, Knob: oknob(ro.name, "approval_timeout")}
			if eff := cmp.Or(ro.approval.approval, t.Approval); eff != ApprovalRequired {
				l.errAt(ro.approval.timeoutKeyAt, ro.path+".approval_timeout", fmt.Sprintf("is set, but %s does not need approval (add approval: required, here or to the entry, or remove approval_timeout)", ro.name))
			}
		}
		overrides[ro.name] = o
	}
}

// ApprovalFor says whether the calls of t need a person's decision, and
// how long each waits for it: remote is the server's name of one of an
// mcp entry's tools, whose override beats the entry; it is ignored for an
// exec tool. The timeout is the tool's approval_timeout (source tool), or
// timeouts.approval with its source.
func (t Tool) ApprovalFor(remote string) (required bool, timeout budget.Duration) {
	a, d := t.Approval, t.ApprovalTimeout
	if t.MCP != nil {
		if o, ok := t.MCP.Overrides[remote]; ok {
			a = cmp.Or(o.Approval, a)
			if o.ApprovalTimeout.Source != "" {
				d = o.ApprovalTimeout
			}
		}
	}
	return a == ApprovalRequired, d
}
