package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestMCPCredentialsAreWithheld: what a stdio MCP entry's env: hands its
// server is withheld from the other tools, but the common variables every
// program reads are not.
func TestMCPCredentialsAreWithheld(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "hi"}`+"\n"), 0o644)
	os.WriteFile(file, []byte(`model: {primary: "script:m"}
providers: {script: {file: script.jsonl}}
tools:
  - name: github
    mcp: {command: [github-mcp]}
    env: [PATH, HOME, LC_ALL, GITHUB_TOKEN]
  - name: fetch
    exec: [curl]
`), 0o644)
	a, err := Load(file, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	w := a.Withheld()
	if !slices.Contains(w, "GITHUB_TOKEN") {
		t.Errorf("withheld %v: the MCP server's token passes to the other tools", w)
	}
	for _, common := range []string{"PATH", "HOME", "LC_ALL"} {
		if slices.Contains(w, common) {
			t.Errorf("withheld %v: %s is every program's", w, common)
		}
	}
	for _, own := range []string{"TIMEBOX_TOKEN", "OPENAI_API_KEY"} {
		if !slices.Contains(w, own) {
			t.Errorf("withheld %v lacks %s", w, own)
		}
	}
}
