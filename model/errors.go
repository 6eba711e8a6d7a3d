package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// httpDates are the date formats a Retry-After header may use (RFC 9110
// §5.6.7: the IMF-fixdate and the two obsolete forms).
var httpDates = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

// ParseRetryAfter reads a Retry-After header value — delay seconds or an
// HTTP date — as the wait it asks for from now. An empty, malformed or past
// value is 0.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil && n >= 0 {
		return time.Duration(n * float64(time.Second))
	}
	for _, f := range httpDates {
		if t, err := time.Parse(f, v); err == nil {
			return max(t.Sub(now), 0)
		}
	}
	return 0
}

// TransportError classifies a stream failure that is not an HTTP error
// status: a reply that could not be parsed is Malformed, anything else (a
// reset connection, an unexpected EOF) a plain provider failure. Both are
// LLM-phase failures that move along the failover chain.
func TransportError(provider string, err error) *Error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		// JSON, but not a chunk: said without Go's types.
		what := "a chunk"
		if te.Field != "" {
			what = fmt.Sprintf("a chunk's %q", te.Field)
		}
		return &Error{Provider: provider, Malformed: true, Err: err,
			Message: fmt.Sprintf("%s is a JSON %s, which is not what the API streams", what, te.Value)}
	}
	if errors.As(err, &se) || strings.Contains(err.Error(), "invalid character") || strings.Contains(err.Error(), "unexpected end of JSON") {
		return &Error{Provider: provider, Malformed: true, Message: err.Error(), Err: err}
	}
	return &Error{Provider: provider, Message: err.Error(), Err: err}
}

// tooLongPhrases are how providers word a refusal of a request longer than
// the model's context window: OpenAI's code and message, Anthropic's
// message, and what OpenAI-compatible servers (vLLM, llama.cpp, Ollama,
// LiteLLM) send.
var tooLongPhrases = []string{
	"context_length_exceeded", "maximum context length", "context length exceeded",
	"prompt is too long", "exceeds the context window", "exceed context window",
	"exceeds the available context size", "context window exceeded", "too many tokens",
	"input is too long", "request_too_large",
}

// IsTooLong reports whether a refusal with this HTTP status and these
// texts (the provider's message, error code or type) says the request was
// longer than the model accepts. A 413 always does; a 400 does when one of
// the texts reads like a context-length refusal.
func IsTooLong(status int, texts ...string) bool {
	switch status {
	case 413:
		return true
	case 400:
		for _, t := range texts {
			t = strings.ToLower(t)
			for _, p := range tooLongPhrases {
				if strings.Contains(t, p) {
					return true
				}
			}
		}
	}
	return false
}
