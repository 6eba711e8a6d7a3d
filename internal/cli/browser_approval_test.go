package cli_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/timebox-run/timebox/internal/proctest"
)

// TestPageApprovesAndDenies: a call that needs approval shows Approve and
// Deny with the time left; Approve runs it, Deny (with a reason) keeps it
// from running and says so. The turn's timeline draws the wait on the
// call's row, live, then says who decided and how.
func TestPageApprovesAndDenies(t *testing.T) {
	proctest.AfterTest(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "deploy.sh"), []byte("#!/bin/sh\ncat >/dev/null\necho deployed\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(
		`{"tool_calls": [{"name": "deploy", "arguments": {"env": "staging"}}]}`+"\n"+`{"text": "staging done"}`+"\n"+
			`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`+"\n"+`{"text": "prod was denied"}`+"\n"), 0o644)
	agentFile := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agentFile, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+
		"  - {name: deploy, exec: [./deploy.sh], approval: required, approval_timeout: 1h, timeout: 5s}\n"), 0o644)
	p := openPage(t, serveAgent(t, agentFile))

	const waiting = `.chip.approval.waiting[data-tool="deploy"]`
	p.send("deploy to staging")
	p.waitFor("the call waiting for a decision", q(waiting+" button.approve"))
	if left := p.text(waiting + " .left"); !regexpMatch(`^(59m|1h)\S* left to decide \(tools\[deploy\]\.approval_timeout in agent\.yaml\)$`, left) {
		p.fail("the time left reads %q", left)
	}
	// The timeline's row of the call is its wait, growing, and no bar.
	row := `#timeline .turn figure.tl .tl-row[data-label="deploy"]`
	p.waitFor("the call's wait on the timeline", q(row+`[data-outcome="waiting"] .tl-wait`)+` && !`+q(row+` .tl-bar`)+
		` && /waiting for a person$/.test(`+q(row+` .tl-num`)+`.textContent)`)
	// The turn waits for nothing but a person: its clock, like its
	// ceiling, stops.
	p.waitFor("the turn's clock to stop while it waits", q(`.turn-head .timer[data-paused="true"]`))
	eval[bool](p, q(waiting)+`.scrollIntoView({block: "center"}) === undefined`)
	p.do("clicking Approve", chromedp.Click(chromedp.CSS(waiting+" button.approve")))
	p.waitFor("the approved call to run and answer", q(`.chip.tool[data-tool="deploy"][data-outcome="ok"]`))
	p.waitFor("the turn's clock to show its wait for people apart", q(`.turn-head .timer[data-paused="false"][title*="waiting for people"]`))
	if got := p.text(`.chip.approval[data-tool="deploy"] .outcome`); !regexpMatch(`^approved by the page after `, got) {
		p.fail("the approval chip reads %q", got)
	}
	p.waitFor("the wait, then the call's bar, on the timeline", q(row+`[data-outcome="ok"] .tl-wait`)+` && `+q(row+` .tl-bar`))
	if got := p.text(row + ` .tl-num`); !regexpMatch(` ok, approved by the page$`, got) {
		p.fail("the timeline's row reads %q", got)
	}
	p.waitFor("the first turn's banner", q(`.banner`))

	p.send("deploy to prod")
	p.waitFor("the second call waiting", q(waiting+" button.deny"))
	// In the middle of the window, away from the composer fixed at its
	// bottom, as a person would scroll it.
	eval[bool](p, q(waiting)+`.scrollIntoView({block: "center"}) === undefined`)
	p.do("typing a reason and clicking Deny",
		chromedp.SendKeys(chromedp.CSS(waiting+" input.reason"), "change freeze"),
		chromedp.Click(chromedp.CSS(waiting+" button.deny")))
	p.waitFor("the denied call", q(`.chip.approval[data-outcome="denied"]`))
	if got := p.text(`.chip.approval[data-outcome="denied"] .outcome`); !regexpMatch(`^denied by the page after .*: change freeze$`, got) {
		p.fail("the denied chip reads %q", got)
	}
	p.waitFor("the denied call's wait on the timeline", q(row+`[data-outcome="refused"] .tl-wait`))
	if got := p.text(row + `[data-outcome="refused"] .tl-num`); got != "denied by the page" {
		p.fail("the timeline's row of the denied call reads %q", got)
	}
	if n := p.count(`.chip.tool[data-tool="deploy"]`); n != 1 {
		p.fail("%d deploy calls ran, want 1 (the denied one must not)", n)
	}
}
