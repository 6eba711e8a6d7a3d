package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIndentProblemPassesGoodFiles: the indentation check, which runs
// only on a file the YAML reader refused, finds nothing to say about any
// file the reader takes, in every agent file of the repository (block
// texts with tabs, flow lists over several lines, lists of mappings, …).
func TestIndentProblemPassesGoodFiles(t *testing.T) {
	checked := 0
	for _, root := range []string{"..", "testdata"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "node_modules" || d.Name() == ".git") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if f, _, _, msg := parseYAML(data); f == nil || msg != "" {
				return nil // a file meant to be refused
			}
			checked++
			if at, problem := indentProblem(data); problem != "" {
				t.Errorf("%s:%d:%d: %s", path, at.line, at.col, problem)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d files", checked)
	}
	// And a few shapes written here, each valid YAML.
	for _, good := range []string{
		"tools:\n- name: a\n  exec: [echo]\ntimeouts:\n  tool: 5s\n",
		"instructions: >-\n  folded\n\n  text: with a colon\nmodel:\n  primary: script:demo\n",
		"x-base: &base\n  timeout: 5s\ntools:\n  - <<: *base\n    name: a\n",
		"model: !!map\n  primary: script:demo\n",
		"tools:\n  - - nested\n    - list\n",
		"a: {b: [1,\n  2], c: 3}\nd: 4\n",
		"instructions: it's a plain\n  text on two lines\nmodel: {primary: script:demo}\n",
	} {
		if f, _, _, msg := parseYAML([]byte(good)); f == nil || msg != "" {
			t.Errorf("%q does not parse: %s", good, msg)
			continue
		}
		if at, problem := indentProblem([]byte(good)); problem != "" {
			t.Errorf("%q: %d:%d: %s", good, at.line, at.col, problem)
		}
	}
}
