package config

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
)

// This file describes every key of the agent file once, as a tree of
// nodes. Two things are generated from the tree: the JSON Schema that
// `timebox schema` prints (Schema), and the key tables of
// docs/agent-file.md (the -update flag of this package's tests rewrites
// them). The process-wide settings are not described here a second time:
// their nodes are made from Settings, the table Load itself reads.
//
// The loader reads the file with its own code (load.go, model.go,
// tools.go); schema_test.go proves that the two agree: every key of the
// tree is set in examples/reference/agent.yaml, which Load accepts, and for
// every mapping of the tree Load is asked which keys it knows (by the list
// its "unknown key" error gives) and must name exactly the tree's.

// nodeKind is what a key holds.
type nodeKind int

const (
	kMapping      nodeKind = iota // fixed keys (keys)
	kMap                          // names chosen by the author (name) → elem
	kList                         // a list of elem
	kText                         // any text
	kModelRef                     // provider:model
	kURL                          // an http(s) URL
	kFile                         // a path, relative to the agent file
	kVarName                      // an environment variable's name
	kToolName                     // a tool's name
	kArg                          // an argv item: text, or a number taken as written
	kEnforcement                  // hard, cooperative or advisory
	kApproval                     // required or never
	kToolTimeout                  // a duration (not 0) or a profile name
	kDuration                     // a duration, bounded by min/max, 0 allowed when zeroOK
	kCount                        // a whole number, bounded by min/max
	kSetting                      // a process-wide setting: setting names it
	kInputSchema                  // a JSON Schema of a tool's arguments
	kWebhookEvent                 // an event type, or {type, outcomes}
	kChoice                       // one of choices
)

// node is one value of the agent file.
type node struct {
	kind nodeKind
	// doc says what the key is for, in a sentence or two; the reference
	// and the schema's descriptions show it.
	doc string
	// def is the default as a person writes it; empty when there is none.
	def string
	// keys are a kMapping's keys, in the order the reference lists them;
	// required names those that must be there.
	keys     []key
	required []string
	// name is what a kMap's names are called in key paths (PROFILE,
	// TOOL), namePattern what they must match (a JSON Schema regex, ""
	// for any).
	name, namePattern string
	// elem is a kList's item or a kMap's value.
	elem *node
	// setting is a kSetting's Settings key.
	setting string
	// min, max and zeroOK bound a kDuration or kCount.
	min, max int64
	zeroOK   bool
	// rules are extra JSON Schema keywords of a kMapping: the conditions
	// between its keys (exec or mcp, command or url).
	rules map[string]any
	// minItems is a kList's least length.
	minItems int
	// choices are a kChoice's values.
	choices []string
}

// key is one key of a kMapping.
type key struct {
	name string
	n    *node
}

func mapping(doc string, required []string, keys ...key) *node {
	return &node{kind: kMapping, doc: doc, keys: keys, required: required}
}

func k(name string, n *node) key { return key{name: name, n: n} }

func leaf(kind nodeKind, doc string) *node { return &node{kind: kind, doc: doc} }

func listOf(doc string, elem *node, minItems int) *node {
	return &node{kind: kList, doc: doc, elem: elem, minItems: minItems}
}

// section is a mapping of process-wide settings: one node per entry of
// Settings whose key starts with name and a dot, in Settings' order, then
// the extra keys.
func section(name, doc string, extra ...key) *node {
	n := &node{kind: kMapping, doc: doc}
	for _, s := range Settings {
		if leafKey, ok := strings.CutPrefix(s.Key, name+"."); ok {
			n.keys = append(n.keys, k(leafKey, &node{kind: kSetting, setting: s.Key, doc: s.Doc, def: s.Default}))
		}
	}
	n.keys = append(n.keys, extra...)
	return n
}

