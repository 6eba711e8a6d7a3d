package mcptool

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// MaxMessage bounds one message a stdio server writes (one line of its
// stdout): past it the connection is closed, and the calls in flight on
// it fail saying so. The SDK's own bound is 16 MiB; a result past
// limits.max_tool_output is cut anyway, so a larger message only costs
// memory, but a server may send more than it needs before the cut.
const MaxMessage = 64 << 20

// errMessageTooLong is the read error of a stdio server's line past
// MaxMessage.
var errMessageTooLong = errors.New("wrote a message longer than " + strconv.Itoa(MaxMessage>>20) + " MiB on stdout, the most timebox reads of one")

// jsonLines is a stdio server's stdout as the SDK reads it: the lines that
// can be JSON-RPC messages (their first byte that is not blank is { or [)
// are passed on; any other line — a banner, a log line a server printed to
// stdout by mistake — is left out, and noted in the server's stderr tail,
// instead of ending the connection as a parse error would (MCP messages
// are one a line, so a line is the unit). A line past MaxMessage ends the
// stream with errMessageTooLong.
type jsonLines struct {
	r    io.ReadCloser
	note func(string) // told of each line left out
	max  int

	buf   []byte // read from r, not yet handed on
	start bool   // at the start of a line: its kind is not known yet
	pass  bool   // the current line is passed on
	n     int    // bytes of the current line
	left  []byte // the start of the line being left out, for the note
}

func newJSONLines(r io.ReadCloser, note func(string)) *jsonLines {
	return &jsonLines{r: r, note: note, max: MaxMessage, start: true}
}

// noteBytes is how much of a line left out its note quotes.
const noteBytes = 200

// Read passes on the lines that can be JSON-RPC messages and leaves out
// the others, noting each; a line past MaxMessage fails with
// errMessageTooLong.
func (j *jsonLines) Read(p []byte) (int, error) {
	for {
		if len(j.buf) == 0 {
			if cap(j.buf) == 0 {
				j.buf = make([]byte, 0, 32<<10)
			}
			n, err := j.r.Read(j.buf[:cap(j.buf)])
			j.buf = j.buf[:n]
			if n == 0 {
				if err == io.EOF && !j.start && !j.pass {
					j.leftOut()
					j.start = true
				}
				return 0, err
			}
		}
		out := 0
		for len(j.buf) > 0 && out < len(p) {
			if j.start {
				switch c := j.buf[0]; c {
				case ' ', '\t', '\r', '\n':
					// Blank: passed on as JSON's whitespace, deciding
					// nothing.
					p[out] = c
					out++
					j.buf = j.buf[1:]
					continue
				default:
					j.start, j.pass, j.n = false, c == '{' || c == '[', 0
				}
			}
			seg := j.buf // the rest of the line, or of what was read of it
			if i := bytes.IndexByte(seg, '\n'); i >= 0 {
				seg = seg[:i+1]
			}
			if j.pass {
				seg = seg[:min(len(seg), len(p)-out)]
				if j.n+len(seg) > j.max {
					return out, errMessageTooLong
				}
				out += copy(p[out:], seg)
			} else if room := noteBytes - len(j.left); room > 0 {
				j.left = append(j.left, seg[:min(len(seg), room)]...)
			}
			j.n += len(seg)
			j.buf = j.buf[len(seg):]
			if seg[len(seg)-1] == '\n' {
				if !j.pass {
					j.leftOut()
				}
				j.start = true
			}
		}
		if out > 0 {
			return out, nil
		}
	}
}

// leftOut notes the line just left out.
func (j *jsonLines) leftOut() {
	line := string(j.left)
	if len(line) > 0 && line[len(line)-1] == '\n' {
		line = line[:len(line)-1]
	}
	more := ""
	if j.n > len(j.left) {
		more = fmt.Sprintf(" (%d bytes)", j.n)
	}
	j.note(fmt.Sprintf("timebox: left out a line on stdout that is not JSON-RPC: %q%s", line, more))
	j.left = j.left[:0]
}

// Close closes the server's stdout.
func (j *jsonLines) Close() error { return j.r.Close() }
