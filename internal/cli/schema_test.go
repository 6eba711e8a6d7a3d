package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/config"
)

// TestSchemaCommand: `timebox schema` prints the agent file's JSON Schema
// and nothing else, so that `timebox schema > agent.schema.json` makes a
// file an editor reads.
func TestSchemaCommand(t *testing.T) {
	r := run(t, nil, "schema")
	if r.code != 0 || r.err != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.err)
	}
	if r.out != string(config.Schema()) {
		t.Fatal("the output is not config.Schema()")
	}
	var s struct {
		Schema     string                     `json:"$schema"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal([]byte(r.out), &s); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if s.Schema != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema %q", s.Schema)
	}
	for _, k := range []string{"model", "providers", "timeouts", "limits", "context", "server", "tools"} {
		if _, ok := s.Properties[k]; !ok {
			t.Errorf("no property %s", k)
		}
	}
	if len(s.Required) != 1 || s.Required[0] != "model" {
		t.Errorf("required %q", s.Required)
	}
	for _, h := range []string{"-h", "--help"} {
		if r := run(t, nil, "schema", h); r.code != 0 || !strings.Contains(r.err, "yaml-language-server") {
			t.Errorf("schema %s: exit %d, %q", h, r.code, r.err)
		}
	}
	if r := run(t, nil, "schema", "extra"); r.code != 2 {
		t.Errorf("an extra argument: exit %d", r.code)
	}
	if r := run(t, nil, "help"); !strings.Contains(r.out, "timebox schema") {
		t.Errorf("the usage does not list schema:\n%s", r.out)
	}
}
