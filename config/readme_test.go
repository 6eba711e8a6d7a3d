package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeBounds keeps the README's budget table true to Settings, the
// one table of bounds in code: every setting has a row whose bounds
// column says what Setting.Bounds says.
func TestReadmeBounds(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if cells := strings.Split(line, " | "); len(cells) >= 5 && strings.HasPrefix(line, "| `") {
			rows[strings.Trim(strings.TrimPrefix(cells[0], "| "), "`")] = cells
		}
	}
	for _, s := range Settings {
		key := strings.TrimPrefix(s.Key, "timeouts.")
		cells, ok := rows[key]
		if !ok {
			t.Errorf("README.md's budget table has no row for `%s` (add one with its bounds: %s)", key, s.Bounds())
			continue
		}
		if !strings.HasPrefix(cells[2], s.Bounds()) {
			t.Errorf("README.md gives %s the bounds %q; the code has %q", s.Key, cells[2], s.Bounds())
		}
	}
}
