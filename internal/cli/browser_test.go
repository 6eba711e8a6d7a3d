package cli_test

// Browser tests: `timebox serve` on the demo agent, driven in a real
// headless Chromium with chromedp, the way a user watches a turn.
//
// Without a Chromium these tests skip, unless TB_TEST_REQUIRE=chromium
// (CI sets it, after installing Debian's chromium), when they fail. On a
// failure the page is saved as a screenshot and its text is logged.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
)

const demoAgent = "../../examples/demo/agent.yaml"

// chromium returns the browser to drive, or skips the test (fails it
// under TB_TEST_REQUIRE=chromium).
func chromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("browser tests are not short")
	}
	return testenv.Chromium(t)
}

// serveDemo runs `timebox serve` on the demo agent on a free loopback port
// and returns its address. The server is stopped, as by SIGTERM, when the
// test ends.
func serveDemo(t *testing.T, env ...string) string {
	t.Helper()
	return serveAgent(t, demoAgent, env...)
}

// serveAgent is serveDemo for any agent file.
func serveAgent(t *testing.T, agentFile string, env ...string) string {
	t.Helper()
	base, _ := serveAgentDB(t, agentFile, env...)
	return base
}

// serveAgentDB is serveAgent, and the store the server keeps its turns in.
func serveAgentDB(t *testing.T, agentFile string, env ...string) (base, db string) {
	t.Helper()
	db = filepath.Join(t.TempDir(), "timebox.db")
	return serveAgentAt(t, agentFile, db, env...), db
}

// serveAgentAt is serveAgent on the store db, which may hold turns already.
func serveAgentAt(t *testing.T, agentFile, db string, env ...string) string {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var out, errb syncbuf.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- cli.Run(ctx, []string{"serve", "-f", agentFile, "--addr", "127.0.0.1:0", "--db", db},
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb, Env: env})
	}()
	t.Cleanup(func() {
		stop()
		select {
		case code := <-exited:
			if code != cli.ExitOK {
				t.Errorf("serve exited %d: %s", code, errb.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop within 30s of its shutdown: %s", errb.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-exited:
			t.Fatalf("serve exited %d: %s", code, errb.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve printed no address in 15s; out %q err %q", out.String(), errb.String())
		}
	}
}

// page is one browser tab on the server.
type page struct {
	t    *testing.T
	ctx  context.Context
	base string
	log  *syncbuf.Buffer // the browser's own output
}

// openPage starts a fresh headless Chromium (its own profile, nothing
// reaching beyond loopback) and opens base in it.
func openPage(t *testing.T, base string) *page {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1100, 900),
	)
	if os.Getenv("TB_TEST_SCREENSHOT") != "" {
		opts = append(opts, chromedp.WindowSize(1100, 1250)) // the whole demo turn in sight
	}
	log := &syncbuf.Buffer{}
	opts = append(opts, chromedp.CombinedOutput(log))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser to exit
	})
	p := &page{t: t, ctx: ctx, base: base, log: log}
	// The first action starts the browser; it must not run under a timeout.
	if err := chromedp.Do(ctx, chromedp.Navigate(base)); err != nil {
		t.Fatalf("starting chromium: %v\n%s", err, log.String())
	}
	p.waitFor("the page to load", `document.querySelector('#input') !== null && !document.querySelector('#chat-view').hidden`)
	return p
}

// fail saves a screenshot and the page's text, then stops the test.
func (p *page) fail(format string, args ...any) {
	p.t.Helper()
	msg := fmt.Sprintf(format, args...)
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	shot := filepath.Join(os.TempDir(), "timebox-"+strings.ReplaceAll(p.t.Name(), "/", "_")+".png")
	if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(90)); err == nil && os.WriteFile(shot, png, 0o644) == nil {
		msg += "\nscreenshot: " + shot
	}
	if text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`)); err == nil {
		msg += "\npage text:\n" + text
	}
	p.t.Fatal(msg)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.fail("evaluating %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition until it holds, for at most 20s.
func (p *page) waitFor(what, cond string) {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!(`+cond+`)`))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			p.fail("waited 20s for %s (%s); last error %v", what, cond, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fail("%s: %v", what, err)
	}
}

func (p *page) send(message string) {
	p.t.Helper()
	p.do("sending a message",
		chromedp.SendKeys(chromedp.CSS("#input"), message),
		chromedp.Click(chromedp.CSS("#send")))
}

var clockRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)(ms|s)\b`)

// clock reads a chip's timer as the user sees it ("1.4s / 10s"), in ms.
func (p *page) clock(sel string) float64 {
	p.t.Helper()
	text := eval[string](p, `document.querySelector(`+strconv.Quote(sel+" .timer")+`).textContent`)
	m := clockRE.FindStringSubmatch(text)
	if m == nil {
		p.fail("timer of %s reads %q", sel, text)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	if m[2] == "s" {
		v *= 1000
	}
	return v
}

// width reads the width of an element as a percentage of its style.
func (p *page) width(sel string) float64 {
	p.t.Helper()
	w := eval[string](p, `(document.querySelector(`+strconv.Quote(sel)+`) || {style: {width: ''}}).style.width`)
	v, _ := strconv.ParseFloat(strings.TrimSuffix(w, "%"), 64)
	return v
}

func (p *page) count(sel string) int {
	p.t.Helper()
	return eval[int](p, `document.querySelectorAll(`+strconv.Quote(sel)+`).length`)
}

func (p *page) text(sel string) string {
	p.t.Helper()
	return eval[string](p, `(document.querySelector(`+strconv.Quote(sel)+`) || {innerText: ''}).innerText`)
}

func q(sel string) string { return `document.querySelector(` + strconv.Quote(sel) + `)` }

const (
	crawl    = `.chip[data-tool="crawl"]`
	webFetch = `.chip[data-tool="web_fetch"]`
)

// TestPageFollowsADemoTurn is the scene: a message to the demo
// agent, a chip whose clock runs, a progress bar that moves, a tool that
// times out, and the closing banner; the page reloaded mid-turn picks the
// turn up where it was, and the past-turns page has its records.
func TestPageFollowsADemoTurn(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t))
	p.send("Tour the budgets")

	// A chip's clock counts from tool_started, live.
	p.waitFor("the crawl chip", q(crawl+".running"))
	first := p.clock(crawl)
	p.waitFor("crawl's clock to advance", fmt.Sprintf(`(() => { const m = /^([\d.]+)(ms|s)/.exec(%s.textContent);
		return m && (m[2] === 's' ? m[1] * 1000 : +m[1]) >= %f })()`, q(crawl+" .timer"), first+400))

	// The progress bar moves as the tool reports.
	p.waitFor("crawl's first progress", q(crawl+` .progress .fill[style*="width"]`))
	w1 := p.width(crawl + " .progress .fill")
	p.waitFor("crawl's progress bar to move", fmt.Sprintf(`parseFloat(%s.style.width) > %f`, q(crawl+" .progress .fill"), w1))

	// The hung tool is stopped by its 1s timeout, and says so.
	p.waitFor("web_fetch to time out", q(webFetch+`[data-outcome="timed_out"]`))
	if got := p.text(webFetch + " .outcome"); got != "timed out at its 1s timeout" {
		p.fail("web_fetch's outcome reads %q", got)
	}

	// Reloaded mid-turn, the page replays what happened and follows on.
	// (crawl runs 3.2s; web_fetch timed out at 1s: the turn is still on.)
	if p.count(`.banner`) != 0 {
		p.fail("the turn ended before crawl finished")
	}
	before := p.clock(crawl)
	p.do("reloading the page", chromedp.Reload())
	p.waitFor("the turn after the reload", q(crawl))
	if p.count(`.banner`) == 0 && p.count(crawl+".running") == 1 {
		if after := p.clock(crawl); after < before {
			p.fail("after the reload crawl's clock reads %.0fms, before it %.0fms: it must count from tool_started", after, before)
		}
	}
	p.waitFor("the still_working notice", q(`.still-working`))
	if shot := os.Getenv("TB_TEST_SCREENSHOT"); shot != "" { // docs/page.png
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		if b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot()); err == nil {
			_ = os.WriteFile(shot, b, 0o644)
		}
		cancel()
	}
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="answered"]`))
	p.waitFor("the answer", q(`.bubble.said.answer`))

	for sel, want := range map[string]int{
		`.chip.tool`: 5, `.banner`: 1, `.bubble.user`: 1,
		`.chip.tool[data-outcome="timed_out"]`:                 2, // web_fetch, legacy_sync
		`.chip[data-tool="report"].overran[data-outcome="ok"]`: 1,
		`.chip[data-tool="word_count"][data-outcome="ok"]`:     1,
		crawl + `[data-outcome="ok"]`:                          1,
		`.chip.running`:                                        0,
	} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s, want %d", n, sel, want)
		}
	}
	if w := p.width(crawl + " .progress .fill"); w != 100 {
		p.fail("crawl's progress bar ends at %v%%", w)
	}

	// The past turns page lists it; its page has the per-call records.
	p.do("opening past turns", chromedp.Click(chromedp.CSS("#nav-turns")))
	p.waitFor("the turn in the list", q(`#turns-table tbody tr[data-turn-id]`))
	if got := p.text(`#turns-table tbody tr`); !strings.Contains(got, "completed") || !strings.Contains(got, "answered") {
		p.fail("the turn's row reads %q", got)
	}
	p.do("opening the turn", chromedp.Click(chromedp.CSS(`#turns-table tbody tr[data-turn-id]`)))
	p.waitFor("the records", q(`table.calls tbody tr`))
	if n := p.count(`table.calls tbody tr`); n != 5 {
		p.fail("%d tool call records, want 5", n)
	}
	row := p.text(`table.calls tr[data-outcome="timed_out"]`)
	for _, want := range []string{"/ 1s", "tool", "hard", "phase tool"} {
		if !strings.Contains(row, want) {
			p.fail("a timed-out record reads %q, want %q in it", row, want)
		}
	}
	if got := p.text(`table.calls`); !strings.Contains(got, "overran") {
		p.fail("the records do not say report overran: %q", got)
	}
	if n := p.count(`table.models tbody tr`); n != 2 {
		p.fail("%d model call records, want 2", n)
	}

	// The Chat tab leads back to the conversation, not to a new one.
	p.do("back to the chat", chromedp.Click(chromedp.CSS("#nav-chat")))
	p.waitFor("the conversation again", q(`.banner[data-stop-reason="answered"]`))
	if n := p.count(`.chip.tool`); n != 5 {
		p.fail("%d tool chips in the replayed conversation, want 5", n)
	}
}

// TestPageBannerNamesTheBudget: a turn stopped by its ceiling ends with a
// banner that says which budget fired, its value and source, and the knob.
func TestPageBannerNamesTheBudget(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t, "TIMEBOX_TURN_TIMEOUT=2s"))
	p.send("Tour the budgets")
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="turn_timeout"]`))
	got := p.text(`.banner`)
	for _, want := range []string{"Stopped by the turn ceiling · ", "timeouts.turn = 2s (from env)", "Change TIMEBOX_TURN_TIMEOUT", "timed_out_during_tool_execution"} {
		if !strings.Contains(got, want) {
			p.fail("the banner reads %q, want %q in it", got, want)
		}
	}
	if n := p.count(`.chip.running`); n != 0 {
		p.fail("%d chips still running after the turn ended", n)
	}
	if got := p.text(crawl + " .outcome"); got == "" || got == "running" || got == "ok" {
		p.fail("crawl, cut by the turn's end, reads %q", got)
	}
}

// TestPageTurnBudgetField: the composer's optional turn budget goes with
// the message; the turn stops at it and the banner says the value came from
// the request. A budget over the ceiling is refused with the server's
// sentence, and no turn starts.
func TestPageTurnBudgetField(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t))
	p.do("asking for more than the agent allows",
		chromedp.SendKeys(chromedp.CSS("#turn-budget"), "48h"),
		chromedp.SendKeys(chromedp.CSS("#input"), "Tour the budgets"),
		chromedp.Click(chromedp.CSS("#send")))
	p.waitFor("the refusal", `!`+q(`#composer-error`)+`.hidden`)
	if got := p.text(`#composer-error`); !strings.Contains(got, "budgets.turn") || !strings.Contains(got, "48h") {
		p.fail("the refusal reads %q", got)
	}
	eval[string](p, `document.querySelector("#turn-budget").value = ""`)
	p.do("asking for 1.5s",
		chromedp.SendKeys(chromedp.CSS("#turn-budget"), "1500ms"),
		chromedp.Click(chromedp.CSS("#send")))
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="turn_timeout"]`))
	got := p.text(`.banner`)
	for _, want := range []string{"timeouts.turn = 1.5s (from the request)", "Change budgets.turn in the request"} {
		if !strings.Contains(got, want) {
			p.fail("the banner reads %q, want %q in it", got, want)
		}
	}
	if n := p.count(`.turn`); n != 1 {
		p.fail("%d turns on the page, want 1", n)
	}
}

// TestPageCancelButton: the cancel button ends the running turn as
// cancelled, its tools' processes gone.
func TestPageCancelButton(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t))
	p.send("Tour the budgets")
	p.waitFor("the crawl chip", q(crawl+".running"))
	p.waitFor("the cancel button", `!`+q(`#cancel`)+`.hidden`)
	p.do("cancelling", chromedp.Click(chromedp.CSS("#cancel")))
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="cancelled"]`))
	if n := p.count(`.chip.running`); n != 0 {
		p.fail("%d chips still running after the cancel", n)
	}
	p.waitFor("the composer to be ready again", q(`#cancel`)+`.hidden && !`+q(`#send`)+`.disabled`)
}

// cutter is a loopback TCP proxy in front of the server that can cut every
// connection through it, as a dropped network would, and notes the event
// requests the page makes.
type cutter struct {
	t     *testing.T
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
	seen  syncbuf.Buffer // what the browser sent
}

func newCutter(t *testing.T, target string) *cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{t: t, ln: ln, to: strings.TrimPrefix(target, "http://")}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", c.to)
			if err != nil {
				in.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(io.MultiWriter(out, &c.seen), in); out.Close() }()
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		c.cut()
		wg.Wait()
	})
	return c
}

func (c *cutter) url() string { return "http://" + c.ln.Addr().String() }

// cut closes every connection through the proxy.
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

var afterRE = regexp.MustCompile(`GET /v1/turns/\S+/events\?after=(\d+)`)