// webhooks is server.webhooks: a list of receivers.
func webhooks() *node {
	return listOf("Receivers of webhooks: timebox serve POSTs each event they subscribe to, signed the Standard Webhooks way, at least once (docs/webhooks.md).",
		mapping("One receiver.", []string{"url", "events", "secret_env"},
			k("url", leaf(kURL, "The receiver's URL (http or https). A URL that points at this timebox server is refused when it starts.")),
			k("events", listOf("The event types sent: "+strings.Join(WebhookEventTypes, ", ")+". A tool_finished entry may keep only some outcomes: {type: tool_finished, outcomes: [timed_out, error]}.",
				leaf(kWebhookEvent, "An event type, or {type: tool_finished, outcomes: [...]}."), 1)),
			k("secret_env", leaf(kVarName, "The environment variable that holds the receiver's signing secret, a whsec_ secret (base64 after the prefix). The secret itself never goes in the file, and tools never inherit the variable.")),
		), 0)
}

// requestMax is server.request_max: one key per budget a request may set.
func requestMax() *node {
	n := mapping("The ceiling up to which one request's budgets (POST /v1/turns, \"budgets\") may raise each budget; a budget not named here may only be lowered by a request.", nil)
	for _, kn := range budget.Knobs {
		if !kn.Request {
			continue
		}
		doc := "The most a request may ask for " + kn.Key + "."
		if kn.Kind == budget.KindDuration {
			n.keys = append(n.keys, k(kn.Name, &node{kind: kDuration, min: kn.Min, max: kn.Max, doc: doc}))
		} else {
			n.keys = append(n.keys, k(kn.Name, &node{kind: kCount, min: kn.Min, max: kn.Max, doc: doc}))
		}
	}
	return n
}

func sortedProfiles() string {
	p := budget.DefaultProfiles()
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return p[names[i]] < p[names[j]] })
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + ": " + fmtDuration(p[n])
	}
	return strings.Join(parts, ", ")
}

// apiProvider is the shape of the openai and anthropic providers.
func apiProvider(name, doc, baseURL string) *node {
	return mapping(doc, nil,
		k("base_url", leaf(kURL, baseURL)),
		k("credentials", listOf(fmt.Sprintf("The credentials (auth profiles), tried in order when a model call fails in an LLM phase (first chunk, idle, HTTP 429/5xx), or the provider refuses a key (401, 403: the same model's next credential). Default: the one credential %s.", defaultKeyEnv[name]),
			mapping("One credential.", []string{"api_key_env"},
				k("api_key_env", leaf(kVarName, "The environment variable that holds the API key. The key itself never goes in the file, and records name the variable, never the key."))), 1)),
	)
}

// toolBudgetKeys are the budget keys of a tool entry (owner "the tool")
// and of an mcp override (owner "that tool", whose defaults are the
// entry's).
func toolBudgetKeys(owner, timeoutDef, idleDef, enfDef, approvalDef, approvalTimeoutDef string) []key {
	return []key{
		k("timeout", &node{kind: kToolTimeout, def: timeoutDef,
			doc: "The absolute limit of one call of " + owner + ": a duration, or the name of a profile (timeouts.profiles). It beats timeouts.tool and its flag and variable; progress never extends it. It cannot be 0 (to never interrupt a tool, keep a timeout and set enforcement: advisory) nor above timeouts.tool_max."}),
		k("idle_timeout", &node{kind: kDuration, min: minDuration, max: maxDuration, zeroOK: true, def: idleDef,
			doc: "The longest silence between two progress reports of one call of " + owner + " (phase tool_idle); 0 is off."}),
		k("enforcement", &node{kind: kEnforcement, def: enfDef,
			doc: "How the timeout is enforced: hard (stopped at the deadline, its whole process tree killed), cooperative (its context is cancelled; abandoned after timeouts.kill_grace — an exec tool is stopped whole either way, so for it cooperative acts as hard) or advisory (never interrupted by its own budget; an overrun is recorded and the result used)."}),
		k("approval", &node{kind: kApproval, def: approvalDef,
			doc: "Whether each call of " + owner + " waits for a person's decision before it runs (docs/approvals.md): required, or never. The wait has its own budget (approval_timeout); the tool's timeout starts when it runs, and the turn's ceiling does not count the wait. A denied call is not run (tool_denied)."}),
		k("approval_timeout", &node{kind: kDuration, min: minDuration, max: budget.MaxTurn, def: approvalTimeoutDef,
			doc: "How long a call of " + owner + " waits for a person's decision before it expires, not run (approval_expired). It beats timeouts.approval and its flag and variable; it cannot be 0, and needs approval: required."}),
	}
}

