package cli

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// The timeline of `timebox runs show ID --timeline`: a turn's model
// attempts and tool calls as bars on one time axis, each with its deadline,
// its outcome, its progress reports and the failovers between attempts.
// The page (server/web/timeline.js) draws the same picture by the same
// rules, written down in docs/decisions/timeline.md; keep the two in step.

// tlRow is one row of the timeline: a model attempt, a compaction, a tool
// call, or a failover between two attempts. Every call has a row of its
// own, so calls that ran at once are on separate rows.
type tlRow struct {
	kind   string // model, compaction, tool or failover
	label  string
	step   int
	callID string // a tool call's: its place in its batch
	start  time.Time
	// end is zero while the call runs.
	end time.Time
	// deadline is where the call's budget ran out: a tool's timeout, a
	// compaction's budget, a model attempt's first chunk until it came.
	// Zero: none.
	deadline time.Time
	outcome  string // an event.Outcome, running or refused
	overran  bool
	// late is when an abandoned call returned; zero when it did not
	// within the turn.
	late time.Time
	// lost are the stretches in which nothing was known of the call
	// because its worker was lost (Temporal): from the start of an
	// attempt lost and run again (retries:) to the start of the next,
	// and from a lost call's last heartbeat to when its loss was noticed.
	lost [][2]time.Time
	// retried: an attempt of the call was lost and run again;
	// workerLost: the call was lost with its worker (phase worker_lost).
	retried, workerLost bool
	// wait is the stretch in which the call waited for a person's
	// decision before it ran (approval: required), its end zero while it
	// waits; approval says how the wait ended: approved by alice,
	// denied by bob, approval expired.
	wait     [2]time.Time
	approval string
	ticks    []time.Time // progress reports (still_working notices: the page only)
	right    string      // the row's numbers and words, after its bar
}

// tlTurn is a turn's timeline: its rows on the axis from start to end.
type tlTurn struct {
	head       []string
	start, end time.Time
	rows       []tlRow
}

// tlStyle is how an outcome is drawn: its character, its colour on a
// terminal, and its word.
type tlStyle struct {
	ch    rune
	color string
	word  string
}

// tlOutcomes are the characters and colours of the outcomes (spec §7), the
// page's colours by another name.
var tlOutcomes = map[string]tlStyle{
	"ok":           {'=', green, "ok"},
	"running":      {'-', blue, "running"},
	"timed_out":    {'#', yellow, "timed out"},
	"cancelled":    {'~', dim, "cancelled"},
	"error":        {'x', red, "error"},
	"abandoned":    {'!', magenta, "abandoned"},
	"interrupted":  {'?', cyan, "interrupted"},
	"insufficient": {'%', yellow, "insufficient"},
	"refused":      {'/', red, "refused"},
	// A call waiting for a person: its row is its wait, drawn as the
	// mark of one (the legend names the mark).
	"waiting": {':', dim, "waiting for a person"},
}

const magenta = "\x1b[35m"

// The marks drawn over the bars, in the order the legend lists them.
var tlMarks = []struct {
	ch    rune
	color string
	what  string
}{
	{':', dim, "waiting for a person"},
	{'+', yellow, "past its budget, let run (advisory)"},
	{'.', dim, "abandoned, still running"},
	{'_', cyan, "worker lost, nothing known"},
	{'\'', "", "progress report"},
	{'|', bold, "deadline"},
	{'>', dim, "deadline after the end"},
	{'*', yellow, "failover"},
}