// TestPageReconnects: the network drops mid-turn; the page says it is
// reconnecting, resumes after the last event it applied, and ends with every
// event once.
func TestPageReconnects(t *testing.T) {
	proctest.AfterTest(t)
	proxy := newCutter(t, serveDemo(t))
	p := openPage(t, proxy.url())
	p.send("Tour the budgets")
	p.waitFor("crawl's first progress", q(crawl+` .progress .fill[style*="width"]`))
	w1 := p.width(crawl + " .progress .fill")
	seq := eval[string](p, q(`.turn`)+`.dataset.lastSeq`)

	proxy.cut()
	p.waitFor("crawl's progress bar to move after the cut", fmt.Sprintf(`parseFloat(%s.style.width) > %f`, q(crawl+" .progress .fill"), w1))
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="answered"]`))

	last, _ := strconv.Atoi(seq)
	resumed := false
	for _, m := range afterRE.FindAllStringSubmatch(proxy.seen.String(), -1) {
		if n, _ := strconv.Atoi(m[1]); n > 0 && n >= last {
			resumed = true
		}
	}
	if !resumed {
		p.fail("no events request resumed after event %s; requests:\n%s", seq, strings.Join(afterRE.FindAllString(proxy.seen.String(), -1), "\n"))
	}
	for sel, want := range map[string]int{`.chip.tool`: 5, `.chip.model`: 2, `.banner`: 1, `.bubble.said`: 2} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s after the reconnect, want %d", n, sel, want)
		}
	}
}

// TestPageAsksForTheToken: on a server with a token, the page asks for it
// once, keeps it in the tab only, and its requests carry it.
func TestPageAsksForTheToken(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t, "TIMEBOX_TOKEN=s3cret-token"))
	p.send("Tour the budgets")
	p.waitFor("the token dialog", q(`#token-dialog`)+`.open`)
	p.do("giving the token",
		chromedp.SendKeys(chromedp.CSS("#token-input"), "s3cret-token"),
		chromedp.Click(chromedp.CSS(`#token-form button`)))
	p.waitFor("the turn to run", q(crawl))
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="answered"]`))
	if got := eval[string](p, `sessionStorage.getItem('timebox.token')`); got != "s3cret-token" {
		p.fail("sessionStorage has %q", got)
	}
	if got := eval[string](p, `location.href + ' ' + JSON.stringify(localStorage)`); strings.Contains(got, "s3cret") {
		p.fail("the token is in the URL or localStorage: %s", got)
	}
	if n := p.count(`.chip.tool`); n != 5 {
		p.fail("%d tool chips, want 5", n)
	}
}

// TestPageTokenDialogClosedOrRefused: closing the token dialog (Escape)
// fails the request that waited, saying a token is needed, and the next
// request asks again, where the page used to wait for good; a token the
// server refuses is dropped and the dialog says so.
func TestPageTokenDialogClosedOrRefused(t *testing.T) {
	proctest.AfterTest(t)
	p := openPage(t, serveDemo(t, "TIMEBOX_TOKEN=s3cret-token"))
	p.send("Tour the budgets")
	p.waitFor("the token dialog", q(`#token-dialog`)+`.open`)
	eval[bool](p, q(`#token-dialog`)+`.close(), true`) // as Escape does
	p.waitFor("the composer to say a token is needed", q(`#composer-error`)+`.textContent.includes('needs its token')`)
	p.waitFor("Send to be usable again", `!`+q(`#send`)+`.disabled`)
	p.send("Tour the budgets")
	p.waitFor("the token dialog again", q(`#token-dialog`)+`.open`)
	p.do("giving a wrong token",
		chromedp.SendKeys(chromedp.CSS("#token-input"), "wrong-token-0123456789"),
		chromedp.Click(chromedp.CSS(`#token-form button`)))
	p.waitFor("the dialog to say the token was refused", q(`#token-dialog`)+`.open && !`+q(`#token-refused`)+`.hidden`)
	if got := eval[string](p, `sessionStorage.getItem('timebox.token') || ''`); got != "" {
		p.fail("the refused token is kept: %q", got)
	}
	p.do("giving the token",
		chromedp.SendKeys(chromedp.CSS("#token-input"), "s3cret-token"),
		chromedp.Click(chromedp.CSS(`#token-form button`)))
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="answered"]`))
	// Durations of an hour or more read in hours; a malformed link does not
	// stop the page from changing views.
	if got := eval[string](p, `fmtMS(24*3600e3) + ' ' + fmtMS(3723e3)`); got != "24h00m 1h02m" {
		p.fail("fmtMS gives %q", got)
	}
	eval[bool](p, `location.hash = '#/turns', true`)
	p.waitFor("the past turns", `!`+q(`#turns-view`)+`.hidden`)
	eval[bool](p, `location.hash = '#/chat/%E0%A4%A', true`)
	p.waitFor("the chat view", `!`+q(`#chat-view`)+`.hidden && `+q(`#turns-view`)+`.hidden`)
}

