// Package config loads and checks an agent file (spec §10, §15) and
// resolves every budget with its source: flag > TIMEBOX_* environment >
// agent file > default, a tool's own timeout or profile winning over all of
// them for that tool (spec §2).
//
// Load checks the whole file before anything runs and returns every problem
// at once, each with file:line:col, the key and a fix.
package config

import (
	"encoding/json"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

// Agent is a loaded, checked and resolved agent file.
type Agent struct {
	// Path is the agent file as given; Dir is its directory, against which
	// relative paths in the file were resolved.
	Path string
	Dir  string

	// Name is the agent's name (name:), kept in every stored turn; empty
	// when the file has none.
	Name string
	// Instructions are the system instructions given to the model at the
	// start of every turn (instructions:); empty for none.
	Instructions string
	// Model is the model failover chain (model:).
	Model Chain
	// Providers maps a provider name ("openai", "anthropic", "script") to
	// its settings.
	Providers map[string]Provider
	// Budgets and Limits are the process-wide timeouts and limits,
	// resolved flag > environment > file > default, each with its source
	// and knob.
	Budgets budget.Budgets
	Limits  budget.Limits
	// Profiles are the timeout profiles: the defaults, then the file's.
	Profiles map[string]time.Duration
	// Context holds the settings under context: (compaction, time notes).
	Context Context
	// Server holds the settings under server:, for `timebox serve`.
	Server Server
	// Tools are the file's tool entries, in order. Go-function tools are
	// added from code and are not among them.
	Tools []Tool

	// Warnings are doubtful but harmless findings, each a full sentence
	// ready to print: an unknown TIMEBOX_* variable (with a suggestion),
	// an empty one, an idle_timeout that can never fire.
	Warnings []string
}

// Chain is the model failover chain.
type Chain struct {
	// Primary is model.primary, the model every turn starts with.
	Primary ModelRef
	// Fallbacks are model.fallbacks, tried in order after the primary when
	// every credential of the previous model failed in an LLM phase;
	// empty for none.
	Fallbacks []ModelRef
	// MaxTokens is model.max_tokens: the most tokens one reply may have,
	// asked of every model of the chain (OpenAI max_completion_tokens,
	// Anthropic max_tokens). Load fills in DefaultMaxTokens.
	MaxTokens int64
}

// DefaultMaxTokens is model.max_tokens when the file does not set it.
const DefaultMaxTokens = 4096

// MaxMaxTokens bounds model.max_tokens.
const MaxMaxTokens = 1_000_000

// All returns the primary followed by the fallbacks.
func (c Chain) All() []ModelRef { return append([]ModelRef{c.Primary}, c.Fallbacks...) }

// ModelRef is "provider:model".
type ModelRef struct {
	// Provider is openai, anthropic or script.
	Provider string
	// Model is the model's name, as the provider knows it.
	Model string
}

// String returns the ref as the agent file writes it, "provider:model".
func (m ModelRef) String() string { return m.Provider + ":" + m.Model }

// Provider holds one provider's settings.
type Provider struct {
	// BaseURL is the API endpoint (openai, anthropic); empty for the
	// provider's own default.
	BaseURL string
	// Credentials are tried in order on LLM-phase failures.
	Credentials []Credential
	// File is the script provider's JSONL file, made absolute.
	File string
	// Script holds File's lines, parsed when the file was loaded, so that
	// the agent plays what was checked.
	Script []script.Line
}

// Credential names where an API key comes from. The key itself is read at
// the time the agent is built and never stored in records.
type Credential struct {
	// APIKeyEnv is api_key_env: the environment variable that holds the
	// key. Records name the variable, never the key.
	APIKeyEnv string
}

// Context holds the settings of what the model is sent: history
// compaction and time notes.
type Context struct {
	// CompactAt is the estimated prompt size, in tokens, above which older
	// history is summarised (default 100000; 0 is off).
	CompactAt int
	// Source and Knob say where CompactAt came from (flag, env, file or
	// default) and what changes it, as for every other setting.
	Source budget.Source
	Knob   string
	// TimeNotes is context.time_notes: whether the model is told its time
	// (each tool's budget, the turn's time and tool calls left, each
	// result's duration against its budget). On by default.
	TimeNotes bool
	// TimeNotesSource and TimeNotesKnob say where TimeNotes came from.
	TimeNotesSource budget.Source
	TimeNotesKnob   string
}

// Server holds `timebox serve` settings.
type Server struct {
	// ShutdownGrace is how long running turns may go on after SIGTERM
	// before they are cancelled (default 10s).
	ShutdownGrace budget.Duration
	// RequestMax is server.request_max: the ceiling up to which one
	// request's budgets may raise each budget, by its short name ("turn",
	// "max_steps"), in nanoseconds or a count. A budget it does not name
	// may only be lowered by a request.
	RequestMax map[string]int64
	// Webhooks are server.webhooks: the receivers `timebox serve` POSTs
	// the events they subscribe to (docs/webhooks.md). Their secrets are
	// read from the environment (Agent.WebhookSecrets).
	Webhooks []Webhook
}

// Tool is one resolved tool entry.
type Tool struct {
	// Name is the tool's name as the model sees it, unique in the file;
	// for an mcp entry, the prefix of the server's tools (NAME__TOOL).
	Name string
	// Description says what the tool does, for the model (exec tools).
	Description string
	// InputSchema is the entry's input_schema as JSON; nil when absent.
	InputSchema json.RawMessage
	// Kind is exec or mcp: the file declares no Go tools.
	Kind tool.Kind
	// Budget is the entry's resolved budget: its timeout with source
	// (tool, profile:NAME, flag, env, file, default), idle timeout,
	// enforcement and the kill grace.
	Budget budget.ToolBudget
	// Approval is the entry's approval (Load fills in ApprovalNever when
	// it has none): whether each call waits for a person's decision before
	// it runs. An mcp entry's overrides may say otherwise for single tools
	// (ApprovalFor).
	Approval Approval
	// ApprovalTimeout is how long a call waits for that decision before
	// it expires, not run: the entry's approval_timeout (source tool), or
	// timeouts.approval with its source when it has none.
	ApprovalTimeout budget.Duration
	// Retries is how many more times the Temporal engine may run a call
	// whose worker was lost (retries:, 0 to MaxRetries; default 0): only
	// for tools whose calls are safe to run twice.
	Retries int

	// Exec is the argv of an exec tool; a relative program path that
	// contains a slash is made absolute against the agent file's directory.
	Exec []string
	// Env is the allowlist of variables an exec tool inherits; nil means
	// the whole environment but what timebox withholds (Agent.Withheld).
	Env []string
	// User, when set, is who the program (or a stdio MCP server) runs as
	// (user:, NAME[:GROUP] or UID[:GID]); timebox.Build looks it up, and
	// timebox must run as root.
	User string
	// UserWhere is where User is written, as a problem of the file is
	// placed ("agent.yaml:4:36: tools[0].user"), for what timebox.Build
	// finds wrong with it.
	UserWhere string
	// Workdir is the exec tool's working directory, made absolute; empty is
	// the agent file's directory. Load fills it with that directory when
	// the entry has none, so that a tool never runs in whatever directory
	// the process happened to start in.
	Workdir string

	// MCP is set for an mcp entry.
	MCP *MCP
}

// MCP is an mcp tool entry's server.
type MCP struct {
	// Command is a stdio server's argv; URL a streamable HTTP server's.
	Command []string
	URL     string
	// Headers are HTTP headers sent with every request to a URL server;
	// nil for none.
	Headers map[string]string
	// Env is the allowlist of variables a stdio server inherits.
	Env []string
	// Overrides are per-tool budgets by the server's tool name.
	Overrides map[string]Override
	// OnIgnoredCancel is what to do with a stdio server that has not
	// answered a cancelled call kill_grace after its cancellation:
	// OnIgnoredCancelKeep (the default, "") or OnIgnoredCancelRestart.
	OnIgnoredCancel string
}

// The values of mcp.on_ignored_cancel.
const (
	OnIgnoredCancelKeep    = "keep"
	OnIgnoredCancelRestart = "restart"
)

// OnIgnoredCancelNames are the values mcp.on_ignored_cancel takes.
var OnIgnoredCancelNames = []string{OnIgnoredCancelKeep, OnIgnoredCancelRestart}

// Override is a per-tool budget override inside an mcp entry. Each field's
// Source is empty when the override does not set it.
type Override struct {
	// Timeout, IdleTimeout and Enforcement replace the entry's for the one
	// tool when the override sets them.
	Timeout     budget.Duration
	IdleTimeout budget.Duration
	Enforcement budget.Enforcement
	// Approval is "" when the override does not set it (the entry's
	// applies); ApprovalTimeout's Source is empty likewise.
	Approval        Approval
	ApprovalTimeout budget.Duration
}
