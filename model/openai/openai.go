// Package openai is the model provider for any OpenAI-compatible Chat
// Completions endpoint (spec §11), streaming, with tool calls, through the
// official SDK (github.com/openai/openai-go/v3).
//
// The SDK's own retries and timeouts are off: timebox's budgets decide when
// a call has taken too long and its failover decides what to try next.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"

	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/internal/streams"
)

// DefaultBaseURL is OpenAI's own endpoint.
const DefaultBaseURL = "https://api.openai.com/v1"

// Options configure a Provider.
type Options struct {
	// BaseURL is the endpoint, e.g. "http://localhost:11434/v1"; empty is
	// DefaultBaseURL.
	BaseURL string
	// APIKey is sent as a bearer token.
	APIKey string
	// HTTPClient is the client to use; nil is a client with no timeout of
	// its own (the watchdogs bound every stream).
	HTTPClient *http.Client
	// MaxTokens caps each reply, sent as max_completion_tokens (which
	// counts a reasoning model's hidden reasoning too); zero is
	// DefaultMaxTokens.
	MaxTokens int64
}

// DefaultMaxTokens is the reply length asked for when Options.MaxTokens is
// zero: the agent file's model.max_tokens default, the same for every
// provider. It is enough for an agent step and inside every current
// model's output limit, so that a model that never stops is stopped by its
// provider long before limits.max_reply.
const DefaultMaxTokens = 4096

// Provider streams chat completions from one endpoint with one key. It is
// safe for concurrent use.
type Provider struct {
	client    sdk.Client
	maxTokens int64
}

// New returns a provider for o.
func New(o Options) *Provider {
	base := o.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	hc := &http.Client{}
	if o.HTTPClient != nil {
		c := *o.HTTPClient
		hc = &c
	}
	hc.Transport = streams.Only(hc.Transport, "openai")
	mt := o.MaxTokens
	if mt <= 0 {
		mt = DefaultMaxTokens
	}
	return &Provider{maxTokens: mt, client: sdk.NewClient(
		option.WithBaseURL(strings.TrimSuffix(base, "/")+"/"),
		option.WithAPIKey(o.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0),
	)}
}

// Stream sends req and returns its reply stream. The HTTP request is made
// by the first Recv (the SDK sends it lazily), so a connection failure or an
// HTTP error status comes from there as a *model.Error.
func (p *Provider) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	params, err := toParams(req)
	if err != nil {
		return nil, &model.Error{Provider: "openai", Status: 400, Message: err.Error()}
	}
	params.MaxCompletionTokens = sdk.Int(p.maxTokens)
	// The usage comes in one more chunk before the end, for the call's
	// record and its trace span.
	params.StreamOptions.IncludeUsage = sdk.Bool(true)
	var opts []option.RequestOption
	if req.TraceParent != "" {
		opts = append(opts, option.WithHeader("traceparent", req.TraceParent))
	}
	s := p.client.Chat.Completions.NewStreaming(ctx, params, opts...)
	return &stream{ctx: ctx, s: s, byIndex: map[int64]*call{}, textKept: req.TextKept}, nil
}

func toParams(req model.Request) (sdk.ChatCompletionNewParams, error) {
	var msgs []sdk.ChatCompletionMessageParamUnion
	if req.System != "" {
		msgs = append(msgs, sdk.SystemMessage(req.System))
	}
	for _, m := range req.Messages {
		switch m.Role {
		case model.RoleUser:
			msgs = append(msgs, sdk.UserMessage(m.Content))
		case model.RoleTool:
			msgs = append(msgs, sdk.ToolMessage(m.Content, m.ToolCallID))
		case model.RoleAssistant:
			a := sdk.ChatCompletionAssistantMessageParam{}
			if m.Content != "" {
				a.Content.OfString = sdk.String(m.Content)
			}
			for _, c := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, sdk.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &sdk.ChatCompletionMessageFunctionToolCallParam{
						ID:       c.ID,
						Function: sdk.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments},
					},
				})
			}
			msgs = append(msgs, sdk.ChatCompletionMessageParamUnion{OfAssistant: &a})
		default:
			return sdk.ChatCompletionNewParams{}, fmt.Errorf("message role %q is not supported", m.Role)
		}
	}
	if req.TimeNote != "" {
		// After the conversation, so that the cached prefix is the same
		// from one request to the next (docs/decisions/time-notes.md).
		msgs = append(msgs, sdk.SystemMessage(req.TimeNote))
	}
	params := sdk.ChatCompletionNewParams{Model: shared.ChatModel(req.Model), Messages: msgs}
	for _, t := range req.Tools {
		fp := shared.FunctionParameters{"type": "object", "properties": map[string]any{}}
		if len(t.Parameters) > 0 {
			fp = shared.FunctionParameters{}
			if err := json.Unmarshal(t.Parameters, &fp); err != nil {
				return sdk.ChatCompletionNewParams{}, fmt.Errorf("tool %s: parameters: %v", t.Name, err)
			}
		}
		fd := shared.FunctionDefinitionParam{Name: t.Name, Parameters: fp}
		if t.Description != "" {
			fd.Description = sdk.String(t.Description)
		}
		params.Tools = append(params.Tools, sdk.ChatCompletionFunctionTool(fd))
	}
	return params, nil
}