// gateAgent writes an agent on the script model whose turn calls one tool,
// gate, that runs until the test creates the file gate returns, and then
// answers gateAnswer, a word at a time: a turn that runs exactly as long as
// the test needs. Each turn of a session plays the script again.
func gateAgent(t *testing.T) (agentFile, gate string) {
	t.Helper()
	dir := t.TempDir()
	gate = filepath.Join(dir, "gate")
	wait := fmt.Sprintf("cat >/dev/null; while [ ! -e '%s' ]; do sleep 0.05; done; echo '{\"gate\": \"open\"}'", gate)
	agent := fmt.Sprintf(`name: gate
instructions: Call the gate tool, then answer.
model:
  primary: script:gate
providers:
  script:
    file: script.jsonl
timeouts:
  turn: 2m
tools:
  - name: gate
    description: Waits until its gate opens.
    exec: ["/bin/sh", "-c", %s]
    timeout: 90s
    env: [PATH]
`, strconv.Quote(wait))
	script := `{"text": "Waiting for the gate.", "tool_calls": [{"name": "gate"}]}
{"text": "` + gateAnswer + `", "chunk_delay": "20ms"}
`
	agentFile = filepath.Join(dir, "agent.yaml")
	for name, body := range map[string]string{agentFile: agent, filepath.Join(dir, "script.jsonl"): script} {
		if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A tool still waiting when the test ends stops with the server; this
	// is for a test that failed before it opened the gate.
	t.Cleanup(func() { _ = os.WriteFile(gate, nil, 0o644) })
	return agentFile, gate
}

const gateAnswer = "The gate opened and the wait is over."

// durationRE is a duration as the page prints it (fmtMS).
const durationRE = `(\d+ms|\d+\.\d+s|\d+m\d\ds)`

// TestPageBannerSaysWhyOnce: the closing banner's headline says why the
// turn ended and how long it ran, in words, without the stop reason
// repeated after its own label ("Answered · answered" was issue 28's); the
// same on the turn's records page, and for a cancelled turn.
func TestPageBannerSaysWhyOnce(t *testing.T) {
	proctest.AfterTest(t)
	agentFile, gate := gateAgent(t)
	p := openPage(t, serveAgent(t, agentFile))

	// Answered.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.send("Open the gate")
	p.waitFor("the closing banner", q(`.banner[data-stop-reason="answered"]`))
	answered := regexp.MustCompile(`^Answered · ` + durationRE + `$`)
	if got := p.text(`.banner .title`); !answered.MatchString(got) {
		p.fail("the answered banner's headline reads %q, want %s", got, answered)
	}
	if got := p.text(`.banner`); strings.Count(strings.ToLower(got), "answered") != 1 {
		p.fail("the answered banner says answered more than once: %q", got)
	}
	if got := p.text(`.banner .totals`); !strings.HasPrefix(got, "2 steps · 1 tool call · model ") || !strings.HasSuffix(got, " · records") {
		p.fail("the answered banner's totals read %q", got)
	}
	p.do("opening the turn's records", chromedp.Click(chromedp.CSS(`.banner .totals a`)))
	p.waitFor("the records page", q(`#turn-view[data-state="ended"] .banner[data-stop-reason="answered"]`))
	if got := p.text(`#turn-view .banner .title`); !answered.MatchString(got) {
		p.fail("the records page's banner headline reads %q, want %s", got, answered)
	}

	// Cancelled, in the same conversation.
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	p.do("back to the chat", chromedp.Click(chromedp.CSS("#nav-chat")))
	p.waitFor("the conversation", `!`+q(`#chat-view`)+`.hidden && `+q(`#timeline .banner[data-stop-reason="answered"]`))
	p.send("Wait for the gate")
	p.waitFor("the gate tool to run", q(`#timeline .turn:nth-child(2) .chip[data-tool="gate"].running`))
	p.do("cancelling", chromedp.Click(chromedp.CSS("#cancel")))
	p.waitFor("the closing banner", q(`#timeline .turn:nth-child(2) .banner[data-stop-reason="cancelled"]`))
	cancelled := regexp.MustCompile(`^Cancelled · ` + durationRE + `$`)
	if got := p.text(`#timeline .turn:nth-child(2) .banner .title`); !cancelled.MatchString(got) {
		p.fail("the cancelled banner's headline reads %q, want %s", got, cancelled)
	}
	if got := p.text(`#timeline .turn:nth-child(2) .banner .msg`); !strings.HasPrefix(got, "Cancelled by") {
		p.fail("the cancelled banner's message reads %q", got)
	}
}

// TestPagePastTurnFollowsARunningTurn: a turn opened from the Past turns
// list while it runs shows what is stored, then follows the turn's events
// from the last stored one (no event missed, none twice) to its closing
// banner and final records, without a reload. Opened again once it has
// ended, it is a static page that follows nothing.
func TestPagePastTurnFollowsARunningTurn(t *testing.T) {
	proctest.AfterTest(t)
	agentFile, gate := gateAgent(t)
	base := serveAgent(t, agentFile)
	proxy := newCutter(t, base)

	// A turn started elsewhere (another tab, a script), running in its tool.
	res, err := http.Post(base+"/v1/turns", "application/json", strings.NewReader(`{"input": "Wait for the gate", "detach": true}`))
	if err != nil {
		t.Fatal(err)
	}
	var acc struct {
		TurnID string `json:"turn_id"`
	}
	err = json.NewDecoder(res.Body).Decode(&acc)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusAccepted || acc.TurnID == "" {
		t.Fatalf("POST /v1/turns: %d, %+v, %v", res.StatusCode, acc, err)
	}
	id := acc.TurnID
	stored := storedEvents(t, base, id, func(evs []map[string]any) bool {
		return len(evs) > 0 && evs[len(evs)-1]["type"] == "tool_started"
	})

	p := openPage(t, proxy.url())
	eval[bool](p, `window.notReloaded = true`)
	p.do("opening past turns", chromedp.Click(chromedp.CSS("#nav-turns")))
	row := `#turns-table tbody tr[data-turn-id=` + strconv.Quote(id) + `]`
	p.waitFor("the running turn in the list", q(row))
	if got := p.text(row); !strings.Contains(got, "running") {
		p.fail("the turn's row reads %q", got)
	}
	p.do("opening the running turn", chromedp.Click(chromedp.CSS(row)))

	// What was stored: the running tool, with its clock.
	p.waitFor("the running turn's page", `/running/.test(`+q(`#turn-view dl.facts`)+`?.innerText)`)
	p.waitFor("the running tool call, from the stored events", q(`#turn-view[data-state="running"] .turn .chip[data-tool="gate"].running`))
	for sel, want := range map[string]int{`#turn-view .banner`: 0, `#turn-view table.models tbody tr`: 1, `#turn-view table.calls`: 0} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s while the turn runs, want %d", n, sel, want)
		}
	}
	p.waitFor("the stream to be followed", `/live/.test(`+q(`#conn`)+`.className)`)

	// Then what happens next, live.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.waitFor("the gate tool to end", q(`#turn-view .chip[data-tool="gate"][data-outcome="ok"]`))
	p.waitFor("the closing banner", q(`#turn-view .turn .banner[data-stop-reason="answered"]`))
	p.waitFor("the final records", q(`#turn-view[data-state="ended"]`))

	final := storedEvents(t, base, id, func(evs []map[string]any) bool {
		return len(evs) > 0 && evs[len(evs)-1]["type"] == "turn_finished"
	})
	turn := `#turn-view .turn`
	if last, applied := eval[string](p, q(turn)+`.dataset.lastSeq`), eval[string](p, q(turn)+`.dataset.applied`); last != strconv.Itoa(len(final)) || applied != last {
		p.fail("the page applied %s events up to seq %s; the turn has %d", applied, last, len(final))
	}
	if !eval[bool](p, `window.notReloaded === true`) {
		p.fail("the page was reloaded")
	}
	for sel, want := range map[string]int{
		`#turn-view .turn`: 1, `#turn-view .chip.tool`: 1, `#turn-view .chip.model`: 2, `#turn-view .banner`: 1,
		`#turn-view .chip.running`: 0, `#turn-view .bubble.said.answer`: 1,
		`#turn-view table.calls tbody tr[data-outcome="ok"]`: 1, `#turn-view table.models tbody tr`: 2,
	} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s, want %d", n, sel, want)
		}
	}
	if got := p.text(`#turn-view .bubble.said.answer`); got != gateAnswer {
		p.fail("the answer reads %q, want %q", got, gateAnswer)
	}
	if got := p.text(`#turn-view dl.facts`); !strings.Contains(got, "completed · answered") {
		p.fail("the ended turn's facts read %q", got)
	}
	if got := p.text(`#conn`); got != "" {
		p.fail("the stream indicator still reads %q", got)
	}

	// It resumed after what was stored, rather than from the start.
	requests := func() []string {
		var after []string
		for _, m := range regexp.MustCompile(`GET /v1/turns/`+regexp.QuoteMeta(id)+`/events\?after=(\d+)`).FindAllStringSubmatch(proxy.seen.String(), -1) {
			after = append(after, m[1])
		}
		return after
	}
	after := requests()
	if len(after) == 0 {
		p.fail("the page never asked for the turn's events")
	}
	if n, _ := strconv.Atoi(after[0]); n < len(stored) {
		p.fail("the page followed the turn after event %d; %d were stored when it opened", n, len(stored))
	}

	// Opened again now that it has ended: static, and nothing followed.
	p.do("back to past turns", chromedp.Click(chromedp.CSS("#nav-turns")))
	p.waitFor("the ended turn in the list", q(row)+` && /completed/.test(`+q(row)+`.innerText)`)
	p.do("opening the ended turn", chromedp.Click(chromedp.CSS(row)))
	// (The live page's timeline is gone once the page is drawn anew.)
	p.waitFor("the static page", q(`#turn-view[data-state="ended"] .banner[data-stop-reason="answered"]`)+` && !`+q(`#turn-view .turn`))
	for sel, want := range map[string]int{`#turn-view .turn`: 0, `#turn-view .banner`: 1, `#turn-view table.calls tbody tr`: 1} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s on the ended turn's page, want %d", n, sel, want)
		}
	}
	if again := requests(); len(again) != len(after) {
		p.fail("the ended turn's page asked for its events: %v", again[len(after):])
	}
}