// buildTimeline lays out a turn's timeline from its record and its events:
// the calls from the record, what only events tell (progress reports,
// failovers, late results, calls still running) from the events. now ends
// the axis of a turn still running.
func buildTimeline(rec *event.Turn, evs []event.Event, now time.Time) tlTurn {
	tl := tlTurn{start: rec.StartedAt, end: rec.EndedAt}
	running := rec.Status == budget.StatusRunning
	if running || tl.end.IsZero() {
		tl.end = now
	}
	var firstChunk, compaction int64
	progress := map[string][]time.Time{}
	late := map[string]time.Time{}
	started := map[string]tlRow{}
	attempts := map[string][]time.Time{} // each tool_started of a call: more than one, it was run again
	var order []string                   // tool calls started or waiting for a person, in order
	asked := map[string]tlRow{}          // each call waiting for a person, from its first request
	decided := map[string]struct {
		at    time.Time
		words string
	}{}
	var llm, comp *tlRow
	var rows []tlRow
	for _, e := range evs {
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			if tl.start.IsZero() {
				tl.start = e.At
			}
			firstChunk, compaction = d.Budgets[budget.KeyLLMFirstChunk].MS, d.Budgets[budget.KeyCompaction].MS
		case *event.LLMStarted:
			llm = &tlRow{kind: "model", label: modelLabel(d.Model, d.Attempt), step: d.Step, start: e.At,
				deadline: after(e.At, firstChunk), outcome: "running"}
		case *event.LLMDelta:
			if llm != nil { // its first chunk came: the deadline is met
				llm.deadline = time.Time{}
			}
		case *event.LLMFinished:
			llm = nil
		case *event.CompactionStarted:
			comp = &tlRow{kind: "compaction", label: "compaction", step: d.Step, start: e.At, deadline: after(e.At, d.LimitMS), outcome: "running"}
		case *event.CompactionFinished:
			comp = nil
		case *event.ApprovalRequested:
			if _, again := asked[d.CallID]; !again { // a later round goes on the same wait
				asked[d.CallID] = tlRow{kind: "tool", label: d.Tool, step: d.Step, callID: d.CallID, start: e.At, outcome: "waiting"}
				order = append(order, d.CallID)
			}
		case *event.ApprovalDecided:
			if !d.Stale { // one too old to act on is asked again: the wait goes on
				decided[d.CallID] = struct {
					at    time.Time
					words string
				}{e.At, tlApproval(d.Decision, d.By)}
			}
		case *event.ToolStarted:
			if _, again := started[d.CallID]; !again {
				if _, waited := asked[d.CallID]; !waited {
					order = append(order, d.CallID)
				}
			}
			attempts[d.CallID] = append(attempts[d.CallID], e.At)
			r := tlRow{kind: "tool", label: d.Tool, step: d.Step, callID: d.CallID, start: e.At, deadline: d.Deadline, outcome: "running"}
			r.lostAttempts(attempts[d.CallID])
			started[d.CallID] = r
		case *event.ToolProgress:
			progress[d.CallID] = append(progress[d.CallID], e.At)
		case *event.LateResult:
			late[d.CallID] = e.At
		case *event.Failover:
			rows = append(rows, tlRow{kind: "failover", label: "failover", step: d.Step, start: e.At, end: e.At,
				outcome: "failover", right: fmt.Sprintf("→ %s (%s)", d.To, d.Phase)})
		}
	}
	for _, m := range rec.ModelCalls {
		r := tlRow{kind: "model", label: modelLabel(m.Model, m.Attempt), step: m.Step, start: m.StartedAt,
			end: m.StartedAt.Add(time.Duration(m.StreamMS) * time.Millisecond), outcome: string(m.Outcome)}
		if m.FirstChunkMS == 0 { // the first chunk's deadline is met once it comes
			r.deadline = after(m.StartedAt, firstChunk)
		}
		if m.Compaction {
			r.kind, r.label, r.deadline = "compaction", "compaction", after(m.StartedAt, compaction)
		}
		if llm != nil && !m.Compaction && m.Step == llm.step && r.label == llm.label {
			llm = nil
		}
		r.right = ms(m.StreamMS) + " " + tlWord(r)
		rows = append(rows, r)
	}
	recorded := map[string]bool{}
	for _, c := range rec.ToolCalls {
		recorded[c.CallID] = true
		r := tlRow{kind: "tool", label: c.Tool, step: c.Step, callID: c.CallID, start: c.StartedAt, end: c.EndedAt,
			deadline: after(c.StartedAt, c.TimeoutMS), outcome: string(c.Outcome), overran: c.Overran, ticks: progress[c.CallID]}
		if r.end.IsZero() {
			r.end = c.StartedAt.Add(time.Duration(c.DurationMS) * time.Millisecond)
		}
		if c.Refused != "" {
			r.outcome, r.deadline = "refused", time.Time{}
		}
		if c.Outcome == event.OutcomeAbandoned {
			r.late = late[c.CallID]
		}
		r.lostAttempts(attempts[c.CallID])
		if w, ok := asked[c.CallID]; ok || c.ApprovalMS > 0 {
			from := w.start
			if !ok { // its events are gone: the record says how long it waited
				from = c.StartedAt.Add(-time.Duration(c.ApprovalMS) * time.Millisecond)
			}
			r.wait = [2]time.Time{from, c.StartedAt}
			if dd, ok := decided[c.CallID]; ok && !dd.at.After(c.StartedAt) {
				r.wait[1] = dd.at
			}
			if c.Approval != nil {
				r.approval = tlApproval(c.Approval.Decision, c.Approval.By)
			}
		}
		if c.Phase == budget.PhaseWorkerLost {
			r.workerLost = true
			if c.NoticedAt.After(r.end) {
				r.lost = append(r.lost, [2]time.Time{r.end, c.NoticedAt})
			}
		}
		r.right = ms(c.DurationMS) + tlBudget(c.TimeoutMS) + " " + tlWord(r)
		if c.Refused != "" {
			r.right = "refused: " + c.Refused
			if r.approval != "" { // denied, expired: a person's decision, or none in time
				r.right = r.approval
			}
		}
		rows = append(rows, r)
	}
	// Calls started and not ended: running, or, in a turn that ended
	// without their end, ended with it.
	open := []*tlRow{llm, comp}
	for _, id := range order {
		if recorded[id] {
			continue
		}
		r, ok := started[id]
		if w, waited := asked[id]; waited {
			if !ok { // still waiting for a person
				r = w
			}
			r.wait = [2]time.Time{w.start, decided[id].at}
			r.approval = decided[id].words
		}
		r.ticks = progress[id]
		open = append(open, &r)
	}
	for _, r := range open {
		if r == nil {
			continue
		}
		if !running && r.outcome == "waiting" {
			// The turn ended while the call waited: it never started.
			r.wait[1], r.start = tl.end, tl.end
		}
		if !running {
			r.outcome, r.end = "cancelled", tl.end
		}
		r.right = ms(tl.end.Sub(r.start).Milliseconds()) + "…"
		if r.outcome == "waiting" {
			r.right += " " + tlWord(*r)
			rows = append(rows, *r)
			continue
		}
		if r.kind == "tool" && !r.deadline.IsZero() {
			r.right += tlBudget(r.deadline.Sub(r.start).Milliseconds())
		}
		r.right += " " + tlWord(*r)
		rows = append(rows, *r)
	}
	for _, r := range rows {
		for _, t := range []time.Time{r.end, r.late} {
			if t.After(tl.end) {
				tl.end = t
			}
		}
	}
	if !tl.end.After(tl.start) {
		tl.end = tl.start.Add(time.Millisecond)
	}
	sort.SliceStable(rows, func(i, j int) bool { return tlBefore(rows[i], rows[j]) })
	tl.rows = rows

	tl.head = []string{"turn " + rec.TurnID}
	if running {
		tl.head = append(tl.head, "· running for "+fmtElapsed(now.Sub(tl.start)))
	} else {
		tl.head = append(tl.head, fmt.Sprintf("· %s (%s) after %s", rec.Status, rec.StopReason, ms(rec.WallMS)))
	}
	return tl
}

