package cli

import (
	"fmt"
	"io"
)

// termSafe writes what it is given for a person's terminal with every
// control character written out ("\x1b", "\x07", "\u009b") instead of
// sent: a tool's progress line, a model's text, a remote client's input or
// an approver's reason must not clear the screen, set the window's title,
// write the clipboard (OSC 52) or move the cursor to fake lines of
// timebox's own. Newlines, tabs and colors (SGR sequences, "ESC [ 1;31 m",
// which change nothing but the look of the text) pass; a "\r" right before
// a newline is dropped. Text without control characters is written as it
// is, without a copy. Each Write stands alone: a sequence split across two
// is written out.
type termSafe struct{ w io.Writer }

func (t termSafe) Write(p []byte) (int, error) {
	i := unsafeAt(p)
	if i < 0 {
		return t.w.Write(p)
	}
	out := make([]byte, 0, len(p)+32)
	out = append(out, p[:i]...)
	for i < len(p) {
		b := p[i]
		switch {
		case b == 0x1b:
			if n := sgrLen(p[i:]); n > 0 {
				out = append(out, p[i:i+n]...)
				i += n
				continue
			}
			out = fmt.Appendf(out, `\x%02x`, b)
		case b == '\r' && i+1 < len(p) && p[i+1] == '\n':
		case b == '\n' || b == '\t':
			out = append(out, b)
		case b < 0x20 || b == 0x7f:
			out = fmt.Appendf(out, `\x%02x`, b)
		case b == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f:
			out = fmt.Appendf(out, `\u%04x`, p[i+1])
			i++
		default:
			out = append(out, b)
		}
		i++
	}
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// unsafeAt returns the index of the first byte of p that termSafe does not
// pass as it is, or -1.
func unsafeAt(p []byte) int {
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch {
		case b == '\n' || b == '\t':
		case b == 0x1b:
			if n := sgrLen(p[i:]); n > 0 {
				i += n - 1
				continue
			}
			return i
		case b < 0x20 || b == 0x7f:
			return i
		case b == 0xc2 && i+1 < len(p) && p[i+1] >= 0x80 && p[i+1] <= 0x9f:
			return i
		}
	}
	return -1
}

// sgrLen returns the length of the SGR sequence ("ESC [ params m") at the
// start of p, or 0 if there is none.
func sgrLen(p []byte) int {
	if len(p) < 3 || p[0] != 0x1b || p[1] != '[' {
		return 0
	}
	for i := 2; i < len(p) && i < 64; i++ {
		switch c := p[i]; {
		case c == 'm':
			return i + 1
		case c == ';' || c >= '0' && c <= '9':
		default:
			return 0
		}
	}
	return 0
}