// storedEvents polls GET /v1/turns/ID until its events satisfy ok (20s at
// most), and returns them.
func storedEvents(t *testing.T, base, id string, ok func([]map[string]any) bool) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var rec struct {
			Events []map[string]any `json:"events"`
		}
		res, err := http.Get(base + "/v1/turns/" + id)
		if err == nil {
			err = json.NewDecoder(res.Body).Decode(&rec)
			res.Body.Close()
		}
		if err == nil && ok(rec.Events) {
			return rec.Events
		}
		if time.Now().After(deadline) {
			t.Fatalf("turn %s: its stored events are not there after 20s (%d events, %v)", id, len(rec.Events), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tlRow is one row of a timeline on the page, as timelineRows reads it.
type tlRow struct {
	Label, Kind, Outcome, Num   string
	Deadline, Later, Over, Tail bool
	Lost, Wait                  bool
	Ticks, Notices              int
	Mark                        bool
	Left, Right, Top            float64 // the bar's, in pixels
	DeadlineX                   float64
}

// timelineRows reads the rows of the timeline fig (a CSS selector).
func (p *page) timelineRows(fig string) []tlRow {
	p.t.Helper()
	js := `JSON.stringify([...document.querySelectorAll(` + strconv.Quote(fig+" .tl-row") + `)].map((r) => {
		const bar = (r.querySelector('.tl-bar, .tl-mark') || r).getBoundingClientRect();
		const dl = r.querySelector('.tl-deadline:not(.later)');
		return { Label: r.dataset.label, Kind: r.dataset.kind, Outcome: r.dataset.outcome, Num: r.querySelector('.tl-num').textContent,
			Deadline: !!dl, Later: !!r.querySelector('.tl-deadline.later'), Over: !!r.querySelector('.tl-over'),
			Tail: !!r.querySelector('.tl-tail'), Lost: !!r.querySelector('.tl-lost'), Wait: !!r.querySelector('.tl-wait'), Ticks: r.querySelectorAll('.tl-tick').length,
			Notices: r.querySelectorAll('.tl-notice').length, Mark: !!r.querySelector('.tl-mark'),
			Left: bar.left, Right: bar.right, Top: bar.top, DeadlineX: dl ? dl.getBoundingClientRect().left + 1 : 0 };
	}))`
	var rows []tlRow
	if err := json.Unmarshal([]byte(eval[string](p, js)), &rows); err != nil {
		p.fail("reading the timeline's rows: %v", err)
	}
	return rows
}

// words is what a row says after its numbers: "timed out", "ok, overran".
func (r tlRow) words() string {
	return regexp.MustCompile(`^\S+…?( / \S+)? `).ReplaceAllString(r.Num, "")
}

// sameAsTerminal checks that the page's rows are the terminal's: lines are
// what `runs show --timeline` drew of the same turn (its head, its axis,
// then a row for each): the same calls in the same order, the same outcome
// characters and words, and the same marks (deadline, deadline after the
// end, overrun, abandoned tail, a lost worker's stretch, a wait for a
// person, progress).
func (p *page) sameAsTerminal(rows []tlRow, lines []string) {
	p.t.Helper()
	chars := map[string]string{"ok": "=", "running": "-", "timed_out": "#", "cancelled": "~", "error": "x",
		"abandoned": "!", "interrupted": "?", "insufficient": "%", "refused": "/", "failover": "*", "waiting": ":"}
	if len(lines) < len(rows)+2 {
		p.fail("the terminal drew %d lines for %d rows:\n%s", len(lines), len(rows), strings.Join(lines, "\n"))
	}
	for i, r := range rows {
		line := lines[2+i]
		label, rest, _ := strings.Cut(line, "  ")
		if strings.TrimSpace(label) != r.Label && !strings.HasPrefix(line, r.Label+" ") {
			p.fail("row %d: the page has %s, the terminal %q", i+1, r.Label, line)
		}
		words := r.words()
		if r.Kind == "failover" {
			words, _, _ = strings.Cut(words, " (")
		}
		for what, ok := range map[string]bool{
			"its words " + strconv.Quote(words): strings.Contains(rest, " "+words),
			"its outcome " + r.Outcome:          strings.Contains(rest, chars[r.Outcome]),
			"a deadline inside the axis (|)":    strings.Contains(rest, "|") == r.Deadline,
			"a deadline after the axis (>)":     strings.Contains(rest, ">") == r.Later,
			"an overrun past its budget (+)":    strings.Contains(rest, "+") == r.Over,
			"an abandoned call's tail (..)":     strings.Contains(rest, "..") == r.Tail,
			"a lost worker's stretch (__)":      strings.Contains(rest, "__") == r.Lost,
			"a wait for a person (::)":          strings.Contains(rest, "::") == r.Wait,
			"progress reports (')":              strings.Contains(rest, "'") == (r.Ticks > 0),
		} {
			if !ok {
				p.fail("row %d, %s: the page and the terminal differ on %s:\npage %+v\nterminal %q", i+1, r.Label, what, r, line)
			}
		}
	}
}

// TestPageTimeline: the demo turn drawn as a timeline — each call a bar on
// one time axis, concurrent calls on rows of their own — that grows while
// the turn runs (bars lengthen, progress ticks appear, a timed-out call
// turns its colour at its deadline); the same rows as `timebox runs show
// --timeline` draws of the stored turn; and the turn's records page draws
// it again from the stored events. With TB_TEST_SCREENSHOT=docs/page.png,
// the records page's timeline is saved beside it as timeline.png.
func TestPageTimeline(t *testing.T) {
	proctest.AfterTest(t)
	base, db := serveAgentDB(t, demoAgent)
	p := openPage(t, base)
	p.send("Tour the budgets")
	fig := `#timeline .turn figure.tl`
	row := func(label string) string { return fig + ` .tl-row[data-label="` + label + `"]` }

	// Live: crawl's bar grows with the axis, and its reports tick on it.
	p.waitFor("crawl's running bar", q(row("crawl")+`[data-outcome="running"] .tl-bar`))
	if got := eval[string](p, q(fig)+`.dataset.state`); got != "running" {
		p.fail("the timeline of a running turn is %q", got)
	}
	w0 := eval[float64](p, q(row("crawl")+" .tl-bar")+`.getBoundingClientRect().width`)
	p.waitFor("crawl's bar to grow", fmt.Sprintf(`%s.getBoundingClientRect().width > %f + 30`, q(row("crawl")+" .tl-bar"), w0))
	p.waitFor("crawl's progress ticks", `document.querySelectorAll(`+strconv.Quote(row("crawl")+" .tl-tick")+`).length >= 2 && `+
		q(row("crawl"))+`.dataset.outcome === "running"`)
	p.waitFor("web_fetch to time out on the timeline", q(row("web_fetch")+`[data-outcome="timed_out"]`))

	// The five tool calls started together: side by side, a row each.
	rows := p.timelineRows(fig)
	tops := map[float64]bool{}
	for _, r := range rows {
		tops[r.Top] = true
	}
	if len(tops) != len(rows) {
		p.fail("%d rows on %d lines: %+v", len(rows), len(tops), rows)
	}
	var lefts []float64
	for _, r := range rows {
		if r.Kind == "tool" {
			lefts = append(lefts, r.Left)
		}
	}
	// (They start within a few ms of each other: a few pixels.)
	if len(lefts) != 5 || slices.Max(lefts)-slices.Min(lefts) > 12 {
		p.fail("the five tool calls' bars start at %v: not side by side", lefts)
	}

	p.waitFor("the timeline of the ended turn", q(fig+`[data-state="ended"]`))
	rows = p.timelineRows(fig)
	var got []string
	for _, r := range rows {
		got = append(got, r.Label+" "+r.Outcome)
	}
	want := []string{"model demo ok", "word_count ok", "crawl ok", "web_fetch timed_out", "legacy_sync timed_out", "report ok", "model demo ok"}
	if !slices.Equal(got, want) {
		p.fail("the timeline's rows are %q, want %q", got, want)
	}
	byLabel := map[string]tlRow{}
	for _, r := range rows {
		byLabel[r.Label] = r
	}
	for what, ok := range map[string]bool{
		"crawl has its 8 progress reports":                      byLabel["crawl"].Ticks == 8,
		"web_fetch's deadline is where its bar ends":            byLabel["web_fetch"].Deadline && math.Abs(byLabel["web_fetch"].DeadlineX-byLabel["web_fetch"].Right) < 6,
		"legacy_sync's deadline is inside its bar (kill_grace)": byLabel["legacy_sync"].DeadlineX > byLabel["legacy_sync"].Left+20 && byLabel["legacy_sync"].DeadlineX < byLabel["legacy_sync"].Right-20,
		"report's overrun is drawn past its deadline":           byLabel["report"].Over && byLabel["report"].Deadline && byLabel["report"].words() == "ok, overran",
		"word_count's 5s deadline is after the end of the turn": byLabel["word_count"].Later && !byLabel["word_count"].Deadline,
		"the still_working notice is on the calls it named":     byLabel["legacy_sync"].Notices+byLabel["report"].Notices > 0,
		"web_fetch reads its duration against its budget":       regexp.MustCompile(`^1\.\ds / 1s timed out$`).MatchString(byLabel["web_fetch"].Num),
	} {
		if !ok {
			p.fail("%s: %+v", what, rows)
		}
	}
	legend := p.text(fig + " .tl-legend")
	for _, w := range []string{"ok", "timed out", "past its budget, let run (advisory)", "progress report", "deadline", "deadline after the end"} {
		if !strings.Contains(legend, w) {
			p.fail("the legend reads %q, want %q in it", legend, w)
		}
	}

	// The terminal draws the same rows of the stored turn.
	id := eval[string](p, q(`#timeline .turn`)+`.dataset.turnId`)
	var out, errb bytes.Buffer
	if code := cli.Run(t.Context(), []string{"runs", "show", id, "--timeline", "--db", db},
		cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb}); code != cli.ExitOK {
		t.Fatalf("runs show --timeline: exit %d: %s", code, errb.String())
	}
	p.sameAsTerminal(rows, strings.Split(out.String(), "\n"))

	// Its records page draws it again, from what was stored.
	p.do("opening the turn's records", chromedp.Click(chromedp.CSS(`.banner .totals a`)))
	stored := `#turn-view figure.tl`
	p.waitFor("the records page's timeline", q(`#turn-view[data-state="ended"] `+`figure.tl[data-state="ended"] .tl-row`))
	again := p.timelineRows(stored)
	if len(again) != len(rows) {
		p.fail("the records page draws %d rows, the chat %d", len(again), len(rows))
	}
	for i := range rows {
		a, b := rows[i], again[i]
		if a.Label != b.Label || a.Outcome != b.Outcome || a.Num != b.Num || a.Ticks != b.Ticks || a.Deadline != b.Deadline || a.Over != b.Over {
			p.fail("row %d: the chat drew %+v, the records page %+v", i+1, a, b)
		}
	}
	if shot := os.Getenv("TB_TEST_SCREENSHOT"); shot != "" { // docs/timeline.png
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		if b, err := chromedp.Run(ctx, chromedp.ScreenshotScale(chromedp.CSS(stored), 1.5)); err == nil {
			_ = os.WriteFile(filepath.Join(filepath.Dir(shot), "timeline.png"), b, 0o644)
		}
		cancel()
	}
}

// serveFixture puts an HTTP proxy in front of base that answers GET
// /v1/turns/ID with a turn read from file (a record with its events, as
// `runs show --json` writes it) and passes everything else on. It returns
// the proxy's URL and the turn's id.
func serveFixture(t *testing.T, base, file string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	to, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(to)
	tr := &http.Transport{}
	rp.Transport = tr
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/turns/"+rec.TurnID {
			w.Header().Set("Content-Type", "application/json")
			w.Write(b)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return srv.URL, rec.TurnID
}

// TestPageTimelineOutcomes: a stored turn with every outcome — a compaction,
// an attempt that timed out and its failover, an error, a timeout, an
// abandoned call and its late result, an advisory overrun, a refused call,
// a call cut by the turn's ceiling — drawn on its records page as `timebox
// runs show --timeline` draws it (internal/cli/testdata/timeline): the same
// rows, outcomes and marks; the still_working notices on the calls they
// name, in the form with a list of calls and in the older one.
func TestPageTimelineOutcomes(t *testing.T) {
	proctest.AfterTest(t)
	base, id := serveFixture(t, serveDemo(t), "testdata/timeline/outcomes.json")
	p := openPage(t, base)
	eval[string](p, `location.hash = `+strconv.Quote("#/turns/"+id))
	fig := `#turn-view figure.tl`
	p.waitFor("the stored turn's timeline", q(`#turn-view[data-state="ended"] figure.tl[data-state="ended"] .tl-row`))
	rows := p.timelineRows(fig)
	golden, err := os.ReadFile("testdata/timeline/outcomes.txt")
	if err != nil {
		t.Fatal(err)
	}
	p.sameAsTerminal(rows, strings.Split(string(golden), "\n"))
	if n := strings.Count(string(golden), "\n") - 2 - 3; n != len(rows) { // head, axis, 3 lines of legend
		p.fail("the page draws %d rows, the terminal %d", len(rows), n)
	}
	notices := map[string]int{}
	for _, r := range rows {
		notices[r.Label] = r.Notices
	}
	if want := map[string]int{"web_fetch": 1, "lookup": 1, "report": 1, "crawl": 1, "fetch": 0}; !maps.Equal(filter(notices, want), want) {
		p.fail("still_working notices by row: %v, want %v", notices, want)
	}
	for sel, want := range map[string]int{
		fig + ` .tl-row[data-kind="failover"] .tl-mark`:     1,
		fig + ` .tl-row[data-outcome="refused"] .tl-mark`:   1,
		fig + ` .tl-row[data-outcome="abandoned"] .tl-tail`: 1,
		fig + ` .tl-row[data-kind="compaction"] .tl-bar`:    1,
	} {
		if n := p.count(sel); n != want {
			p.fail("%d of %s, want %d", n, sel, want)
		}
	}
}

// TestPageTimelineLostWorker: a turn of the Temporal engine whose worker
// was killed while two tools ran, drawn on the page from its stored record
// and events as `runs show --timeline` draws it: the call lost with its
// worker ends at its last heartbeat, then a stretch to when the loss was
// noticed; the call of a tool with retries: 1 is one row, its lost first
// attempt a stretch before the attempt that answered — not a second row of
// a call "cancelled" after running the whole turn.
func TestPageTimelineLostWorker(t *testing.T) {
	proctest.AfterTest(t)
	base, id := serveFixture(t, serveDemo(t), "testdata/timeline/lost.json")
	p := openPage(t, base)
	eval[string](p, `location.hash = `+strconv.Quote("#/turns/"+id))
	fig := `#turn-view figure.tl`
	p.waitFor("the stored turn's timeline", q(`#turn-view[data-state="ended"] figure.tl[data-state="ended"] .tl-row`))
	rows := p.timelineRows(fig)
	golden, err := os.ReadFile("testdata/timeline/lost.txt")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(golden), "\n") - 2 - 2; n != len(rows) { // head, axis, 2 lines of legend
		p.fail("the page draws %d rows, the terminal %d: %+v", len(rows), n, rows)
	}
	p.sameAsTerminal(rows, strings.Split(string(golden), "\n"))
	if n := p.count(fig + ` .tl-lost`); n != 2 {
		p.fail("%d stretches of a lost worker, want 2", n)
	}
}

