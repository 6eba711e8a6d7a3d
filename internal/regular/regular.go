// Package regular opens the files timebox reads its configuration from —
// the agent file, the script model's file — so that no load step can
// block: a named pipe, a device or a socket in place of a file is an
// error at once, never an open() or a read that waits for ever (a FIFO
// with no writer) or never ends (/dev/zero).
package regular

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"unicode/utf8"
)

// NotRegularError is returned for a path that exists but is not a regular
// file.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, Describe(e.Mode))
}

// Describe names a kind of file for a message: "a directory", "a named
// pipe (FIFO)", "a character device", …
func Describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeIrregular != 0:
		return "an irregular file"
	}
	return "not a regular file"
}

// Open opens path for reading when it is a regular file (a symbolic link
// is followed). It never blocks: the file is opened with O_NONBLOCK, which
// makes open() of a FIFO return at once, and its kind is checked on the
// open descriptor, so that a file swapped after a check cannot slip
// through. (O_NONBLOCK changes nothing for a regular file's reads.) Errors are *fs.PathError from the system, or
// *NotRegularError.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &NotRegularError{Path: path, Mode: fi.Mode()}
	}
	return f, nil
}

// ReadFile reads a regular file, at most max bytes of it and one more to
// tell whether it is longer: it returns max+1 bytes for a longer file
// (whatever its size, nothing beyond is read), so the caller can say
// where the limit was passed.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max+1))
}

// IsNotRegular reports whether err is a *NotRegularError.
func IsNotRegular(err error) bool {
	var e *NotRegularError
	return errors.As(err, &e)
}

// utf8BOM is the byte-order mark some editors (Notepad) put at the start of
// a UTF-8 file.
var utf8BOM = []byte("\xef\xbb\xbf")

// TrimBOM returns b without the UTF-8 byte-order mark it starts with, if
// any: a text file's first line is read as its author sees it, and the
// columns of its errors are those of the author's editor.
func TrimBOM(b []byte) []byte { return bytes.TrimPrefix(b, utf8BOM) }

// NotUTF8 returns the offset of the first byte of b that is not part of a
// UTF-8 character, and what to say of it, ready to follow "the file is not
// UTF-8 text: "; or -1 and "" when b is UTF-8. A reader that would take
// such a byte for U+FFFD (goccy/go-yaml, encoding/json) says so instead.
func NotUTF8(b []byte) (off int, problem string) {
	if utf8.Valid(b) {
		return -1, ""
	}
	for off < len(b) {
		r, size := utf8.DecodeRune(b[off:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		off += size
	}
	return off, fmt.Sprintf("byte 0x%02x here is not part of a character (save the file as UTF-8)", b[off])
}
