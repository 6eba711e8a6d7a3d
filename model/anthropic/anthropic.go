// Package anthropic is the model provider for Anthropic's Messages API
// (spec §11), streaming, with tool use, through the official SDK
// (github.com/anthropics/anthropic-sdk-go).
//
// The SDK's own retries and timeouts are off: timebox's budgets decide when
// a call has taken too long and its failover decides what to try next.
package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"
	"github.com/anthropics/anthropic-sdk-go/packages/ssestream"

	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/internal/streams"
)

// DefaultBaseURL is Anthropic's own endpoint.
const DefaultBaseURL = "https://api.anthropic.com"

// DefaultMaxTokens is the reply length asked for when Options.MaxTokens is
// zero. The Messages API requires one; this is enough for an agent step
// and within every current model's output limit.
const DefaultMaxTokens = 4096

// continuePrompt opens a history that would otherwise start with an
// assistant message or be empty, both of which the Messages API refuses (a
// compacted history can open with the assistant, once its summary went to
// the system prompt).
const continuePrompt = "(continuing the conversation above)"

// Options configure a Provider.
type Options struct {
	// BaseURL is the endpoint, with or without its "/v1"
	// ("https://api.anthropic.com"); empty is DefaultBaseURL.
	BaseURL string
	// APIKey is sent as x-api-key.
	APIKey string
	// MaxTokens caps each reply; zero is DefaultMaxTokens.
	MaxTokens int64
	// HTTPClient is the client to use; nil is a client with no timeout of
	// its own (the watchdogs bound every stream).
	HTTPClient *http.Client
}

// Provider streams messages from one endpoint with one key. It is safe for
// concurrent use.
type Provider struct {
	client    sdk.Client
	maxTokens int64
}

// New returns a provider for o.
func New(o Options) *Provider {
	base := strings.TrimSuffix(o.BaseURL, "/")
	base = strings.TrimSuffix(base, "/v1")
	if base == "" {
		base = DefaultBaseURL
	}
	hc := &http.Client{}
	if o.HTTPClient != nil {
		c := *o.HTTPClient
		hc = &c
	}
	hc.Transport = streams.Only(hc.Transport, "anthropic")
	mt := o.MaxTokens
	if mt <= 0 {
		mt = DefaultMaxTokens
	}
	return &Provider{maxTokens: mt, client: sdk.NewClient(
		option.WithBaseURL(base+"/"),
		option.WithAPIKey(o.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	)}
}

// Stream sends req and returns its reply stream. The HTTP request is made
// when the stream is opened by the SDK; a connection failure or an HTTP
// error status comes from the first Recv as a *model.Error.
func (p *Provider) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	params, err := p.toParams(req)
	if err != nil {
		return nil, &model.Error{Provider: "anthropic", Status: 400, Message: err.Error()}
	}
	var opts []option.RequestOption
	if req.TraceParent != "" {
		opts = append(opts, option.WithHeader("traceparent", req.TraceParent))
	}
	s := p.client.Messages.NewStreaming(ctx, params, opts...)
	return &stream{ctx: ctx, s: s, blocks: map[int64]*block{}, textKept: req.TextKept}, nil
}