// agentFile is the tree of the agent file. It is built once, from
// Settings as they are at init.
var agentFile = buildAgentFile()

func buildAgentFile() *node {
	providers := strings.Join(providerNames, ", ")
	tool := mapping("One tool: an exec tool (a program run for each call) or an mcp entry (a server whose every tool becomes a tool).", []string{"name"},
		append([]key{
			k("name", leaf(kToolName, "The tool's name as the model sees it (letters, digits, _ and -, at most 64), unique in the file. For an mcp entry, the prefix of the server's tools.")),
			k("description", leaf(kText, "What the tool does, for the model (exec tools only).")),
			k("input_schema", leaf(kInputSchema, "The JSON Schema of the tool's arguments (exec tools only); arguments that fail it get a tool_error result naming the field, without running the tool.")),
			k("exec", listOf("The program and its arguments, as a list: never a shell string, never passed through a shell. A program with a / is relative to the agent file; one without is looked up in PATH. The call's JSON arrives on stdin; stdout is the result.",
				leaf(kArg, "A program or an argument."), 1)),
			k("mcp", &node{kind: kMapping, doc: "An MCP server: command (stdio) or url (streamable HTTP). Each tool T it lists becomes the tool NAME__T (two underscores).",
				keys: []key{
					k("command", listOf("The argv that starts a stdio server.", leaf(kArg, "A program or an argument."), 1)),
					k("url", leaf(kURL, "The URL of a streamable HTTP server.")),
					k("headers", &node{kind: kMap, name: "HEADER", doc: "HTTP headers sent to a url server.", elem: leaf(kArg, "The header's value.")}),
					k("on_ignored_cancel", &node{kind: kChoice, choices: OnIgnoredCancelNames, def: OnIgnoredCancelKeep,
						doc: "What timebox does when a call of a stdio server is cancelled (its timeout, idle timeout, the turn's end or a client's cancel) and the server has not answered it timeouts.kill_grace later: keep (the server runs on; the call's work may go on in it) or restart (its whole process tree is stopped, the other calls in flight on it fail with a tool_error saying why, and the next call starts a fresh server). A server that honours a cancel by going silent, as MCP allows, is restarted too: use restart for servers whose cancelled work runs on."}),
				},
				rules: map[string]any{
					"oneOf": []any{
						map[string]any{"required": []string{"command"}},
						map[string]any{"required": []string{"url"}},
					},
					"if":   map[string]any{"required": []string{"command"}},
					"then": map[string]any{"properties": map[string]any{"headers": false}},
					"else": map[string]any{"properties": map[string]any{"on_ignored_cancel": map[string]any{"const": OnIgnoredCancelKeep}}},
				}}),
		}, append(toolBudgetKeys("the tool", budget.KeyTool, "0", string(budget.Hard), string(ApprovalNever), budget.KeyApproval),
			k("env", listOf("The only environment variables the program (or a stdio MCP server) inherits, by name; an empty list passes none. Without this key it inherits timebox's environment but timebox's own secrets (TIMEBOX_TOKEN, TIMEBOX_DB, PGPASSWORD) and the providers' credential variables: name one here to pass it.",
				leaf(kVarName, "A variable's name."), 0)),
			k("user", leaf(kText, "Run the program (or a stdio MCP server) as this user, as systemd's User= does: NAME, NAME:GROUP, UID or UID:GID. The group is the user's primary group unless given, with the user's supplementary groups; HOME, USER and LOGNAME are the user's. Needs timebox to run as root (Linux and macOS); refused otherwise.")),
			k("workdir", leaf(kFile, "The program's working directory, relative to the agent file (exec tools only). Default: the agent file's directory.")),
			k("retries", &node{kind: kCount, min: 0, max: MaxRetries, def: "0",
				doc: "How many more times the Temporal engine may run a call whose worker was lost (died or stopped heartbeating) before it is reported lost. Only for tools whose calls are safe to run twice; the embedded engine never runs a call again."}),
			k("overrides", &node{kind: kMap, name: "TOOL", namePattern: ".", doc: "Budgets of single tools of an mcp entry, by the server's name for the tool (mcp entries only).",
				elem: mapping("The budget of one of the server's tools; what it does not set comes from the entry.", nil,
					toolBudgetKeys("that tool", "the entry's", "the entry's", "the entry's", "the entry's", "the entry's")...)}),
		)...)...)
	tool.rules = map[string]any{
		"oneOf": []any{
			map[string]any{"required": []string{"exec"}},
			map[string]any{"required": []string{"mcp"}},
		},
		"if": map[string]any{"required": []string{"mcp"}},
		"then": map[string]any{"properties": map[string]any{
			"description": false, "input_schema": false, "workdir": false}},
		"else": map[string]any{"properties": map[string]any{"overrides": false}},
	}

	return mapping("", []string{"model"},
		k("name", leaf(kText, "The agent's name, kept in every stored turn.")),
		k("instructions", leaf(kText, "The system instructions given to the model at the start of every turn.")),
		k("model", mapping("The model failover chain.", []string{"primary"},
			k("primary", leaf(kModelRef, "The model every turn starts with, as provider:model. Providers: "+providers+".")),
			k("fallbacks", listOf("The models tried in order after the primary when every credential of the previous one failed in an LLM phase. Tool, step, turn and compaction timeouts never switch models.",
				leaf(kModelRef, "A model, as provider:model."), 0)),
			k("max_tokens", &node{kind: kCount, min: 1, max: MaxMaxTokens, def: fmt.Sprint(DefaultMaxTokens),
				doc: "The most tokens one reply may have, asked of every model of the chain (OpenAI's max_completion_tokens, Anthropic's max_tokens). A reasoning model counts its reasoning in it."}),
		)),
		k("providers", mapping("The providers' settings. A provider the chain uses needs no entry unless it is script (which needs its file).", nil,
			k("openai", apiProvider("openai", "OpenAI, or any OpenAI-compatible endpoint.",
				"The API endpoint: any OpenAI-compatible Chat Completions endpoint (a local server, a gateway). Default: OpenAI's.")),
			k("anthropic", apiProvider("anthropic", "Anthropic.", "The API endpoint. Default: Anthropic's.")),
			k("script", mapping("The script model: a deterministic model that plays a JSONL file of replies with their timings (docs/script-model.md).", nil,
				k("file", leaf(kFile, "The JSONL script, relative to the agent file.")))),
		)),
		k("timeouts", section("timeouts", "Time budgets of the whole process: each one's flag and variable beat the file.",
			k("profiles", &node{kind: kMap, name: "PROFILE", namePattern: profileNameRE.String(), def: sortedProfiles(),
				doc:  "Named durations a tool may use as its timeout (timeout: slow). The file's profiles are added to the built-in ones, and may redefine them.",
				elem: &node{kind: kDuration, min: minDuration, max: maxDuration, doc: "The profile's duration; it cannot be 0."}}))),
		k("limits", section("limits", "Count and size limits of a turn.")),
		k("context", section("context", "The conversation's size, and whether the model is told its time.")),
		k("server", section("server", "Settings of timebox serve.", k("request_max", requestMax()), k("webhooks", webhooks()))),
		k("tools", listOf("The tools the model may call. Go-function tools are added from code (the library); they have no entry here.", tool, 0)),
	)
}

