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
