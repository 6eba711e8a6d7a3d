package exectool

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/timebox-run/timebox/tool"
)

// progressPrefix starts a stderr line that is a progress report (spec §4).
const progressPrefix = "::progress::"

const (
	// tailSize is how much of the log a result keeps: the end, where a
	// failing program says why.
	tailSize = 4 << 10
	// maxLine is the longest stderr line read as one line. A longer one is
	// log, passed on in pieces, so that a program writing megabytes
	// without a newline costs bounded memory.
	maxLine = 64 << 10
	// maxLastLine bounds the last log line that becomes an error message.
	maxLastLine = 512
)

// stderrLog splits a program's stderr into progress reports and log.
type stderrLog struct {
	progress tool.Progress
	line     []byte // the current, incomplete line
	long     bool   // the current line outgrew maxLine and is log
	log      []byte // the end of the log, up to 2*tailSize
	// last is the last non-blank log line as it was written (at most
	// maxLine+1 bytes), made text only when asked for (lastLine): a
	// string per line would be an allocation per line of a program that
	// logs a gigabyte.
	last []byte
}

func (s *stderrLog) drain(r io.Reader) {
	chunk := make([]byte, 16<<10)
	for {
		n, err := r.Read(chunk)
		s.write(chunk[:n])
		if err != nil {
			if len(s.line) > 0 || s.long {
				s.endLine(false) // a last line without a newline
			}
			return
		}
	}
}

func (s *stderrLog) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.add(p)
			return
		}
		s.add(p[:i])
		s.endLine(true)
		p = p[i+1:]
	}
}

func (s *stderrLog) add(p []byte) {
	s.line = append(s.line, p...)
	if len(s.line) > maxLine {
		if !s.long {
			// The last line of a long line is its start, the same
			// whatever pieces the pipe delivered it in.
			s.setLast(s.line[:maxLine+1])
		}
		s.appendLog(s.line)
		s.line = s.line[:0]
		s.long = true
	}
}

func (s *stderrLog) endLine(newline bool) {
	line := bytes.TrimSuffix(s.line, []byte("\r"))
	if !s.long && s.report(line) {
		s.line = s.line[:0]
		return
	}
	s.appendLog(s.line)
	if newline {
		s.appendLog([]byte("\n"))
	}
	if !s.long {
		s.setLast(line)
	}
	s.line = s.line[:0]
	s.long = false
}

// setLast keeps line as the last log line, unless it is blank.
func (s *stderrLog) setLast(line []byte) {
	// Blank is white space only: an invalid byte is not space, as its
	// U+FFFD is not.
	if len(bytes.TrimSpace(line)) > 0 {
		s.last = append(s.last[:0], line...)
	}
}

// report turns a progress line into a report and reports whether line was
// one. A line whose JSON does not parse (or has fields of the wrong type)
// is still a report, with the raw text as its message: the program meant
// to say it is alive, and a typo in its JSON should neither crash the call
// nor silence that (docs/decisions/exec-protocol.md).
func (s *stderrLog) report(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte(progressPrefix))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	var r tool.Report
	switch {
	case len(rest) == 0:
	case rest[0] == '{':
		var ok bool
		if r, ok = quickReport(rest); ok {
			break
		}
		r = tool.Report{}
		if err := json.Unmarshal(rest, &r); err != nil {
			r = tool.Report{Message: text(rest)}
		}
	default:
		r.Message = text(rest)
	}
	if s.progress != nil {
		s.progress.Report(r)
	}
	return true
}

func (s *stderrLog) appendLog(p []byte) {
	s.log = append(s.log, p...)
	if len(s.log) > 2*tailSize {
		s.log = append(s.log[:0], s.log[len(s.log)-tailSize:]...)
	}
}

// tail returns the last tailSize bytes of the log, from a character
// boundary, with bytes that are not UTF-8 replaced.
func (s *stderrLog) tail() string {
	b := s.log
	if len(b) > tailSize {
		b = b[len(b)-tailSize:]
	}
	for len(b) > 0 && !utf8.RuneStart(b[0]) {
		b = b[1:]
	}
	return text(b)
}

// lastLine returns the last non-blank log line as text, trimmed, at most
// maxLastLine bytes and an ellipsis.
func (s *stderrLog) lastLine() string {
	t := strings.TrimSpace(text(s.last))
	if len(t) > maxLastLine {
		t = cutRunes(t[:maxLastLine]) + "…"
	}
	return t
}

// text returns b as valid UTF-8, every invalid byte replaced by U+FFFD, so
// that messages, records and model APIs can carry it.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

// cutRunes drops a partial character at the end of s.
func cutRunes(s string) string {
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}
