package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// These tests keep Schema (and docs/agent-file.md, made from the same
// tree) true to what Load accepts. Schema is checked by a second JSON
// Schema implementation, not the one timebox uses for input schemas, which
// also checks it against the draft 2020-12 meta-schema.

const referenceFile = "../examples/reference/agent.yaml"

// compiledSchema compiles Schema.
func compiledSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema()))
	if err != nil {
		t.Fatalf("Schema is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource("agent.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("agent.schema.json")
	if err != nil {
		t.Fatalf("Schema does not compile as a draft 2020-12 schema: %v", err)
	}
	return s
}

// instance reads YAML as the JSON value a schema validator (and an editor)
// sees: aliases and merge keys expanded.
func instance(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("YAML: %v", err)
	}
	return jsonValue(t, v)
}

// jsonValue converts v to the form the validator takes (json.Number for
// numbers).
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSchemaFile: examples/agent.schema.json, which the example agent
// files point editors at, is what `timebox schema` prints.
func TestSchemaFile(t *testing.T) {
	compiledSchema(t)
	const path = "../examples/agent.schema.json"
	if *update {
		if err := os.WriteFile(path, Schema(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, Schema()) {
		t.Errorf("%s is not what Schema returns (run go test ./config -run TestSchemaFile -update)", path)
	}
}

// treePaths lists the key paths of n in the notation of
// docs/agent-file.md: tools[].mcp.headers.HEADER.
func treePaths(n *node, prefix string, out *[]string) {
	switch n.kind {
	case kMapping:
		for _, kk := range n.keys {
			p := join(prefix, kk.name)
			*out = append(*out, p)
			treePaths(kk.n, p, out)
		}
	case kMap:
		treePaths(n.elem, prefix+"."+n.name, out)
	case kList:
		if n.elem.kind == kMapping {
			treePaths(n.elem, prefix+"[]", out)
		}
	}
}

// instancePaths lists the key paths of the tree that v sets.
func instancePaths(n *node, v any, prefix string, out map[string]bool) {
	switch n.kind {
	case kMapping:
		m, _ := v.(map[string]any)
		for _, kk := range n.keys {
			if x, ok := m[kk.name]; ok {
				p := join(prefix, kk.name)
				out[p] = true
				instancePaths(kk.n, x, p, out)
			}
		}
	case kMap:
		m, _ := v.(map[string]any)
		for _, x := range m {
			instancePaths(n.elem, x, prefix+"."+n.name, out)
		}
	case kList:
		l, _ := v.([]any)
		for _, x := range l {
			if n.elem.kind == kMapping {
				instancePaths(n.elem, x, prefix+"[]", out)
			}
		}
	}
}

// TestReferenceFile: the reference agent file loads, validates against the
// schema, and sets every key the schema knows, so that it is complete and
// every key of the schema is one Load accepts.
func TestReferenceFile(t *testing.T) {
	a, err := Load(referenceFile, Overrides{})
	if err != nil {
		t.Fatalf("the reference agent file does not load:\n%v", err)
	}
	if len(a.Warnings) > 0 {
		t.Errorf("the reference agent file has warnings: %q", a.Warnings)
	}
	data, err := os.ReadFile(referenceFile)
	if err != nil {
		t.Fatal(err)
	}
	v := instance(t, data)
	if err := compiledSchema(t).Validate(v); err != nil {
		t.Fatalf("the reference agent file fails the schema: %v", err)
	}
	var all []string
	treePaths(agentFile, "", &all)
	set := map[string]bool{}
	instancePaths(agentFile, v, "", set)
	for _, p := range all {
		if !set[p] {
			t.Errorf("%s sets no %s: the reference file shows every key (add it, with a comment)", referenceFile, p)
		}
	}
}

// location is a mapping of the tree at a place of an instance.
type location struct {
	path  string   // as docs/agent-file.md writes it
	steps []any    // string keys and int indexes from the root
	n     *node    // a kMapping
	keys  []string // the keys the tree gives it
}

// mappings lists every kMapping of the tree that v reaches.
func mappings(n *node, v any, path string, steps []any, out *[]location) {
	switch n.kind {
	case kMapping:
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		loc := location{path: path, steps: append([]any(nil), steps...), n: n}
		for _, kk := range n.keys {
			loc.keys = append(loc.keys, kk.name)
		}
		*out = append(*out, loc)
		for _, kk := range n.keys {
			if x, ok := m[kk.name]; ok {
				mappings(kk.n, x, join(path, kk.name), append(steps, kk.name), out)
			}
		}
	case kMap:
		m, _ := v.(map[string]any)
		names := make([]string, 0, len(m))
		for name := range m {
			names = append(names, name)
		}
		sort.Strings(names)
		if len(names) > 0 { // one is enough: they share the shape
			mappings(n.elem, m[names[0]], path+"."+n.name, append(steps, names[0]), out)
		}
	case kList:
		l, _ := v.([]any)
		seen := map[string]bool{}
		for i, x := range l {
			// One item of each kind (exec, mcp with command, mcp with url).
			sig := ""
			if m, ok := x.(map[string]any); ok {
				for _, k := range []string{"exec", "mcp"} {
					if mv, ok := m[k]; ok {
						sig = k
						if mm, ok := mv.(map[string]any); ok {
							for _, kk := range []string{"command", "url"} {
								if _, ok := mm[kk]; ok {
									sig += "." + kk
								}
							}
						}
					}
				}
			}
			if seen[sig] {
				continue
			}
			seen[sig] = true
			mappings(n.elem, x, path+"[]", append(steps, i), out)
		}
	}
}

// withKey returns a deep copy of v with key set to val in the mapping at
// steps.
func withKey(t *testing.T, v any, steps []any, key string, val any) any {
	t.Helper()
	b, _ := json.Marshal(v)
	var cp any
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}
	at := cp
	for _, s := range steps {
		switch s := s.(type) {
		case string:
			at = at.(map[string]any)[s]
		case int:
			at = at.([]any)[s]
		}
	}
	m, ok := at.(map[string]any)
	if !ok {
		t.Fatalf("no mapping at %v", steps)
	}
	m[key] = val
	return cp
}

// referenceDir copies the reference agent's directory (its tools, script
// and workdir) to a temporary one, where a changed agent file can load.
func referenceDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Dir(referenceFile))); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadJSON writes v as the agent file of dir (JSON is YAML) and loads it.
func loadJSON(t *testing.T, dir string, v any) error {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path, Overrides{})
	return err
}