// The patterns of the schema, in the regular-expression dialect JSON
// Schema uses (ECMA-262), which these stay inside of.
const (
	durationPattern = `^\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`
	countPattern    = `^\s*[0-9]+\s*$`
	sizePattern     = `^\s*[0-9]+\s*([bB]|[kKmMgG][iI][bB])?\s*$`
	urlPattern      = `^https?://[^/?#\s]+`
)

// Schema returns the JSON Schema (draft 2020-12) of the agent file, as
// `timebox schema` prints it: indented, ending with a newline. An editor
// given it (yaml-language-server: `# yaml-language-server:
// $schema=agent.schema.json`) completes keys and underlines unknown ones.
//
// The schema checks keys and the form of each value; Load checks more
// (files that must exist, a tool timeout against timeouts.tool_max, the
// bounds of a duration), so a file the schema accepts can still be
// refused, never the other way round.
func Schema() []byte {
	s := schemaOf(agentFile)
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["title"] = "timebox agent file"
	s["description"] = "An agent: its model, its providers, its time budgets and limits, and its tools. Every key is optional except model.primary. Reference: docs/agent-file.md."
	s["patternProperties"] = map[string]any{
		"^x-": map[string]any{"description": "Free for the author: a place for anchors (x-defaults: &defaults {...}) that the rest of the file uses. timebox ignores it."},
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		panic("config: the schema cannot be written as JSON: " + err.Error()) // it is built of maps, lists and strings
	}
	return append(b, '\n')
}