// stream is one streamed reply. Tool calls arrive as fragments keyed by
// index: the id and name in the first, the arguments in pieces.
type stream struct {
	ctx  context.Context
	s    *ssestream.Stream[sdk.ChatCompletionChunk]
	text model.Text
	// textKept: the caller keeps the text (Request.TextKept); text
	// stays empty.
	textKept bool
	// calls are the reply's tool calls in the order they began; byIndex
	// the one each stream index now adds to.
	calls   []*call
	byIndex map[int64]*call
	finish  string
	usage   model.Usage
	done    bool
	err     error
}

// call is a tool call being assembled. Its pieces go to builders: a reply
// may carry thousands of fragments, and joining strings would copy the
// whole so far for each one.
type call struct {
	id         string
	name, args strings.Builder
}

// Recv returns one chunk per server-sent event.
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
		case err == nil && s.finish == "":
			s.err = &model.Error{Provider: "openai", Message: "the stream ended before the reply was complete (no finish_reason)"}
		case err == nil:
			s.done = true
			return model.Chunk{}, io.EOF
		default:
			s.err = s.classify(err)
		}
		return model.Chunk{}, s.err
	}
	c := s.s.Current()
	var out model.Chunk
	if u := c.Usage; u.PromptTokens > 0 || u.CompletionTokens > 0 {
		s.usage = model.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		out.Text += ch.Delta.Content
		var seen map[int64]bool // the indexes of this delta
		for _, tc := range ch.Delta.ToolCalls {
			c := s.byIndex[tc.Index]
			// A fragment begins a new call when its index is new, or
			// when it names another id than its index's call has, or when
			// the same delta already had its index: some compatible
			// servers (Gemini's among them) send every call at index 0,
			// or none, and parallel calls must not be merged into one.
			if c == nil || (tc.ID != "" && c.id != "" && tc.ID != c.id) || seen[tc.Index] {
				c = &call{}
				s.calls = append(s.calls, c)
				s.byIndex[tc.Index] = c
			}
			if seen == nil {
				seen = map[int64]bool{}
			}
			seen[tc.Index] = true
			if tc.ID != "" {
				c.id = tc.ID
			}
			// A name sent again in a later fragment is the same name, not
			// more of it.
			if n := tc.Function.Name; n != "" && n != c.name.String() {
				c.name.WriteString(n)
			}
			c.args.WriteString(tc.Function.Arguments)
			out.ToolBytes += len(tc.Function.Name) + len(tc.Function.Arguments)
		}
		if ch.FinishReason != "" {
			s.finish = ch.FinishReason
		}
	}
	if !s.textKept {
		s.text.Add(out.Text)
	}
	return out, nil
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
		me := &model.Error{Provider: "openai", Status: apiErr.StatusCode, Message: apiErr.Message, Err: err}
		if me.Message == "" {
			me.Message = strings.TrimSpace(apiErr.RawJSON())
		}
		if me.Message == "" {
			me.Message = http.StatusText(apiErr.StatusCode)
		}
		if apiErr.Response != nil {
			me.RetryAfter = model.ParseRetryAfter(apiErr.Response.Header.Get("Retry-After"), time.Now())
		}
		// OpenAI says so in its code; compatible servers only in words.
		me.TooLong = model.IsTooLong(apiErr.StatusCode, apiErr.Code, me.Message)
		return me
	}
	return model.TransportError("openai", err)
}

// Response returns the assembled reply.
func (s *stream) Response() model.Response {
	r := model.Response{Text: s.text.String(), FinishReason: s.finish, Usage: s.usage}
	for _, c := range s.calls {
		r.ToolCalls = append(r.ToolCalls, model.ToolCall{ID: c.id, Name: c.name.String(), Arguments: c.args.String()})
	}
	return r
}

// Close releases the HTTP response.
func (s *stream) Close() error { return s.s.Close() }
