package fakellm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// The real APIs refuse some requests before they generate anything; the
// fake refuses them the same way (HTTP 400, the provider's error body), so
// that a test fails where production would:
//
//   - a tool call without its result, a result without its call, or two
//     results for one call (the pairing both APIs enforce);
//   - with LimitContext, a request longer than the model's context window.
//
// A refused request is recorded, and NewFunc's function is still called for
// it (a test's count of requests stays true), but its reply is not played.

// LimitContext makes the server refuse every request whose body is over
// tokens estimated tokens (four bytes a token), as the real API refuses a
// conversation longer than the model's context window: OpenAI with code
// context_length_exceeded, Anthropic with "prompt is too long". Zero is no
// limit (the default).
func (s *Server) LimitContext(tokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.window = tokens
}

// refusal returns the reply the real API would give instead of a stream,
// or nil when it would accept the request.
func (s *Server) refusal(raw []byte, body map[string]any) *Reply {
	s.mu.Lock()
	window := s.window
	s.mu.Unlock()
	msgs, _ := body["messages"].([]any)
	if s.format == Anthropic {
		if msg := anthropicPairing(msgs); msg != "" {
			return anthropicRefusal(msg)
		}
		if n := len(raw) / 4; window > 0 && n > window {
			return anthropicRefusal(fmt.Sprintf("prompt is too long: %d tokens > %d maximum", n, window))
		}
		return nil
	}
	if msg, param := openAIPairing(msgs); msg != "" {
		return openAIRefusal(msg, param, "")
	}
	if n := len(raw) / 4; window > 0 && n > window {
		return openAIRefusal(fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", window, n),
			"messages", "context_length_exceeded")
	}
	return nil
}

func openAIRefusal(msg, param, code string) *Reply {
	e := map[string]any{"message": msg, "type": "invalid_request_error", "param": param, "code": nil}
	if code != "" {
		e["code"] = code
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return &Reply{Status: 400, Body: string(b)}
}

func anthropicRefusal(msg string) *Reply {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": "invalid_request_error", "message": msg}})
	return &Reply{Status: 400, Body: string(b)}
}

// openAIPairing checks Chat Completions messages: an assistant message
// with tool_calls must be followed by one tool message for each call, and a
// tool message must answer a call of the assistant message before its run.
func openAIPairing(msgs []any) (msg, param string) {
	var calls []string // of the assistant message the current run answers
	var answered []string
	owner := -1
	unanswered := func() []string {
		var out []string
		for _, id := range calls {
			if !slices.Contains(answered, id) {
				out = append(out, id)
			}
		}
		return out
	}
	for i, v := range msgs {
		m, _ := v.(map[string]any)
		role, _ := m["role"].(string)
		if role == "tool" {
			id, _ := m["tool_call_id"].(string)
			switch {
			case owner < 0:
				return "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", fmt.Sprintf("messages.[%d].role", i)
			case !slices.Contains(calls, id):
				return fmt.Sprintf("Invalid parameter: 'tool_call_id' of '%s' not found in 'tool_calls' of previous message.", id), fmt.Sprintf("messages.[%d].tool_call_id", i)
			case slices.Contains(answered, id):
				return fmt.Sprintf("Invalid parameter: duplicate 'tool_call_id' of '%s': each tool call must have exactly one tool message.", id), fmt.Sprintf("messages.[%d].tool_call_id", i)
			}
			answered = append(answered, id)
			continue
		}
		if missing := unanswered(); len(missing) > 0 {
			return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: " +
				strings.Join(missing, ", "), fmt.Sprintf("messages.[%d].role", owner)
		}
		calls, answered, owner = nil, nil, -1
		if role == "assistant" {
			tcs, _ := m["tool_calls"].([]any)
			for _, tc := range tcs {
				c, _ := tc.(map[string]any)
				id, _ := c["id"].(string)
				calls = append(calls, id)
			}
			if len(calls) > 0 {
				owner = i
			}
		}
	}
	if missing := unanswered(); len(missing) > 0 {
		return "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: " +
			strings.Join(missing, ", "), fmt.Sprintf("messages.[%d].role", owner)
	}
	return "", ""
}

// blocks returns the content blocks of an Anthropic message of the given
// type, with their index in the content.
func blocks(m map[string]any, typ string) (ids []string, at []int) {
	content, _ := m["content"].([]any)
	for j, v := range content {
		b, _ := v.(map[string]any)
		if b["type"] != typ {
			continue
		}
		key := "id"
		if typ == "tool_result" {
			key = "tool_use_id"
		}
		id, _ := b[key].(string)
		ids, at = append(ids, id), append(at, j)
	}
	return ids, at
}

// anthropicPairing checks Messages API messages: every tool_use block of an
// assistant message has one tool_result block in the next message, and
// every tool_result answers a tool_use of the message before it.
func anthropicPairing(msgs []any) string {
	for i, v := range msgs {
		m, _ := v.(map[string]any)
		if m["role"] == "user" {
			var uses []string
			if i > 0 {
				prev, _ := msgs[i-1].(map[string]any)
				if prev["role"] == "assistant" {
					uses, _ = blocks(prev, "tool_use")
				}
			}
			results, at := blocks(m, "tool_result")
			for k, id := range results {
				if !slices.Contains(uses, id) {
					return fmt.Sprintf("messages.%d.content.%d: unexpected `tool_use_id` found in `tool_result` blocks: %s. Each `tool_result` block must have a corresponding `tool_use` block in the previous message.", i, at[k], id)
				}
				if slices.Contains(results[:k], id) {
					return fmt.Sprintf("messages.%d.content.%d: each tool_use must have a single result. Found multiple `tool_result` blocks with id: %s", i, at[k], id)
				}
			}
		}
		if m["role"] != "assistant" {
			continue
		}
		uses, _ := blocks(m, "tool_use")
		if len(uses) == 0 {
			continue
		}
		var results []string
		if i+1 < len(msgs) {
			next, _ := msgs[i+1].(map[string]any)
			if next["role"] == "user" {
				results, _ = blocks(next, "tool_result")
			}
		}
		var missing []string
		for _, id := range uses {
			if !slices.Contains(results, id) {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Sprintf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s. Each `tool_use` block must have a corresponding `tool_result` block in the next message.", i, strings.Join(missing, ", "))
		}
	}
	return ""
}
