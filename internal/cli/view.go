package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// view renders a turn's events for a person. On a terminal it keeps a live
// block at the bottom — one line per running call with its elapsed timer
// and progress bar — redrawn every tick, and prints finished things above
// it. Elsewhere it prints plain lines, one per thing that happened.
type view struct {
	// w is raw, the terminal, through termSafe: what the view prints
	// holds text from tools, models and people.
	w, raw io.Writer
	live   bool
	color  bool
	now    func() time.Time
	// told names who gets a stopped call's result: the model in a turn,
	// the caller of `timebox tool call`.
	told string

	mu      sync.Mutex
	running map[string]*chip // by call_id, or "model"
	order   []string
	drawn   int // lines of the live block on screen
	// text is the model's reply so far, its deltas' own strings (joined
	// once, at its end: a builder would hold another copy of a long
	// reply, issue 29); recent its last few KiB, for the preview.
	text     model.Text
	recent   []byte
	spin     int
	finished bool
	// held keeps the live block off the screen while a question is asked
	// (prompter).
	held bool

	quit chan struct{}
	done chan struct{}
}

// chip is one running call in the live block.
type chip struct {
	key      string
	label    string
	started  time.Time
	limit    time.Duration
	progress *float64
	total    *float64
	message  string
	isModel  bool
	preview  string
	advisory bool
}

func newView(w io.Writer, live, color bool) *view {
	v := &view{w: termSafe{w}, raw: w, live: live, color: color, now: time.Now, told: "the model", running: map[string]*chip{}}
	if live {
		v.quit, v.done = make(chan struct{}), make(chan struct{})
		go v.tick()
	}
	return v
}

func (v *view) tick() {
	defer close(v.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			v.mu.Lock()
			v.spin++
			v.redraw()
			v.mu.Unlock()
		case <-v.quit:
			return
		}
	}
}

// close stops the redraw ticker and clears the live block.
func (v *view) close() {
	if !v.live {
		return
	}
	close(v.quit)
	<-v.done
	v.mu.Lock()
	v.clear()
	v.mu.Unlock()
}

const (
	reset  = "\x1b[0m"
	bold   = "\x1b[1m"
	dim    = "\x1b[2m"
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	blue   = "\x1b[34m"
	cyan   = "\x1b[36m"
)

func (v *view) c(code, s string) string {
	if !v.color {
		return s
	}
	return code + s + reset
}