// scalar is the JSON type of a value the loader reads as text: a string,
// or a number or true/false taken as written, so that the schema never
// refuses a file Load accepts.
var scalar = []string{"string", "number", "boolean"}

// schemaOf returns the JSON Schema of n.
func schemaOf(n *node) map[string]any {
	s := map[string]any{}
	switch n.kind {
	case kMapping:
		s["type"] = []string{"object", "null"} // an empty section (timeouts:) is an empty mapping
		props := map[string]any{}
		for _, kk := range n.keys {
			props[kk.name] = schemaOf(kk.n)
		}
		s["properties"] = props
		s["additionalProperties"] = false
		if len(n.required) > 0 {
			s["required"] = n.required
			s["type"] = "object"
		}
		for kw, v := range n.rules {
			s[kw] = v
		}
	case kMap:
		s["type"] = []string{"object", "null"}
		if n.namePattern != "" {
			s["patternProperties"] = map[string]any{n.namePattern: schemaOf(n.elem)}
			s["additionalProperties"] = false
		} else {
			s["additionalProperties"] = schemaOf(n.elem)
		}
	case kList:
		s["type"] = []string{"array", "null"}
		s["items"] = schemaOf(n.elem)
		if n.minItems > 0 {
			s["type"] = "array"
			s["minItems"] = n.minItems
		}
	case kText, kArg:
		// The loader takes a number or true/false where it wants text, as
		// written: [./x, --depth, 2] has the argument "2".
		s["type"] = scalar
	case kFile:
		s["type"] = scalar
		s["minLength"] = 1
	case kModelRef:
		s["type"] = "string"
		s["pattern"] = `^\s*(` + strings.Join(providerNames, "|") + `)\s*:\s*\S`
	case kURL:
		s["type"] = "string"
		s["pattern"] = urlPattern
	case kVarName:
		s["type"] = scalar // a pattern applies to strings only
		s["pattern"] = envNameRE.String()
	case kToolName:
		s["type"] = scalar
		s["pattern"] = tool.NameRE.String()
	case kEnforcement:
		s["enum"] = enforcementNames
	case kApproval:
		s["enum"] = approvalNames
	case kChoice:
		s["enum"] = n.choices
	case kToolTimeout:
		s["anyOf"] = []any{
			map[string]any{"type": "string", "pattern": durationPattern},
			map[string]any{"type": "string", "pattern": profileNameRE.String()},
		}
	case kDuration:
		durationSchema(s, n.zeroOK)
	case kCount:
		countSchema(s, n.min, n.max, n.zeroOK, countPattern)
	case kSetting:
		st, ok := SettingByKey(n.setting)
		if !ok {
			panic("config: no setting " + n.setting)
		}
		switch st.Kind {
		case KindDuration:
			durationSchema(s, st.ZeroOK)
			if st.Default == "0" {
				s["default"] = 0
			} else {
				s["default"] = st.Default
			}
		case KindBytes:
			countSchema(s, st.Min, st.Max, st.ZeroOK, sizePattern)
			s["default"] = st.Default
		case KindSwitch:
			s["type"] = "string"
			s["enum"] = []any{"on", "off"}
			s["default"] = st.Default
		default:
			countSchema(s, st.Min, st.Max, st.ZeroOK, countPattern)
			var d int64
			fmt.Sscan(st.Default, &d)
			s["default"] = d
		}
	case kWebhookEvent:
		s["anyOf"] = []any{
			map[string]any{"type": "string", "enum": WebhookEventTypes},
			map[string]any{"type": "object", "additionalProperties": false, "required": []string{"type"},
				"properties": map[string]any{
					"type":     map[string]any{"type": "string", "enum": WebhookEventTypes},
					"outcomes": map[string]any{"type": "array", "minItems": 1, "items": map[string]any{"type": "string", "enum": WebhookOutcomes}},
				}},
		}
	case kInputSchema:
		s["type"] = "object"
		s["properties"] = map[string]any{"type": map[string]any{"const": "object"}}
	}
	if d := describe(n); d != "" {
		s["description"] = d
	}
	return s
}

