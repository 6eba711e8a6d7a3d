package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/doctest"
)

// docs/agent-file.md is made from the same tree as Schema: these tests
// fail when it is not, and `go test ./config -run TestDocs -update`
// rewrites its generated parts.

const (
	agentFileDoc = "../docs/agent-file.md"
	regenerate   = "`go test ./config -run TestDocs -update`"
)

// typeText says what a value of n is, with its bounds.
func typeText(n *node) string {
	switch n.kind {
	case kMapping:
		return "mapping"
	case kMap:
		return "mapping of " + n.name + " to " + typeText(n.elem)
	case kList:
		switch n.elem.kind {
		case kMapping:
			return "list of mappings"
		case kArg:
			return "list of text (an argv)"
		case kVarName:
			return "list of variable names"
		}
		return "list of " + typeText(n.elem)
	case kText, kArg:
		return "text"
	case kModelRef:
		return "provider:model"
	case kURL:
		return "URL (http or https)"
	case kFile:
		return "path"
	case kVarName:
		return "variable name"
	case kToolName:
		return "tool name"
	case kWebhookEvent:
		return "event type, or {type, outcomes}"
	case kChoice:
		return "`" + strings.Join(n.choices, "`, `") + "`"
	case kEnforcement:
		return "`" + strings.Join(enforcementNames, "`, `") + "`"
	case kApproval:
		return "`" + strings.Join(approvalNames, "`, `") + "`"
	case kToolTimeout:
		return "duration (" + fmtDuration(time.Duration(minDuration)) + " to timeouts.tool_max) or profile name"
	case kDuration:
		s := "duration, " + fmtDuration(time.Duration(n.min)) + " to " + fmtDuration(time.Duration(n.max))
		if n.zeroOK {
			s += ", or 0 (off)"
		}
		return s
	case kCount:
		return fmt.Sprintf("whole number, %d to %d", n.min, n.max)
	case kSetting:
		st, _ := SettingByKey(n.setting)
		if st.Kind == KindSwitch {
			return "switch: " + boundsText(st)
		}
		what := map[SettingKind]string{KindDuration: "duration", KindCount: "whole number", KindBytes: "size"}[st.Kind]
		return what + ", " + boundsText(st)
	case kInputSchema:
		return "JSON Schema (a mapping)"
	}
	panic(fmt.Sprintf("typeText: kind %d", n.kind))
}

// keyRows renders the table rows of n's keys under prefix.
func keyRows(b *strings.Builder, n *node, prefix string) {
	row := func(path string, c *node, req bool) {
		def := "—"
		flagEnv := ""
		switch {
		case req:
			def = "required"
		case c.kind == kSetting:
			st, _ := SettingByKey(c.setting)
			def = "`" + st.Default + "`"
			if st.Default == "0" {
				def += " (" + st.format(0) + ")"
			}
			flagEnv = "`--" + st.Flag + "`<br>`" + st.Env + "`"
		case c.def == "0":
			def = "`0` (off)"
		case c.def != "":
			def = c.def
			if !strings.Contains(def, " ") && !strings.Contains(def, "'") {
				def = "`" + def + "`"
			}
		}
		doc := c.doc
		if c.kind == kSetting {
			doc = upperFirst(c.doc) + "."
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s | %s |\n", path, typeText(c), def, flagEnv, doc)
	}
	switch n.kind {
	case kMapping:
		for _, kk := range n.keys {
			p := join(prefix, kk.name)
			row(p, kk.n, contains(n.required, kk.name))
			keyRows(b, kk.n, p)
		}
	case kMap:
		if n.elem.kind == kMapping {
			keyRows(b, n.elem, prefix+"."+n.name)
		}
	case kList:
		if n.elem.kind == kMapping {
			keyRows(b, n.elem, prefix+"[]")
		}
	}
}

// keysPart renders the key tables: one per top-level key that holds a
// mapping, one for the top-level scalars.
func keysPart() string {
	var b strings.Builder
	header := "| key | type | default | flag<br>variable | what it is |\n|---|---|---|---|---|\n"
	b.WriteString("### Top level\n\n" + header)
	for _, kk := range agentFile.keys {
		if kk.n.kind == kText {
			fmt.Fprintf(&b, "| `%s` | %s | — |  | %s |\n", kk.name, typeText(kk.n), kk.n.doc)
		}
	}
	b.WriteString("| `x-…` | anything | — |  | Ignored by timebox: a place for anchors the rest of the file reuses (`x-defaults: &defaults {...}`, then `<<: *defaults`). Top level only. |\n")
	for _, kk := range agentFile.keys {
		if kk.n.kind == kText {
			continue
		}
		fmt.Fprintf(&b, "\n### `%s`\n\n%s", kk.name, kk.n.doc)
		if contains(agentFile.required, kk.name) {
			b.WriteString(" Required.")
		}
		fmt.Fprintf(&b, " A %s.\n\n", typeText(kk.n))
		b.WriteString(header)
		keyRows(&b, kk.n, kk.name)
	}
	return b.String()
}

// TestDocsAgentFile: the key tables and the reference file shown in
// docs/agent-file.md are generated from the tree, Settings and
// examples/reference/agent.yaml.
func TestDocsAgentFile(t *testing.T) {
	doctest.Part(t, agentFileDoc, "keys", keysPart(), *update, regenerate)
	ref, err := os.ReadFile(referenceFile)
	if err != nil {
		t.Fatal(err)
	}
	doctest.Part(t, agentFileDoc, "reference", "```yaml\n"+string(ref)+"```\n", *update, regenerate)
}

// TestDocsAgentFileVariables: every TIMEBOX_* variable timebox reads is
// named in docs/agent-file.md.
func TestDocsAgentFileVariables(t *testing.T) {
	page, err := os.ReadFile(agentFileDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range envNames() {
		if !strings.Contains(string(page), "`"+name+"`") {
			t.Errorf("%s does not name %s", agentFileDoc, name)
		}
	}
}

// TestDocsAgentFileExamples: every yaml example of docs/agent-file.md
// loads and passes the schema.
func TestDocsAgentFileExamples(t *testing.T) {
	page, err := os.ReadFile(agentFileDoc)
	if err != nil {
		t.Fatal(err)
	}
	schema := compiledSchema(t)
	n := 0
	for _, b := range doctest.Blocks(page) {
		if b.Lang != "yaml" {
			continue
		}
		n++
		dir := referenceDir(t) // the reference's tools and script, for relative paths
		path := filepath.Join(dir, "agent.yaml")
		if err := os.WriteFile(path, []byte(b.Text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path, Overrides{}); err != nil {
			t.Errorf("the example at line %d of %s does not load:\n%v", b.Line, agentFileDoc, err)
		}
		if err := schema.Validate(instance(t, []byte(b.Text))); err != nil {
			t.Errorf("the example at line %d of %s fails the schema: %v", b.Line, agentFileDoc, err)
		}
	}
	if n < 3 {
		t.Errorf("only %d yaml examples in %s", n, agentFileDoc)
	}
}