// Emit renders one event.
func (v *view) Emit(e event.Event) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch d := e.Data.(type) {
	case *event.TurnStarted:
		b := d.Budgets
		v.println(v.c(dim, fmt.Sprintf("turn %s · model %s · budgets: tool %s, step %s, turn %s, llm_idle %s",
			e.TurnID, d.Model, budgetText(b[budget.KeyTool]), budgetText(b[budget.KeyStep]), budgetText(b[budget.KeyTurn]),
			budgetText(b[budget.KeyLLMIdle]))))
	case *event.LLMStarted:
		v.add(&chip{key: "model", label: fmt.Sprintf("model %s", d.Model), started: e.At, isModel: true})
		if !v.live {
			v.println(fmt.Sprintf("%s model %s (attempt %d) thinking…", v.c(blue, "◆"), d.Model, d.Attempt))
		}
	case *event.LLMDelta:
		v.text.Add(d.Text)
		v.recent = append(v.recent, tail(d.Text, 4<<10)...)
		if len(v.recent) > 8<<10 {
			v.recent = append(v.recent[:0], tail(string(v.recent), 4<<10)...)
		}
		if c := v.running["model"]; c != nil {
			// From the end of the reply only: a preview that looked at the
			// whole reply would cost more with every delta of a long one.
			c.preview = lastLine(tail(string(v.recent), 4<<10), 60)
		}
	case *event.LLMFinished:
		v.remove("model")
		// The text is joined only to be printed: before tool calls. An
		// answer is printed once, by turn_finished (issue 29).
		var txt string
		if d.Outcome == event.OutcomeOK && d.ToolCalls > 0 {
			txt = strings.TrimSpace(v.text.String())
		}
		v.text, v.recent = model.Text{}, v.recent[:0]
		switch {
		case d.Outcome != event.OutcomeOK:
			v.println(fmt.Sprintf("%s model %s %s after %s: %s", v.c(red, "✗"), d.Model, d.Outcome, ms(d.StreamMS), d.Error))
		case d.ToolCalls > 0 && txt != "":
			v.println(fmt.Sprintf("%s %s", v.c(blue, "◆"), txt))
		case d.ToolCalls > 0:
			v.println(fmt.Sprintf("%s model %s asked for %d tool call%s (%s)", v.c(blue, "◆"), d.Model, d.ToolCalls, plural(d.ToolCalls), ms(d.StreamMS)))
		}
	case *event.Failover:
		v.println(fmt.Sprintf("%s failover: %s → %s (%s)", v.c(yellow, "↪"), d.From, d.To, d.Phase))
	case *event.ToolStarted:
		v.add(&chip{key: d.CallID, label: d.Tool, started: e.At, limit: time.Duration(d.TimeoutMS) * time.Millisecond,
			advisory: d.Enforcement == "advisory"})
		if !v.live {
			v.println(fmt.Sprintf("%s %s started (timeout %s from %s, %s)", v.c(cyan, "▸"), d.Tool,
				msDuration(d.TimeoutMS), d.Source, d.Enforcement))
		}
	case *event.ToolProgress:
		if c := v.running[d.CallID]; c != nil {
			c.progress, c.total, c.message = d.Progress, d.Total, d.Message
		}
		if !v.live {
			v.println(fmt.Sprintf("  %s %s %s %s", v.c(dim, "·"), d.Tool, progressText(d.Progress, d.Total), d.Message))
		}
	case *event.StillWorking:
		if d.Waiting != "" {
			v.println(v.c(yellow, "…") + " waiting: " + d.Waiting)
			break
		}
		v.println(v.c(yellow, "…") + " still working: " + stillWorkingText(d))
	case *event.ToolFinished:
		v.remove(d.CallID)
		v.println(v.finishedLine(&d.ToolCall))
	case *event.ApprovalRequested:
		v.println(fmt.Sprintf("%s %s waits for a decision: %s (%s, until %s)", v.c(yellow, "?"), d.Tool, tail(string(d.Arguments), 200),
			msDuration(d.TimeoutMS), d.ExpiresAt.Local().Format(time.DateTime)))
	case *event.ApprovalDecided:
		v.println(v.decidedLine(d))
	case *event.LateResult:
		v.println(fmt.Sprintf("%s %s returned late, after %s; recorded, not given to the model", v.c(dim, "↩"), d.Tool, ms(d.DurationMS)))
	case *event.CompactionStarted:
		v.println(fmt.Sprintf("%s compacting history (~%d tokens)", v.c(dim, "⇣"), d.EstimatedTokens))
	case *event.CompactionFinished:
		v.println(fmt.Sprintf("%s compaction %s in %s", v.c(dim, "⇣"), d.Outcome, ms(d.DurationMS)))
	case *event.TurnFinished:
		v.finished = true
		v.clear()
		v.println("")
		head, answer := v.banner(d)
		io.WriteString(v.w, head)
		writePieces(v.w, answer)
		io.WriteString(v.w, "\n")
	}
	v.redraw()
}