// toParams maps a request to the Messages API: the system prompt apart,
// tool results as user-role tool_result blocks, consecutive messages of one
// role merged (the API wants them alternating), and a history opening with
// the assistant given a user turn first.
//
// The API refuses a text block that is empty or only white space, so such
// text is left out: an assistant message that was only tool calls, a tool
// that printed nothing (its tool_result goes without content).
func (p *Provider) toParams(req model.Request) (sdk.MessageNewParams, error) {
	var msgs []sdk.MessageParam
	add := func(role sdk.MessageParamRole, b sdk.ContentBlockParamUnion) {
		if n := len(msgs); n > 0 && msgs[n-1].Role == role {
			msgs[n-1].Content = append(msgs[n-1].Content, b)
			return
		}
		msgs = append(msgs, sdk.MessageParam{Role: role, Content: []sdk.ContentBlockParamUnion{b}})
	}
	for _, m := range req.Messages {
		switch m.Role {
		case model.RoleUser:
			if !blank(m.Content) {
				add(sdk.MessageParamRoleUser, sdk.NewTextBlock(m.Content))
			}
		case model.RoleTool:
			r := sdk.ToolResultBlockParam{ToolUseID: m.ToolCallID}
			if !blank(m.Content) {
				r.Content = []sdk.ToolResultBlockParamContentUnion{{OfText: &sdk.TextBlockParam{Text: m.Content}}}
			}
			add(sdk.MessageParamRoleUser, sdk.ContentBlockParamUnion{OfToolResult: &r})
		case model.RoleAssistant:
			if !blank(m.Content) {
				add(sdk.MessageParamRoleAssistant, sdk.NewTextBlock(m.Content))
			}
			for _, c := range m.ToolCalls {
				add(sdk.MessageParamRoleAssistant, sdk.NewToolUseBlock(c.ID, toolInput(c.Arguments), c.Name))
			}
		default:
			return sdk.MessageNewParams{}, fmt.Errorf("message role %q is not supported", m.Role)
		}
	}
	if len(msgs) == 0 || msgs[0].Role != sdk.MessageParamRoleUser {
		msgs = append([]sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(continuePrompt))}, msgs...)
	}
	if req.TimeNote != "" {
		// The Messages API has no system role mid-conversation: the note
		// ends the last user turn, after everything the cache holds
		// (docs/decisions/time-notes.md).
		add(sdk.MessageParamRoleUser, sdk.NewTextBlock(req.TimeNote))
	}
	params := sdk.MessageNewParams{Model: sdk.Model(req.Model), MaxTokens: p.maxTokens, Messages: msgs}
	if req.System != "" {
		params.System = []sdk.TextBlockParam{{Text: req.System}}
	}
	for _, t := range req.Tools {
		schema := sdk.ToolInputSchemaParam{Properties: map[string]any{}}
		if len(t.Parameters) > 0 {
			var s map[string]any
			if err := json.Unmarshal(t.Parameters, &s); err != nil {
				return sdk.MessageNewParams{}, fmt.Errorf("tool %s: parameters: %v", t.Name, err)
			}
			// Properties and required have fields of their own; the rest
			// (additionalProperties, $defs…) goes as it is. "type" is
			// always "object".
			schema.Properties = s["properties"]
			if schema.Properties == nil {
				schema.Properties = map[string]any{}
			}
			if req, ok := s["required"].([]any); ok {
				for _, r := range req {
					if name, ok := r.(string); ok {
						schema.Required = append(schema.Required, name)
					}
				}
			}
			for k, v := range s {
				if k != "type" && k != "properties" && k != "required" {
					if schema.ExtraFields == nil {
						schema.ExtraFields = map[string]any{}
					}
					schema.ExtraFields[k] = v
				}
			}
		}
		tp := sdk.ToolParam{Name: t.Name, InputSchema: schema}
		if t.Description != "" {
			tp.Description = sdk.String(t.Description)
		}
		params.Tools = append(params.Tools, sdk.ToolUnionParam{OfTool: &tp})
	}
	return params, nil
}

// blank reports whether text is empty or only white space.
func blank(text string) bool { return strings.TrimSpace(text) == "" }

// toolInput is a tool call's arguments as the tool_use block's input, which
// must be a JSON object. Arguments the model sent that were not one (a
// truncated call) are kept as a string under "_raw", so the history stays
// valid and nothing the model said is lost.
func toolInput(args string) any {
	var v map[string]any
	if strings.TrimSpace(args) == "" {
		return map[string]any{}
	}
	if err := json.Unmarshal([]byte(args), &v); err != nil || v == nil {
		return map[string]any{"_raw": args}
	}
	return json.RawMessage(args)
}

// block is one content block of the reply being streamed.
type block struct {
	typ  string // text, tool_use, or another type that is ignored
	call model.ToolCall
	// args collects a tool call's input_json_delta pieces; joining strings
	// would copy the whole so far for each of possibly thousands.
	args strings.Builder
}

// stream is one streamed reply.
type stream struct {
	ctx  context.Context
	s    *ssestream.Stream[sdk.MessageStreamEventUnion]
	text model.Text
	// textKept: the caller keeps the text (Request.TextKept); text
	// stays empty.
	textKept bool
	blocks   map[int64]*block
	order    []int64
	stop     string
	usage    model.Usage
	stopped  bool // message_stop arrived
	done     bool
	err      error
}