// tlBefore orders rows by step; in a step the model's side first (a
// compaction, the attempts and the failovers between them, by time), then
// the tool calls in the order the model asked for them, which their ids
// count (call_1_2 before call_1_10).
func tlBefore(a, b tlRow) bool {
	if a.step != b.step {
		return a.step < b.step
	}
	if (a.kind == "tool") != (b.kind == "tool") {
		return b.kind == "tool"
	}
	if a.kind == "tool" {
		if len(a.callID) != len(b.callID) {
			return len(a.callID) < len(b.callID)
		}
		return a.callID < b.callID
	}
	return a.start.Before(b.start)
}

// lostAttempts notes the attempts of a call before its last (each
// tool_started of it, in order): each was lost with its worker and the
// call run again, so nothing is known of it from its start to the next's.
func (r *tlRow) lostAttempts(starts []time.Time) {
	for i := 1; i < len(starts); i++ {
		if starts[i].After(starts[i-1]) {
			r.lost = append(r.lost, [2]time.Time{starts[i-1], starts[i]})
		}
		r.retried = true
	}
}

func after(t time.Time, ms int64) time.Time {
	if ms <= 0 || t.IsZero() {
		return time.Time{}
	}
	return t.Add(time.Duration(ms) * time.Millisecond)
}

func modelLabel(model string, attempt int) string {
	if attempt > 1 {
		return fmt.Sprintf("model %s #%d", model, attempt)
	}
	return "model " + model
}

func tlBudget(ms int64) string {
	if ms <= 0 {
		return ""
	}
	return "/" + msDuration(ms)
}