// ShareReply implements event.ReplySharer. The view keeps a model call's
// text until the call ends, to print it before the tool calls it asks for;
// once the reply is joined, the text it keeps becomes pieces of the joined
// reply, so that the chunks it was can go. Before, a long reply's chunks
// stayed live past the turn's collection after the join, and `timebox run`
// held the reply twice to its end (issue 29).
func (v *view) ShareReply(deltas []event.Event) {
	var t model.Text
	for _, e := range deltas {
		if d, ok := e.Data.(*event.LLMDelta); ok {
			t.Add(d.Text)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if t.Len() == v.text.Len() {
		v.text = t
	}
}

// decidedLine says how a call's wait for a person ended.
func (v *view) decidedLine(d *event.ApprovalDecided) string {
	by := ""
	if d.By != "" {
		by = " by " + d.By
	}
	reason := ""
	if d.Reason != "" {
		reason = ": " + d.Reason
	}
	switch {
	case d.Stale:
		return fmt.Sprintf("%s %s: the approval%s is too old to act on; asking again", v.c(yellow, "?"), d.Tool, by)
	case d.Decision == event.Approve:
		return fmt.Sprintf("%s %s approved%s after %s%s", v.c(green, "✓"), d.Tool, by, ms(d.WaitedMS), reason)
	case d.Decision == event.Deny:
		return fmt.Sprintf("%s %s denied%s after %s%s; not run", v.c(red, "✗"), d.Tool, by, ms(d.WaitedMS), reason)
	}
	return fmt.Sprintf("%s %s: no decision within %s; not run", v.c(red, "✗"), d.Tool, ms(d.WaitedMS))
}

// stillWorkingText says what a still_working notice names: each silent
// call and how long it has run, and how long none of them has reported
// progress — "legacy_sync 2.0s, report 2.0s (no progress for 2.0s)". A
// notice stored before notices named their calls reads as it did then.
func stillWorkingText(d *event.StillWorking) string {
	if len(d.Calls) == 0 {
		return fmt.Sprintf("%s, %s so far", d.Subject, ms(d.ElapsedMS))
	}
	parts := make([]string, 0, len(d.Calls))
	silent := d.Calls[0].SilentMS
	for _, c := range d.Calls {
		name := c.Tool
		if name == "" {
			name = c.Subject
		}
		parts = append(parts, name+" "+ms(c.ElapsedMS))
		silent = min(silent, c.SilentMS)
	}
	return strings.Join(parts, ", ") + " (no progress for " + ms(silent) + ")"
}

func (v *view) finishedLine(r *event.ToolCall) string {
	took := fmt.Sprintf("%s / %s", ms(r.DurationMS), msDuration(r.TimeoutMS))
	name := fmt.Sprintf("%-14s", r.Tool)
	extra := ""
	if r.ProgressCount > 0 {
		extra = fmt.Sprintf(", %d progress report%s", r.ProgressCount, plural(r.ProgressCount))
	}
	switch r.Outcome {
	case event.OutcomeOK:
		if r.Overran {
			return fmt.Sprintf("%s %s %s  overran its budget (advisory): result used%s", v.c(yellow, "⚠"), name, took, extra)
		}
		s := fmt.Sprintf("%s %s %s  ok%s", v.c(green, "✓"), name, took, extra)
		if r.Truncated {
			s += ", output truncated"
		}
		return s
	case event.OutcomeTimedOut:
		what := "timed out"
		if r.Phase == budget.PhaseToolIdle {
			what = fmt.Sprintf("went silent past its idle limit (%s)", msDuration(r.IdleTimeoutMS))
		}
		return fmt.Sprintf("%s %s %s  %s: stopped, %s was told%s", v.c(red, "⏱"), name, took, what, v.told, extra)
	case event.OutcomeAbandoned:
		return fmt.Sprintf("%s %s %s  timed out and would not stop: abandoned%s", v.c(red, "⏱"), name, took, extra)
	case event.OutcomeCancelled:
		return fmt.Sprintf("%s %s %s  stopped (%s)", v.c(yellow, "⊘"), name, took, r.Phase)
	case event.OutcomeInterrupted:
		return fmt.Sprintf("%s %s at least %s  interrupted: timebox stopped before it ended", v.c(yellow, "⊘"), name, took)
	case event.OutcomeDenied:
		// Not an error of the tool's, and it never ran: no time against
		// its timeout to show.
		return fmt.Sprintf("%s %s not run: denied, %s was told", v.c(red, "✗"), name, v.told)
	case event.OutcomeApprovalExpired:
		return fmt.Sprintf("%s %s not run: nobody decided within %s (its approval_timeout), %s was told", v.c(red, "✗"), name, ms(r.ApprovalMS), v.told)
	}
	reason := firstLine(errorMessage(r.Result))
	return fmt.Sprintf("%s %s %s  error: %s", v.c(red, "✗"), name, took, reason)
}

func (v *view) banner(d *event.TurnFinished) (head, answer string) {
	took := ms(d.Totals.WallMS)
	switch d.Status {
	case budget.StatusCompleted:
		refused := ""
		if n := d.Totals.ToolCallsRefused; n > 0 {
			refused = fmt.Sprintf(" (%d more refused)", n)
		}
		// The answer comes apart, to be written as it is: fmt, or a
		// string added to it, would hold more copies of a long one
		// (issue 29).
		return fmt.Sprintf("%s in %s · %d step%s · %d tool call%s%s\n\n", v.c(green+bold, "✔ answered"), took,
			d.Totals.Steps, plural(d.Totals.Steps), d.Totals.ToolCalls, plural(d.Totals.ToolCalls), refused), d.Answer
	case budget.StatusCancelled:
		return fmt.Sprintf("%s (%s)\n%s", v.c(yellow+bold, "⊘ cancelled"), d.StopReason, d.Message), ""
	case budget.StatusFailed:
		return fmt.Sprintf("%s (%s)\n%s", v.c(red+bold, "✗ failed"), d.StopReason, d.Message), ""
	}
	s := fmt.Sprintf("%s (%s)\n%s", v.c(red+bold, "■ stopped"), d.StopReason, d.Message)
	if d.Answer != "" {
		s += "\n\nPartial answer: " + partialShown(d.Answer)
	}
	return s, ""
}

// writePieces writes s to w through a buffer of 32 KiB: w (the turn's
// goneWriter) takes bytes, and s converted whole would be a copy of a long
// answer.
func writePieces(w io.Writer, s string) {
	buf := make([]byte, min(len(s), 32<<10))
	for len(s) > 0 {
		n := copy(buf, s)
		for n > 1 && n < len(s) && !utf8.RuneStart(s[n]) {
			n-- // whole characters: termSafe reads each piece alone
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return
		}
		s = s[n:]
	}
}

// maxPartialShown is how much of a stopped turn's partial answer the view
// prints; a reply cut at limits.max_reply can be a megabyte of text.
const maxPartialShown = 4 << 10

// partialShown returns the partial answer as the view prints it: whole when
// short, else its beginning and how much more there is (--json and the
// stored record have it whole).
func partialShown(a string) string {
	if len(a) <= maxPartialShown {
		return a
	}
	head := strings.ToValidUTF8(a[:maxPartialShown], "")
	return fmt.Sprintf("%s… (%s more; --json or timebox runs show prints it whole)", head, budget.FormatBytes(int64(len(a)-len(head))))
}

func (v *view) add(c *chip) {
	if _, ok := v.running[c.key]; !ok {
		v.order = append(v.order, c.key)
	}
	v.running[c.key] = c
}

func (v *view) remove(key string) {
	delete(v.running, key)
	for i, k := range v.order {
		if k == key {
			v.order = append(v.order[:i], v.order[i+1:]...)
			break
		}
	}
}

// println prints a permanent line above the live block.
func (v *view) println(s string) {
	v.clear()
	fmt.Fprintln(v.w, s)
}

// clear erases the live block.
func (v *view) clear() {
	if !v.live || v.drawn == 0 {
		return
	}
	fmt.Fprintf(v.raw, "\x1b[%dA\x1b[J", v.drawn)
	v.drawn = 0
}

var spinner = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

// hold takes the live block off the screen (on), for a question, or puts
// it back.
func (v *view) hold(on bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clear()
	v.held = on
	v.redraw()
}

// redraw draws the live block: one line per running call.
func (v *view) redraw() {
	if !v.live || v.finished || v.held {
		return
	}
	v.clear()
	keys := append([]string(nil), v.order...)
	sort.SliceStable(keys, func(i, j int) bool { return v.running[keys[i]].started.Before(v.running[keys[j]].started) })
	now := v.now()
	for _, k := range keys {
		c := v.running[k]
		el := now.Sub(c.started)
		line := fmt.Sprintf("%s %-14s %6s", v.c(cyan, spinner[v.spin%len(spinner)]), c.label, fmtElapsed(el))
		if c.limit > 0 {
			line += v.c(dim, " / "+c.limit.String())
			if el > c.limit {
				if c.advisory {
					line += v.c(yellow, " over budget (advisory: left to finish)")
				} else {
					line += v.c(red, " timed out: stopping")
				}
			}
		}
		if c.isModel {
			if c.preview != "" {
				line += "  " + v.c(dim, c.preview)
			} else {
				line += "  " + v.c(dim, "waiting for the first chunk")
			}
		}
		if c.progress != nil || c.message != "" {
			// One line a call: the block is erased by its line count.
			line += "  " + bar(c.progress, c.total, 20) + " " + strings.ReplaceAll(c.message, "\n", " ")
		}
		fmt.Fprintln(v.w, line)
		v.drawn++
	}
}

func bar(p, total *float64, width int) string {
	if p == nil {
		return ""
	}
	if total == nil || *total <= 0 {
		return fmt.Sprintf("[%g]", *p)
	}
	f := min(max(*p / *total, 0), 1)
	n := int(f * float64(width))
	return "[" + strings.Repeat("█", n) + strings.Repeat("░", width-n) + fmt.Sprintf("] %g/%g", *p, *total)
}

func progressText(p, total *float64) string {
	switch {
	case p != nil && total != nil:
		return fmt.Sprintf("%g/%g", *p, *total)
	case p != nil:
		return fmt.Sprintf("%g", *p)
	}
	return ""
}

func fmtElapsed(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}

func ms(n int64) string {
	d := time.Duration(n) * time.Millisecond
	if d < time.Second {
		return d.String()
	}
	return fmtElapsed(d)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func lastLine(s string, n int) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	r := []rune(s)
	if len(r) > n {
		return "…" + string(r[len(r)-n:])
	}
	return s
}

// tail returns about the last n bytes of s, starting at a character.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for i := 0; i < len(s) && i < utf8.UTFMax; i++ {
		if utf8.RuneStart(s[i]) {
			return s[i:]
		}
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// msDuration renders a budget in milliseconds as the agent file and
// `timebox validate` write it: "60s", "2m", "1.5s".
func msDuration(n int64) string {
	if n <= 0 {
		return "off"
	}
	return budget.FormatDuration(time.Duration(n) * time.Millisecond)
}

// budgetText renders one of turn_started's budgets as validate does.
func budgetText(b event.BudgetValue) string { return msDuration(b.MS) }
