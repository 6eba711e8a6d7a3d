package exectool

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/timebox-run/timebox/tool"
)

// reports collects progress reports.
type reports []tool.Report

func (r *reports) Report(x tool.Report) { *r = append(*r, x) }

// FuzzStderr feeds arbitrary stderr output, cut into arbitrary writes, to
// the splitter of progress lines and log. How the bytes arrive must not
// matter (the same reports and log tail as one write); every complete line
// of maxLine bytes or less that starts with ::progress:: is one report and
// no other line is; messages, the tail and the last line are valid UTF-8
// within their bounds; a report read from JSON prints back to the same
// report. The corpus is testdata/fuzz/FuzzStderr.
func FuzzStderr(f *testing.F) {
	f.Add([]byte("starting\n::progress:: {\"progress\": 3, \"total\": 10, \"message\": \"page 3\"}\nlog\n::progress::\n"), uint16(7))
	f.Add([]byte("::progress:: {\"progress\": \"x\"}\r\n::progress:: plain text\n::progress::{}\n"), uint16(1))
	f.Add([]byte("\xff\xfe::progress:: \xff\n"+string(bytes.Repeat([]byte("a"), maxLine+3))+"\n::progress:: 1\n"), uint16(4096))
	f.Add([]byte("no newline at the end ::progress::"), uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		var whole, pieces reports
		a := &stderrLog{progress: &whole}
		a.write(data)
		a.drain(bytes.NewReader(nil))
		b := &stderrLog{progress: &pieces}
		step := int(cut)%64 + 1
		for rest := data; len(rest) > 0; {
			n := min(step, len(rest))
			b.write(rest[:n])
			rest = rest[n:]
			step = step*7%61 + 1
		}
		b.drain(bytes.NewReader(nil))
		if !reflect.DeepEqual(whole, pieces) || a.tail() != b.tail() || a.lastLine() != b.lastLine() {
			t.Fatalf("the result depends on how the bytes arrived:\n%+v / %q / %q\n%+v / %q / %q",
				whole, a.tail(), a.lastLine(), pieces, b.tail(), b.lastLine())
		}
		if want := progressLines(data); len(whole) != want {
			t.Fatalf("%d reports for %d progress lines", len(whole), want)
		}
		for _, r := range whole {
			if !utf8.ValidString(r.Message) {
				t.Fatalf("message is not UTF-8: %q", r.Message)
			}
			j, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("report does not print: %v", err)
			}
			var back tool.Report
			if err := json.Unmarshal(j, &back); err != nil || !reflect.DeepEqual(back, r) {
				t.Fatalf("report %s reads back as %+v (%v)", j, back, err)
			}
		}
		if tail := a.tail(); len(tail) > tailSize*3 || !utf8.ValidString(tail) {
			t.Fatalf("tail of %d bytes, UTF-8 %v", len(tail), utf8.ValidString(tail))
		}
		if last := a.lastLine(); len(last) > maxLastLine+len("…")+3 || !utf8.ValidString(last) {
			t.Fatalf("last line of %d bytes, UTF-8 %v", len(last), utf8.ValidString(last))
		}
	})
}

// progressLines counts the lines of data that are progress reports: lines
// of at most maxLine bytes (the last one may lack its newline) that start
// with the prefix.
func progressLines(data []byte) int {
	n := 0
	for len(data) > 0 {
		line, rest, found := bytes.Cut(data, []byte("\n"))
		if len(line) <= maxLine && bytes.HasPrefix(line, []byte(progressPrefix)) {
			n++
		}
		if !found {
			break
		}
		data = rest
	}
	return n
}