// tlWord says how a row's call ended.
func tlWord(r tlRow) string {
	w := r.outcome
	if o, ok := tlOutcomes[r.outcome]; ok {
		w = o.word
	}
	if r.overran {
		w += ", overran"
	}
	if r.workerLost { // interrupted, as only a worker's loss is
		w = "worker lost"
	}
	if r.retried {
		w += ", run again"
	}
	if r.approval != "" {
		w += ", " + r.approval
	}
	return w
}

// tlApproval says how a call's wait for a person ended, and who ended it.
func tlApproval(d event.Decision, by string) string {
	var w string
	switch d {
	case event.Approve:
		w = "approved"
	case event.Deny:
		w = "denied"
	case event.Expired:
		return "approval expired"
	default:
		return ""
	}
	if by != "" {
		w += " by " + by
	}
	return w
}

// tlCell is one column of a row's bar.
type tlCell struct {
	ch    rune
	color string
}

// write draws the timeline width columns wide, in colour when color.
func (tl tlTurn) write(w io.Writer, width int, color bool) {
	labelW, rightW := 5, 0
	for _, r := range tl.rows {
		labelW = max(labelW, min(utf8Len(r.label), 18))
		// Who decided on a call, or that it waits for a person, is worth
		// a few of the bar's columns.
		capW := 24
		if r.approval != "" || r.outcome == "waiting" {
			capW = 32
		}
		rightW = max(rightW, min(utf8Len(r.right), capW))
	}
	cols := max(width-labelW-rightW-2, 10)
	rightW = max(width-labelW-cols-2, 1) // longer words are cut
	span := tl.end.Sub(tl.start)
	pos := func(t time.Time) float64 { return float64(t.Sub(tl.start)) / float64(span) * float64(cols) }
	col := func(t time.Time) int { return min(max(int(math.Floor(pos(t))), 0), cols-1) }
	paint := func(s string, code string) string {
		if !color || code == "" {
			return s
		}
		return code + s + reset
	}

	fmt.Fprintln(w, wrapLegend(tl.head, " ", width))
	// The axis: a label at each step of a round size, where it fits.
	axis := []rune(strings.Repeat(" ", cols+8))
	next := 0
	step := axisStep(span.Milliseconds(), max(cols/8, 2))
	for t := int64(0); t <= span.Milliseconds(); t += step {
		c := col(tl.start.Add(time.Duration(t) * time.Millisecond))
		label := axisLabel(t)
		if c < next || c+len(label) > len(axis) {
			continue
		}
		copy(axis[c:], []rune(label))
		next = c + len(label) + 1
	}
	fmt.Fprintf(w, "%s %s\n", strings.Repeat(" ", labelW), strings.TrimRight(string(axis), " "))

	used := map[rune]bool{}
	for _, r := range tl.rows {
		cells := make([]tlCell, cols)
		for i := range cells {
			cells[i] = tlCell{' ', ""}
		}
		set := func(c int, ch rune, code string) {
			cells[c] = tlCell{ch, code}
			used[ch] = true
		}
		from := col(r.start)
		if r.kind == "failover" {
			set(from, '*', yellow)
		} else {
			o, ok := tlOutcomes[r.outcome]
			if !ok { // an outcome this version does not know
				o = tlStyle{'=', "", r.outcome}
			}
			end := r.end
			if end.IsZero() {
				end = tl.end
			}
			to := max(from, min(int(math.Ceil(pos(end)))-1, cols-1))
			if w := r.wait; !w[0].IsZero() && r.outcome != "waiting" {
				// The wait for a person, up to the column the call began in.
				for c := col(w[0]); c < from && (w[1].IsZero() || c <= col(w[1])); c++ {
					set(c, ':', dim)
				}
			}
			for c := from; c <= to; c++ {
				set(c, o.ch, o.color)
			}
			if r.overran && !r.deadline.IsZero() && r.deadline.Before(end) {
				for c := col(r.deadline); c <= to; c++ {
					set(c, '+', yellow)
				}
			}
			for _, l := range r.lost {
				for c := col(l[0]); c <= min(col(l[1]), cols-1); c++ {
					if c < from || c > to {
						set(c, '_', cyan)
					}
				}
			}
			if r.outcome == "abandoned" {
				tail := r.late
				if tail.IsZero() {
					tail = tl.end
				}
				for c := to + 1; c <= col(tail); c++ {
					set(c, '.', dim)
				}
			}
			for _, t := range r.ticks {
				if c := col(t); c >= from && c <= to {
					set(c, '\'', cells[c].color)
				}
			}
			switch {
			case r.deadline.IsZero():
			case r.deadline.After(tl.end):
				set(cols-1, '>', dim)
			default:
				set(col(r.deadline), '|', bold)
			}
		}
		var bar strings.Builder
		for i := 0; i < cols; {
			j := i
			for j < cols && cells[j].color == cells[i].color {
				j++
			}
			run := make([]rune, 0, j-i)
			for _, c := range cells[i:j] {
				run = append(run, c.ch)
			}
			bar.WriteString(paint(string(run), cells[i].color))
			i = j
		}
		label := clip(r.label, labelW)
		fmt.Fprintf(w, "%s%s %s %s\n", label, strings.Repeat(" ", labelW-utf8Len(label)), bar.String(), clip(r.right, rightW))
	}

	// The legend: what each character drawn means.
	var legend []string
	for _, k := range []string{"ok", "running", "timed_out", "cancelled", "error", "abandoned", "interrupted", "insufficient", "refused"} {
		if o := tlOutcomes[k]; used[o.ch] {
			legend = append(legend, paint(string(o.ch), o.color)+" "+o.word)
		}
	}
	for _, m := range tlMarks {
		if used[m.ch] {
			legend = append(legend, paint(string(m.ch), m.color)+" "+m.what)
		}
	}
	fmt.Fprintln(w, wrapLegend(legend, "   ", width))
}