// TestLoaderAndSchemaKnowTheSameKeys asks Load which keys each mapping of
// the agent file has: an unknown key's error lists them ("unknown key
// (known keys: ...)"). They must be the schema's, no more, no fewer: a
// key the loader learns without the schema, or the other way round,
// fails here with its place. The same unknown key must fail the schema, as
// it underlines in an editor.
func TestLoaderAndSchemaKnowTheSameKeys(t *testing.T) {
	const probe = "zzqx_probe"
	data, err := os.ReadFile(referenceFile)
	if err != nil {
		t.Fatal(err)
	}
	ref := instance(t, data)
	var locs []location
	mappings(agentFile, ref, "", nil, &locs)
	if len(locs) < 10 {
		t.Fatalf("only %d mappings found in the reference file", len(locs))
	}
	schema := compiledSchema(t)
	dir := referenceDir(t)
	for _, loc := range locs {
		name := loc.path
		if name == "" {
			name = "top"
		}
		t.Run(name, func(t *testing.T) {
			v := withKey(t, ref, loc.steps, probe, "x")
			if err := schema.Validate(jsonValue(t, v)); err == nil {
				t.Errorf("the schema accepts the unknown key %s in %s", probe, name)
			}
			err := loadJSON(t, dir, v)
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("Load accepts the unknown key %s in %s (err %v)", probe, name, err)
			}
			var msg string
			for _, e := range es {
				if e.Key == probe || strings.HasSuffix(e.Key, "."+probe) {
					msg = e.Msg
				} else {
					t.Errorf("unexpected problem: %v", e)
				}
			}
			if !strings.HasPrefix(msg, "unknown key") {
				t.Fatalf("Load's problem with %s is %q, not an unknown key", probe, msg)
			}
			want := append([]string(nil), loc.keys...)
			sort.Strings(want)
			_, list, found := strings.Cut(msg, "(known keys: ")
			if !found {
				// The providers' hint names them in a sentence instead.
				if loc.path == "providers" {
					got := append([]string(nil), providerNames...)
					sort.Strings(got)
					if !reflect.DeepEqual(got, want) {
						t.Errorf("providers: the loader knows %q, the schema %q", got, want)
					}
					return
				}
				t.Fatalf("Load's message does not list the known keys: %q", msg)
			}
			got := strings.Split(strings.TrimSuffix(list, ")"), ", ")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the loader knows %q, the schema %q", name, got, want)
			}
		})
	}
}

