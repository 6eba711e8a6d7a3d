package cli_test

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/proctest"
)

// TestRunsShowTimeline runs the demo and draws its stored turn with `runs
// show --timeline`: a row for each model attempt and each tool call in the
// order the model asked for them, each bar with its outcome's character,
// the deadlines that fell inside the turn, crawl's progress reports, the
// axis, 80 columns wide and without colour on a pipe.
func TestRunsShowTimeline(t *testing.T) {
	proctest.AfterTest(t)
	db := filepath.Join(t.TempDir(), "timebox.db")
	if r := run(t, nil, "run", "-f", demo, "--db", db, "Tour the budgets"); r.code != 0 {
		t.Fatalf("run: exit %d\n%s", r.code, r.err)
	}
	list := run(t, nil, "runs", "list", "--db", db)
	id := regexp.MustCompile(`t_[A-Z2-7]{26}`).FindString(list.out)
	if id == "" {
		t.Fatalf("no turn in runs list:\n%s", list.out)
	}
	r := run(t, []string{"COLUMNS=200"}, "runs", "show", id, "--timeline", "--db", db)
	if r.code != 0 {
		t.Fatalf("runs show --timeline: exit %d\n%s", r.code, r.err)
	}
	lines := strings.Split(strings.TrimSuffix(r.out, "\n"), "\n")
	if len(lines) < 9 || !strings.HasPrefix(lines[0], "turn "+id+" · completed (answered) after ") {
		t.Fatalf("the timeline reads:\n%s", r.out)
	}
	if !regexp.MustCompile(`^ +0s +1s +2s +3s +4s`).MatchString(lines[1]) {
		t.Errorf("the axis reads %q", lines[1])
	}
	for i, want := range []struct {
		label, bar, words string
	}{
		{"model demo", `=+`, " ok"},
		{"word_count", `=+ +>`, "/5s ok"},
		{"crawl", `=*'[='|]*'[=']* +>`, "/10s ok"},
		{"web_fetch", `#+\|#?`, "/1s timed out"},
		{"legacy_sync", `#+\|#+`, "/1s timed out"},
		{"report", `=+\|\++`, "/1s ok, overran"},
		{"model demo", `=+`, " ok"},
	} {
		line := lines[2+i]
		re := regexp.MustCompile(`^` + regexp.QuoteMeta(want.label) + ` +` + want.bar + ` +\S+` + regexp.QuoteMeta(want.words) + `$`)
		if !re.MatchString(line) {
			t.Errorf("row %d reads %q, want %s", i+1, line, re)
		}
		if n := len([]rune(line)); n > 80 {
			t.Errorf("row %d is %d columns wide, over 80", i+1, n)
		}
	}
	if strings.Contains(r.out, "\x1b[") {
		t.Errorf("colour on a pipe:\n%s", r.out)
	}
	if !strings.Contains(r.out, "| deadline") || !strings.Contains(r.out, "' progress report") {
		t.Errorf("the legend does not name the deadline and progress marks:\n%s", r.out)
	}

	if r := run(t, nil, "runs", "show", id, "--timeline", "--json", "--db", db); r.code != 2 || !strings.Contains(r.err, "choose one") {
		t.Errorf("--timeline --json: exit %d, %q", r.code, r.err)
	}
}