// wrapLegend joins items with sep into lines of at most width columns
// (escape codes do not count).
func wrapLegend(items []string, sep string, width int) string {
	var b strings.Builder
	n := 0
	for _, it := range items {
		l := utf8Len(stripANSI(it))
		if n > 0 && n+len(sep)+l > width {
			b.WriteString("\n")
			n = 0
		}
		if n > 0 {
			b.WriteString(sep)
			n += len(sep)
		}
		b.WriteString(it)
		n += l
	}
	return b.String()
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b {
			for i < len(s) && s[i] != 'm' {
				i++
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func utf8Len(s string) int { return len([]rune(s)) }

// axisSteps are the round sizes the axis is labelled by.
var axisSteps = []int64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000,
	60000, 120000, 300000, 600000, 900000, 1800000, 3600000, 7200000, 10800000, 21600000, 43200000, 86400000}

// axisStep returns the smallest round size that labels span ms with at
// most n labels after 0.
func axisStep(span int64, n int) int64 {
	for _, s := range axisSteps {
		if span/s <= int64(n) {
			return s
		}
	}
	return axisSteps[len(axisSteps)-1] * (span/axisSteps[len(axisSteps)-1]/int64(n) + 1)
}

// axisLabel writes a time on the axis: 0s, 500ms, 1.5s, 2m, 1m30s, 1h30m.
func axisLabel(ms int64) string {
	switch {
	case ms == 0:
		return "0s"
	case ms < 1000:
		return strconv.FormatInt(ms, 10) + "ms"
	case ms < 60000:
		return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64) + "s"
	}
	h, m, s := ms/3600000, ms%3600000/60000, ms%60000/1000
	var b strings.Builder
	for _, p := range []struct {
		n    int64
		unit string
	}{{h, "h"}, {m, "m"}, {s, "s"}} {
		if p.n > 0 {
			b.WriteString(strconv.FormatInt(p.n, 10) + p.unit)
		}
	}
	return b.String()
}

// timelineWidth is how wide the timeline is drawn: the terminal's width,
// else COLUMNS, on a terminal; 80 columns elsewhere.
func timelineWidth(o IO) int {
	if !o.Terminal {
		return 80
	}
	if f, ok := o.Out.(*os.File); ok {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 {
			return max(w, 40)
		}
	}
	if n, err := strconv.Atoi(o.getenv("COLUMNS")); err == nil && n > 0 {
		return max(n, 40)
	}
	return 80
}

// timeline prints a stored turn's timeline, to the terminal's width and in
// colour on a terminal (unless NO_COLOR is set).
func (r runsStore) timeline(ctx context.Context, id string, o IO) int {
	rec, err := r.st.Turn(ctx, id)
	if err != nil {
		return r.notFound(err, id, o)
	}
	evs, err := r.st.Events(ctx, id, 0, 0)
	if err != nil {
		return r.notFound(err, id, o)
	}
	tl := buildTimeline(rec, evs, time.Now())
	tl.write(termSafe{o.Out}, timelineWidth(o), o.Terminal && o.getenv("NO_COLOR") == "")
	return ExitOK
}