// TestPageTimelineApprovals: a turn whose calls waited for a person —
// approved by alice, then run; denied by bob; expired — drawn on the page
// from its stored record and events as `runs show --timeline` draws it:
// each wait a stretch on its call's row before the call began, saying how
// it ended and who ended it; not an empty stretch that reads as the tool's
// or the model's time.
func TestPageTimelineApprovals(t *testing.T) {
	proctest.AfterTest(t)
	base, id := serveFixture(t, serveDemo(t), "testdata/timeline/approvals.json")
	p := openPage(t, base)
	eval[string](p, `location.hash = `+strconv.Quote("#/turns/"+id))
	fig := `#turn-view figure.tl`
	p.waitFor("the stored turn's timeline", q(`#turn-view[data-state="ended"] figure.tl[data-state="ended"] .tl-row`))
	rows := p.timelineRows(fig)
	golden, err := os.ReadFile("testdata/timeline/approvals.txt")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(golden), "\n") - 2 - 2; n != len(rows) { // head, axis, 2 lines of legend
		p.fail("the page draws %d rows, the terminal %d: %+v", len(rows), n, rows)
	}
	p.sameAsTerminal(rows, strings.Split(string(golden), "\n"))
	words := map[string]string{}
	for _, r := range rows {
		words[r.Label] = r.Num
	}
	for label, want := range map[string]string{"deploy": "ok, approved by alice", "rollback": "denied by bob", "wipe": "approval expired"} {
		if !strings.HasSuffix(words[label], want) {
			p.fail("%s's row says %q, want it to end %q", label, words[label], want)
		}
	}
	if n := p.count(fig + ` .tl-wait`); n != 3 {
		p.fail("%d waits for a person, want 3", n)
	}
	// The wait ends where deploy's bar begins.
	wait := eval[float64](p, q(fig+` .tl-row[data-label="deploy"] .tl-wait`)+`.getBoundingClientRect().right`)
	for _, r := range rows {
		if r.Label == "deploy" && math.Abs(r.Left-wait) > 3 {
			p.fail("deploy's wait ends at %.0fpx, its bar begins at %.0fpx", wait, r.Left)
		}
	}
	if legend := p.text(fig + " .tl-legend"); !strings.Contains(legend, "waiting for a person") {
		p.fail("the legend reads %q", legend)
	}
}