func durationSchema(s map[string]any, zeroOK bool) {
	str := map[string]any{"type": "string", "pattern": durationPattern}
	if !zeroOK {
		s["type"] = "string"
		s["pattern"] = durationPattern
		return
	}
	s["anyOf"] = []any{str, map[string]any{"const": 0}, map[string]any{"const": "0"}}
}

// countSchema: a number, or the same written as text (flags and variables
// are text, and the file may quote it).
func countSchema(s map[string]any, lo, hi int64, zeroOK bool, pattern string) {
	num := map[string]any{"type": "integer", "minimum": lo, "maximum": hi}
	if zeroOK && lo <= 1 {
		num["minimum"] = 0
	}
	alts := []any{num, map[string]any{"type": "string", "pattern": pattern}}
	if zeroOK && lo > 1 {
		alts = append(alts, map[string]any{"const": 0})
	}
	s["anyOf"] = alts
}

// describe is the description the schema gives n: its doc, then for a
// setting its default, bounds, flag and variable, so that an editor's
// hover says all of it.
func describe(n *node) string {
	d := n.doc
	if n.kind == kSetting {
		st, _ := SettingByKey(n.setting)
		return fmt.Sprintf("%s. Default %s; %s. Flag --%s, variable %s (flag > variable > file > default).",
			upperFirst(st.Doc), st.Default, boundsText(st), st.Flag, st.Env)
	}
	if n.def != "" && n.def != "0" {
		d += " Default: " + n.def + "."
	}
	return d
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// boundsText words a setting's bounds: "1ms to 24h, or 0 (off)".
func boundsText(s Setting) string {
	if s.Kind == KindSwitch {
		return "on or off"
	}
	var r string
	switch s.Kind {
	case KindDuration:
		r = fmtDuration(time.Duration(s.Min)) + " to " + fmtDuration(time.Duration(s.Max))
	case KindBytes:
		r = budget.FormatBytes(s.Min) + " to " + budget.FormatBytes(s.Max)
	default:
		r = fmt.Sprint(s.Min) + " to " + fmt.Sprint(s.Max)
	}
	if s.ZeroOK {
		// format shows what 0 means: off, or 0s for the graces (at once).
		if s.format(0) == "off" {
			r += ", or 0 (off)"
		} else {
			r += ", or 0 (at once)"
		}
	}
	return r
}