// Recv returns one chunk per server-sent event (pings are not events).
func (s *stream) Recv() (model.Chunk, error) {
	if s.err != nil {
		return model.Chunk{}, s.err
	}
	if s.done {
		return model.Chunk{}, io.EOF
	}
	if !s.s.Next() {
		err := s.s.Err()
		switch {
		case err == nil && !s.stopped:
			s.err = &model.Error{Provider: "anthropic", Message: "the stream ended before the reply was complete (no message_stop)"}
		case err == nil:
			s.done = true
			return model.Chunk{}, io.EOF
		default:
			s.err = s.classify(err)
		}
		return model.Chunk{}, s.err
	}
	ev := s.s.Current()
	var out model.Chunk
	if ev.Type == "" {
		// Data that is not an event (the SDK reads "5" as one with no
		// type): dropping it would lose what the model sent unsaid.
		s.err = &model.Error{Provider: "anthropic", Malformed: true,
			Message: "an event that is not a JSON object with a type: " + clipRaw(ev.RawJSON())}
		return model.Chunk{}, s.err
	}
	switch ev.Type {
	case "content_block_start":
		b := &block{typ: ev.ContentBlock.Type}
		if b.typ == "tool_use" {
			b.call = model.ToolCall{ID: ev.ContentBlock.ID, Name: ev.ContentBlock.Name}
			out.ToolBytes = len(ev.ContentBlock.Name)
		}
		if b.typ == "text" {
			out.Text = ev.ContentBlock.Text
		}
		if _, seen := s.blocks[ev.Index]; !seen {
			s.order = append(s.order, ev.Index)
		}
		s.blocks[ev.Index] = b
	case "content_block_delta":
		b := s.blocks[ev.Index]
		if b == nil {
			s.err = &model.Error{Provider: "anthropic", Malformed: true,
				Message: fmt.Sprintf("content_block_delta for block %d, which was never started", ev.Index)}
			return model.Chunk{}, s.err
		}
		switch ev.Delta.Type {
		case "text_delta":
			out.Text = ev.Delta.Text
		case "input_json_delta":
			b.args.WriteString(ev.Delta.PartialJSON)
			out.ToolBytes = len(ev.Delta.PartialJSON)
		case "":
			s.err = &model.Error{Provider: "anthropic", Malformed: true,
				Message: fmt.Sprintf("a content_block_delta for block %d without a delta type: %s", ev.Index, clipRaw(ev.RawJSON()))}
			return model.Chunk{}, s.err
		}
	case "message_start":
		s.usage.InputTokens = ev.Message.Usage.InputTokens
		s.usage.OutputTokens = ev.Message.Usage.OutputTokens
	case "message_delta":
		if ev.Delta.StopReason != "" {
			s.stop = string(ev.Delta.StopReason)
		}
		// The counts in message_delta are cumulative.
		if ev.Usage.OutputTokens > 0 {
			s.usage.OutputTokens = ev.Usage.OutputTokens
		}
		if ev.Usage.InputTokens > 0 {
			s.usage.InputTokens = ev.Usage.InputTokens
		}
	case "message_stop":
		s.stopped = true
	}
	if !s.textKept {
		s.text.Add(out.Text)
	}
	return out, nil
}

// clipRaw returns the start of an event's raw data, to show in an error.
func clipRaw(raw string) string {
	if len(raw) > 200 {
		return strings.ToValidUTF8(raw[:200], "") + "…"
	}
	return raw
}

// errorStatus is the HTTP status an error type stands for, for an error
// sent in the event stream after a 200.
var errorStatus = map[string]int{
	"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
	"permission_error": 403, "not_found_error": 404, "request_too_large": 413,
	"rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}

// classify turns an SDK or transport error into a *model.Error, keeping the
// context's own cause when the stream was cancelled.
func (s *stream) classify(err error) error {
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	var me *model.Error // streams.Only's
	if errors.As(err, &me) {
		return me
	}
	var apiErr *sdk.Error
	if errors.As(err, &apiErr) {
		typ, msg := errorBody(apiErr.RawJSON())
		status := apiErr.StatusCode
		if status == http.StatusOK || status == 0 { // an error event inside the stream
			status = errorStatus[typ]
			if status == 0 {
				status = 500
			}
		}
		me := &model.Error{Provider: "anthropic", Status: status, Message: msg, Err: err}
		if me.Message == "" {
			me.Message = strings.TrimSpace(apiErr.RawJSON())
		}
		if me.Message == "" {
			me.Message = http.StatusText(status)
		}
		if typ != "" && !strings.Contains(me.Message, typ) {
			me.Message = typ + ": " + me.Message
		}
		if apiErr.Response != nil {
			me.RetryAfter = model.ParseRetryAfter(apiErr.Response.Header.Get("Retry-After"), time.Now())
		}
		// "prompt is too long: 210000 tokens > 200000 maximum", or a body
		// over the request size limit (request_too_large, 413).
		me.TooLong = model.IsTooLong(status, typ, me.Message)
		return me
	}
	return model.TransportError("anthropic", err)
}

// errorBody reads {"type": "error", "error": {"type": ..., "message": ...}}.
func errorBody(raw string) (typ, msg string) {
	var b struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(raw), &b) != nil {
		return "", ""
	}
	return b.Error.Type, b.Error.Message
}

// Response returns the assembled reply: its text, and its tool calls in
// the order their blocks came.
func (s *stream) Response() model.Response {
	r := model.Response{Text: s.text.String(), FinishReason: s.stop, Usage: s.usage}
	for _, i := range s.order {
		if b := s.blocks[i]; b.typ == "tool_use" {
			c := b.call
			c.Arguments = b.args.String()
			if c.Arguments == "" { // a call without input streams no delta
				c.Arguments = "{}"
			}
			r.ToolCalls = append(r.ToolCalls, c)
		}
	}
	return r
}

// Close releases the HTTP response.
func (s *stream) Close() error { return s.s.Close() }
