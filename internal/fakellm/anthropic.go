package fakellm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// anthropicErrorType is the error type Anthropic sends with an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

// playAnthropic streams rep as Anthropic's Messages SSE: message_start, a
// content block per run of text or per tool call (content_block_start,
// content_block_delta with text_delta or input_json_delta,
// content_block_stop), message_delta with the stop reason, message_stop.
// Each Chunk is one delta event; the first also carries message_start.
func (s *Server) playAnthropic(w http.ResponseWriter, r *http.Request, rep Reply, flush func()) {
	send := func(typ string, v map[string]any) {
		v["type"] = typ
		b, _ := json.Marshal(v)
		s.write(w, r, rep, fmt.Sprintf("event: %s\ndata: %s\n\n", typ, b), flush)
	}
	index, open, kind := -1, false, ""
	closeBlock := func() {
		if open {
			send("content_block_stop", map[string]any{"index": index})
			open = false
		}
	}
	hasTools := false
	for i, c := range s.sequence(r, rep) {
		if rep.Stall && i >= rep.StallAfter {
			flush()
			s.hold(r)
			return
		}
		if c.Delay > 0 && i > 0 && !s.wait(r, c.Delay) {
			return
		}
		if i == 0 {
			send("message_start", map[string]any{"message": map[string]any{
				"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": []any{},
				"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1}}})
			io.WriteString(w, "event: ping\ndata: {\"type\": \"ping\"}\n\n")
		}
		switch t := c.Tool; {
		case t != nil && t.ID != "":
			closeBlock()
			index, open, kind, hasTools = index+1, true, "tool_use", true
			send("content_block_start", map[string]any{"index": index, "content_block": map[string]any{
				"type": "tool_use", "id": t.ID, "name": t.Name, "input": map[string]any{}}})
			if t.Arguments != "" {
				send("content_block_delta", map[string]any{"index": index,
					"delta": map[string]any{"type": "input_json_delta", "partial_json": t.Arguments}})
			}
		case t != nil:
			send("content_block_delta", map[string]any{"index": index,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": t.Arguments}})
		default:
			if !open || kind != "text" {
				closeBlock()
				index, open, kind = index+1, true, "text"
				send("content_block_start", map[string]any{"index": index,
					"content_block": map[string]any{"type": "text", "text": ""}})
			}
			send("content_block_delta", map[string]any{"index": index,
				"delta": map[string]any{"type": "text_delta", "text": c.Text}})
		}
		flush()
	}
	if rep.Repeat {
		return // the client went away
	}
	if rep.Stall {
		flush()
		s.hold(r)
		return
	}
	if rep.ErrorEvent != "" {
		fmt.Fprintf(w, "event: error\ndata: %s\n\n", rep.ErrorEvent)
		flush()
		return
	}
	if rep.BadData != "" {
		fmt.Fprintf(w, "event: content_block_delta\ndata: %s\n\n", rep.BadData)
		flush()
		return
	}
	if rep.Malformed {
		io.WriteString(w, "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"oops\"\n\n")
		flush()
		return
	}
	if rep.Truncate {
		flush()
		return
	}
	if len(rep.Chunks) == 0 {
		send("message_start", map[string]any{"message": map[string]any{
			"id": "msg_fake", "type": "message", "role": "assistant", "model": "fake", "content": []any{},
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1}}})
	}
	closeBlock()
	stop := "end_turn"
	if hasTools {
		stop = "tool_use"
	}
	if rep.FinishReason != "" {
		stop = rep.FinishReason
	}
	send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": 15}})
	send("message_stop", map[string]any{})
	flush()
}
