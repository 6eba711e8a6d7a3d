package timebox_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testName is a test, fuzz target or benchmark as the pages name one.
var testName = regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*`)

// TestDocsNameTestsThatExist: every test, fuzz target and benchmark the
// README and the pages name (docs/RELIABILITY.md and SECURITY.md name the
// test that holds each promise) is declared in a _test.go file of the
// repository, or is the prefix of one (a -run pattern), so a renamed or
// removed test does not leave a promise that nothing holds.
func TestDocsNameTestsThatExist(t *testing.T) {
	var declared []string
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*)\(`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range decl.FindAllSubmatch(b, -1) {
			declared = append(declared, string(m[1]))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range allPages(t) {
		for _, name := range testName.FindAllString(string(b), -1) {
			if !declaredOrPrefix(declared, name) {
				t.Errorf("%s names %s, which no _test.go declares", p, name)
			}
		}
	}
}

func declaredOrPrefix(declared []string, name string) bool {
	for _, d := range declared {
		if strings.HasPrefix(d, name) {
			return true
		}
	}
	return false
}

// allPages returns the text of the README and of every page under docs/,
// decisions included, by path.
func allPages(t *testing.T) map[string][]byte {
	t.Helper()
	pages, _ := filepath.Glob("docs/*.md")
	decisions, _ := filepath.Glob("docs/decisions/*.md")
	out := map[string][]byte{}
	for _, p := range append(append(pages, decisions...), "README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = b
	}
	return out
}
