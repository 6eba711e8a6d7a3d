package model_test

import (
	"testing"
	"time"

	"github.com/timebox-run/timebox/model"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                               0,
		"7":                              7 * time.Second,
		" 1.5 ":                          1500 * time.Millisecond,
		"-3":                             0,
		"soon":                           0,
		"Sun, 22 Nov 2026 12:00:30 GMT":  30 * time.Second,
		"Sunday, 22-Nov-26 12:01:00 GMT": time.Minute,
		"Sun Nov 22 12:00:05 2026":       5 * time.Second,
		"Sun, 22 Nov 2026 11:59:00 GMT":  0, // past
	} {
		if got := model.ParseRetryAfter(v, now); got != want {
			t.Errorf("ParseRetryAfter(%q) = %s, want %s", v, got, want)
		}
	}
}

func TestIsTooLong(t *testing.T) {
	cases := []struct {
		status int
		texts  []string
		want   bool
	}{
		{400, []string{"context_length_exceeded", "This model's maximum context length is 128000 tokens."}, true},
		{400, []string{"", "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"}, true}, // vLLM
		{400, []string{"invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"}, true},
		{400, []string{"the request exceeds the available context size, try increasing it"}, true}, // llama.cpp
		{413, []string{"request_too_large", "Request exceeds the maximum allowed number of bytes."}, true},
		{413, nil, true},
		{400, []string{"invalid_request_error", "tools.0.input_schema: JSON schema is invalid"}, false},
		{400, []string{"max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens"}, false},
		{429, []string{"too many tokens per minute"}, false}, // a rate limit, not a length
		{500, []string{"context_length_exceeded"}, false},
	}
	for _, tc := range cases {
		if got := model.IsTooLong(tc.status, tc.texts...); got != tc.want {
			t.Errorf("IsTooLong(%d, %q) = %v, want %v", tc.status, tc.texts, got, tc.want)
		}
	}
}
