package regular_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/regular"
	"github.com/timebox-run/timebox/internal/testenv"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, []byte("0123456789"), 0o644)
	for max, want := range map[int64]string{20: "0123456789", 10: "0123456789", 4: "01234"} {
		b, err := regular.ReadFile(file, max)
		if err != nil || string(b) != want {
			t.Errorf("ReadFile(%d) = %q, %v; want %q", max, b, err, want)
		}
	}
	fifo := filepath.Join(dir, "fifo")
	testenv.Mkfifo(t, fifo)
	for path, want := range map[string]string{
		fifo:        "is a named pipe (FIFO), not a regular file",
		"/dev/zero": "is a character device, not a regular file",
		dir:         "is a directory, not a regular file",
	} {
		done := make(chan error, 1)
		go func() {
			_, err := regular.ReadFile(path, 10)
			done <- err
		}()
		select {
		case err := <-done:
			if !regular.IsNotRegular(err) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: ReadFile blocked", path)
		}
	}
	if _, err := regular.ReadFile(filepath.Join(dir, "missing"), 10); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}