// filter is m with only the keys of keep.
func filter(m, keep map[string]int) map[string]int {
	out := map[string]int{}
	for k := range keep {
		out[k] = m[k]
	}
	return out
}

// svgText reads the text of an SVG element (which has no innerText).
func (p *page) svgText(sel string) string {
	p.t.Helper()
	return eval[string](p, `(document.querySelector(`+strconv.Quote(sel)+`) || {textContent: ''}).textContent`)
}

// seedStats stores tool calls of the demo agent's tools in a new SQLite
// store at db, through the store's record writers: web_fetch's 60 calls
// of 40ms to 1s, 3 of them cut off at its 1s timeout, and 6 of 9s forty
// days ago; crawl's 25 calls of 3 to 6s reporting progress (its 10s
// timeout and 2s idle timeout); word_count's 4 calls (too few for a
// suggestion).
func seedStats(t *testing.T, db string) {
	t.Helper()
	st, err := sqlite.Open(db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	turn := func(id string, at time.Time, calls []event.ToolCall) {
		if err := st.BeginTurn(ctx, store.TurnStart{TurnID: id, Agent: "demo", Input: "stats", StartedAt: at}); err != nil {
			t.Fatal(err)
		}
		var seq int64
		emit := func(at time.Time, d event.Payload) {
			seq++
			if err := st.AppendEvent(ctx, event.Event{Seq: seq, TurnID: id, Type: d.Type(), At: at, Data: d}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range calls {
			tc := &calls[i]
			tc.CallID, tc.TurnID, tc.Kind, tc.Arguments = fmt.Sprintf("call_%d", i), id, "exec", json.RawMessage(`{}`)
			tc.StartedAt = at.Add(time.Duration(i) * 10 * time.Second)
			tc.EndedAt = tc.StartedAt.Add(time.Duration(tc.DurationMS) * time.Millisecond)
			emit(tc.StartedAt, &event.ToolStarted{CallID: tc.CallID, Tool: tc.Tool, Kind: tc.Kind, TimeoutMS: tc.TimeoutMS})
			for p := range tc.ProgressCount {
				emit(tc.StartedAt.Add(time.Duration(p+1)*time.Second), &event.ToolProgress{CallID: tc.CallID, Tool: tc.Tool})
			}
			emit(tc.EndedAt, &event.ToolFinished{ToolCall: *tc})
		}
		rec := &event.Turn{TurnID: id, Agent: "demo", Input: "stats", Status: budget.StatusCompleted, StopReason: budget.Answered,
			StartedAt: at, EndedAt: at.Add(time.Hour), ToolCalls: calls}
		if err := st.FinishTurn(ctx, rec, nil); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	var fetch, old, crawl, count []event.ToolCall
	for i := range 60 {
		// Most calls quick, a slow tail: 40ms and up, roughly log-normal.
		d := int64(40 * math.Pow(1.055, float64(i)))
		tc := event.ToolCall{Tool: "web_fetch", DurationMS: min(d, 1000), TimeoutMS: 1000, Outcome: event.OutcomeOK}
		if i >= 57 {
			tc.DurationMS, tc.Outcome, tc.Phase = 1000, event.OutcomeTimedOut, budget.PhaseTool
		}
		fetch = append(fetch, tc)
	}
	fetch = append(fetch, event.ToolCall{Tool: "web_fetch", DurationMS: 300, TimeoutMS: 1000, Outcome: event.OutcomeCancelled, Phase: budget.PhaseTurn})
	for range 6 {
		old = append(old, event.ToolCall{Tool: "web_fetch", DurationMS: 9000, TimeoutMS: 10000, Outcome: event.OutcomeOK})
	}
	for i := range 25 {
		d := int64(3000 + 120*i)
		crawl = append(crawl, event.ToolCall{Tool: "crawl", DurationMS: d, TimeoutMS: 10000, IdleTimeoutMS: 2000,
			Outcome: event.OutcomeOK, ProgressCount: int(d / 1000)})
	}
	for i := range 4 {
		count = append(count, event.ToolCall{Tool: "word_count", DurationMS: int64(5 + i), TimeoutMS: 5000, Outcome: event.OutcomeOK})
	}
	turn("t_fetch", now.Add(-3*time.Hour), fetch)
	turn("t_old", now.AddDate(0, 0, -40), old)
	turn("t_crawl", now.Add(-2*time.Hour), crawl)
	turn("t_count", now.Add(-time.Hour), count)
}

// TestPageStats: the Stats view draws a card per tool from GET /v1/stats:
// a bar per bucket of its histogram holding the calls the server counted,
// the timeout, idle timeout and suggested timeout as labelled lines, its
// outcomes; the since selector asks again. With TB_TEST_SCREENSHOT set,
// the view is saved beside it as stats-view.png.
func TestPageStats(t *testing.T) {
	proctest.AfterTest(t)
	db := filepath.Join(t.TempDir(), "timebox.db")
	seedStats(t, db)
	base := serveAgentAt(t, demoAgent, db)
	report := func(since string) map[string]server.ToolStats {
		resp, err := http.Get(base + "/v1/stats?since=" + since)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep server.StatsReport
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/stats: %d, %v", resp.StatusCode, err)
		}
		out := map[string]server.ToolStats{}
		for _, ts := range rep.Tools {
			out[ts.Tool.Tool] = ts
		}
		return out
	}
	week := report("7d")

	p := openPage(t, base)
	p.do("opening Stats", chromedp.Click(chromedp.CSS("#nav-stats")))
	p.waitFor("a card per tool", `document.querySelector('#stats-view').dataset.state === 'ready' && document.querySelectorAll('.stat-card').length === 3`)
	if !eval[bool](p, q("#nav-stats")+`.classList.contains('active')`) {
		p.fail("the Stats link is not marked as the view")
	}
	if got := eval[[]string](p, `[...document.querySelectorAll('.stat-card')].map((c) => c.dataset.tool)`); !slices.Equal(got, []string{"crawl", "web_fetch", "word_count"}) {
		p.fail("cards %q", got)
	}
	card := func(tool string) string { return `.stat-card[data-tool="` + tool + `"]` }
	for tool, want := range week {
		c := card(tool)
		bars := eval[[]int64](p, `[...document.querySelectorAll('`+c+` .hist-bar')].map((b) => +b.dataset.count)`)
		if !slices.Equal(bars, want.Histogram.Counts) {
			p.fail("%s: bars %v, the server counted %v", tool, bars, want.Histogram.Counts)
		}
		var sum int64
		for _, n := range bars {
			sum += n
		}
		if sum != want.Sample || len(bars) < 1 {
			p.fail("%s: the bars hold %d calls, the sample is %d", tool, sum, want.Sample)
		}
		label := func(kind string) string { return p.svgText(c + ` .hist-line[data-kind="` + kind + `"] text`) }
		if got := label("timeout"); got != "timeout "+advice.Format(time.Duration(want.TimeoutMS)*time.Millisecond) {
			p.fail("%s: the timeout line reads %q (timeout %dms)", tool, got, want.TimeoutMS)
		}
		if want.SuggestedTimeout != nil {
			if got := label("suggested"); got != "suggested "+*want.SuggestedTimeout {
				p.fail("%s: the suggestion line reads %q, want %s", tool, got, *want.SuggestedTimeout)
			}
		} else if n := p.count(c + ` .hist-line[data-kind="suggested"]`); n != 0 {
			p.fail("%s: a suggestion line without a suggestion", tool)
		}
		if got := p.text(c + ` [data-outcome="timed_out"] b`); got != strconv.FormatInt(want.TimedOut, 10) {
			p.fail("%s: timed out reads %q, want %d", tool, got, want.TimedOut)
		}
		if got := p.text(c + ` [data-figure="p95"] dd`); got == "" || got == "–" {
			p.fail("%s: p95 reads %q", tool, got)
		}
	}
	// The lines stand where their durations are on the log axis: the
	// timeout right of every bar, for a tool whose calls all fit in it.
	if right, line := eval[float64](p, `Math.max(...[...document.querySelectorAll('`+card("crawl")+` .hist-bar')].map((b) => +b.getAttribute('x') + +b.getAttribute('width')))`),
		eval[float64](p, `+`+q(card("crawl")+` .hist-line[data-kind="timeout"] line`)+`.getAttribute('x1')`); line <= right {
		p.fail("crawl: the 10s timeout line (x %.0f) is not right of its calls (up to x %.0f)", line, right)
	}
	if got := p.svgText(card("crawl") + ` .hist-line[data-kind="idle"] text`); got != "idle 2s" {
		p.fail("crawl: the idle timeout line reads %q", got)
	}
	if w := week["web_fetch"]; w.TimedOut != 3 || w.Cancelled != 1 || w.SuggestedTimeout == nil {
		t.Errorf("web_fetch's report: %+v", w.Tool)
	}
	if got := p.text(card("web_fetch") + ` [data-outcome="cancelled"] b`); got != "1" {
		p.fail("web_fetch: cancelled reads %q", got)
	}

	if shot := os.Getenv("TB_TEST_SCREENSHOT"); shot != "" { // docs/stats-view.png
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		if b, err := chromedp.Run(ctx, chromedp.ScreenshotScale(chromedp.CSS("#stats-view"), 1.5)); err == nil {
			_ = os.WriteFile(filepath.Join(filepath.Dir(shot), "stats-view.png"), b, 0o644)
		}
		cancel()
	}

	// All time counts the old calls too.
	all := report("all")["web_fetch"]
	p.do("choosing all time", chromedp.SetValue(chromedp.CSS("#stats-since"), "all"))
	eval[bool](p, q("#stats-since")+`.dispatchEvent(new Event('change'))`)
	p.waitFor("the report of all time", `document.querySelector('#stats-view').dataset.state === 'ready' && `+
		q(card("web_fetch")+` [data-figure="calls"] dd`)+`.textContent === `+strconv.Quote(strconv.FormatInt(all.Calls, 10)))
	if bars := p.count(card("web_fetch") + ` .hist-bar`); bars != len(all.Histogram.Counts) {
		p.fail("all time: %d bars, the server counted %d buckets", bars, len(all.Histogram.Counts))
	}
}

// TestPageWebhooks: the Webhooks view lists each delivery of the server's
// webhooks with its state and last attempt: one a receiver took, one whose
// receiver is down, pending its retry.
func TestPageWebhooks(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	defer up.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String() + "/hook"
	ln.Close() // nothing listens there: connection refused
	path := agentFile(t, `{"text": "hi"}`)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "server:\n  webhooks:\n    - {url: %s/up, events: [turn_finished], secret_env: HOOK_SECRET}\n    - {url: %s, events: [turn_finished], secret_env: HOOK_SECRET}\n", up.URL, down)
	f.Close()
	base := serveAgent(t, path, "HOOK_SECRET="+cliWhsec)
	postTurn(t, base, `{"input": "hi"}`)
	p := openPage(t, base)
	p.do("opening Webhooks", chromedp.Click(chromedp.CSS("#nav-webhooks")))
	p.waitFor("a delivered and a pending delivery", `(() => {
		const rows = [...document.querySelectorAll('#deliveries-table tbody tr')].map(r => r.innerText);
		const ok = rows.length === 2 && rows.some(r => r.includes('delivered') && r.includes('200')) &&
			rows.some(r => r.includes('pending') && r.includes('no answer') && r.includes('refused'));
		if (!ok) document.querySelector('#filter-delivery').dispatchEvent(new Event('change')); // read the list again
		return ok;
	})()`)
	if !eval[bool](p, q("#nav-webhooks")+`.classList.contains('active')`) {
		p.fail("the Webhooks link is not marked active")
	}
}
