package advice_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/advice"
)

// TestDiffAsDiffU: Diff's hunks are those of GNU diff -u, for the apply
// test's files and a few edge cases.
func TestDiffAsDiffU(t *testing.T) {
	if _, err := exec.LookPath("diff"); err != nil {
		t.Skip("no diff on PATH")
	}
	a, _ := os.ReadFile("testdata/agent.yaml")
	b, _ := os.ReadFile("testdata/agent.applied.yaml")
	for _, tc := range []struct{ name, a, b string }{
		{"apply", string(a), string(b)},
		{"first line", "a\nb\nc\n", "x\nb\nc\n"},
		{"last line", "a\nb\nc\n", "a\nb\nx\n"},
		{"added at the end", "a\nb\n", "a\nb\nc\nd\n"},
		{"removed at the start", "a\nb\nc\n", "c\n"},
		{"far apart", strings.Repeat("l\n", 3) + "a\n" + strings.Repeat("m\n", 20) + "b\n", strings.Repeat("l\n", 3) + "x\n" + strings.Repeat("m\n", 20) + "y\n"},
		{"no final newline", "a\nb", "a\nc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			pa, pb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
			os.WriteFile(pa, []byte(tc.a), 0o644)
			os.WriteFile(pb, []byte(tc.b), 0o644)
			out, _ := exec.Command("diff", "-u", pa, pb).Output()
			want := string(out)[strings.Index(string(out), "\n@@")+1:]
			got := advice.Diff("a", "b", []byte(tc.a), []byte(tc.b))
			got = got[strings.Index(got, "\n@@")+1:]
			if got != want {
				t.Errorf("Diff:\n%s\ndiff -u:\n%s", got, want)
			}
		})
	}
	if d := advice.Diff("a", "b", a, a); d != "" {
		t.Errorf("Diff of a file with itself: %q", d)
	}
}