// TestSchemaAcceptsEveryValidFile: every YAML file of the repository that
// Load accepts — the examples and the valid test files — passes the
// schema, so that the schema never underlines a file timebox runs; and
// every file Load refuses only for unknown keys fails it.
func TestSchemaAcceptsEveryValidFile(t *testing.T) {
	schema := compiledSchema(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	valid, unknown := 0, 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "fuzz":
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		_, lerr := Load(path, Overrides{})
		var es Errors
		onlyUnknown := errors.As(lerr, &es) && len(es) > 0
		for _, e := range es {
			onlyUnknown = onlyUnknown && strings.HasPrefix(e.Msg, "unknown key")
		}
		if lerr != nil && !onlyUnknown {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		verr := schema.Validate(instance(t, data))
		switch {
		case lerr == nil:
			valid++
			if verr != nil {
				t.Errorf("%s loads but fails the schema: %v", rel, verr)
			}
		default:
			unknown++
			if verr == nil {
				t.Errorf("%s has an unknown key (%v) but passes the schema", rel, lerr)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The demo's two agents, the reference, and config's valid test files.
	if valid < 5 || unknown < 1 {
		t.Errorf("checked %d valid files and %d with unknown keys; expected at least 5 and 1", valid, unknown)
	}
	t.Logf("%d valid agent files pass the schema; %d with unknown keys fail it", valid, unknown)
}

// TestSchemaRejectsWhatLoadRejects: values of the wrong form fail both
// Load and the schema, so that an editor underlines them before timebox
// refuses them.
func TestSchemaRejectsWhatLoadRejects(t *testing.T) {
	schema := compiledSchema(t)
	dir := referenceDir(t)
	data, err := os.ReadFile(referenceFile)
	if err != nil {
		t.Fatal(err)
	}
	ref := instance(t, data)
	cases := []struct {
		name  string
		steps []any
		key   string
		val   any
	}{
		{"duration in words", []any{"timeouts"}, "tool", "10 mins"},
		{"duration without a unit", []any{"timeouts"}, "step", 30},
		{"negative duration", []any{"timeouts"}, "turn", "-5m"},
		{"count below its minimum", []any{"limits"}, "max_steps", 0},
		{"count not a number", []any{"limits"}, "parallel_tools", "four"},
		{"size in decimal units", []any{"limits"}, "max_tool_output", "1MB"},
		{"unknown enforcement", []any{"tools", 0}, "enforcement", "strict"},
		{"exec as a shell string", []any{"tools", 0}, "exec", "./tools/word_count.sh --all"},
		{"empty exec", []any{"tools", 0}, "exec", []any{}},
		{"exec and mcp", []any{"tools", 0}, "mcp", map[string]any{"url": "http://127.0.0.1:1/mcp"}},
		{"overrides on an exec tool", []any{"tools", 0}, "overrides", map[string]any{"x": map[string]any{"timeout": "1s"}}},
		{"description on an mcp entry", []any{"tools", 2}, "description", "a server"},
		{"headers on a stdio server", []any{"tools", 2, "mcp"}, "headers", map[string]any{"A": "b"}},
		{"url and command", []any{"tools", 2, "mcp"}, "url", "http://127.0.0.1:1/mcp"},
		{"url not http", []any{"tools", 3, "mcp"}, "url", "ftp://example.org"},
		{"bad tool name", []any{"tools", 0}, "name", "word count"},
		{"model without a provider", []any{"model"}, "primary", "gpt-4o"},
		{"unknown provider", []any{"model"}, "primary", "mistral:large"},
		{"key in the file", []any{"providers", "openai", "credentials", 0}, "api_key_env", "sk-abc 123"},
		{"empty credentials", []any{"providers", "anthropic"}, "credentials", []any{}},
		{"profile that is off", []any{"timeouts", "profiles"}, "fast", 0},
		{"profile name not a word", []any{"timeouts", "profiles"}, "1fast", "1s"},
		{"input_schema not an object schema", []any{"tools", 0, "input_schema"}, "type", "string"},
		{"env as a string", []any{"tools", 1}, "env", "HOME PATH"},
		{"bad variable name", []any{"tools", 1}, "env", []any{"HOME=/root"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := withKey(t, ref, tc.steps, tc.key, tc.val)
			if err := loadJSON(t, dir, v); err == nil {
				t.Errorf("Load accepts %s: %v", tc.key, tc.val)
			}
			if err := schema.Validate(jsonValue(t, v)); err == nil {
				t.Errorf("the schema accepts %s: %v", tc.key, tc.val)
			}
		})
	}
	// And the forms Load accepts that a schema could easily miss.
	ok := []struct {
		name  string
		steps []any
		key   string
		val   any
	}{
		{"0 for off", []any{"timeouts"}, "llm_idle", 0},
		{"quoted 0", []any{"timeouts"}, "llm_budget", "0"},
		{"fractional duration", []any{"timeouts"}, "tool", "1.5s"},
		{"compound duration", []any{"timeouts"}, "turn", "1h30m"},
		{"quoted count", []any{"limits"}, "max_steps", "30"},
		{"size in bytes", []any{"limits"}, "max_tool_output", 65536},
		{"size in KiB", []any{"limits"}, "max_tool_output", "512KiB"},
		{"profile of the file", []any{"tools", 0}, "timeout", "slow"},
		{"number argument", []any{"tools", 1}, "exec", []any{"./tools/crawl.sh", "--depth", 2}},
		{"empty env", []any{"tools", 1}, "env", []any{}},
		{"null section", nil, "server", nil},
		{"number as a name", []any{"tools", 0}, "name", 7},
		{"number as a description", []any{"tools", 0}, "description", 42},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			v := withKey(t, ref, tc.steps, tc.key, tc.val)
			if err := loadJSON(t, dir, v); err != nil {
				t.Errorf("Load refuses %s: %v: %v", tc.key, tc.val, err)
			}
			if err := schema.Validate(jsonValue(t, v)); err != nil {
				t.Errorf("the schema refuses %s: %v: %v", tc.key, tc.val, err)
			}
		})
	}
}
