package model

import "strings"

// Text is a reply's text as it streams: the chunks' own strings, kept as
// they came and joined once, when the reply is asked for. A builder grown
// chunk by chunk copies the text at each growth and holds up to 2.25 times
// a long reply at its last; the pieces are shared with whoever else keeps
// the chunks (the turn's llm_delta events). The zero Text is empty; it is
// not safe for concurrent use.
type Text struct {
	parts []string
	n     int
}

// Add appends s.
func (t *Text) Add(s string) {
	if s != "" {
		t.parts = append(t.parts, s)
		t.n += len(s)
	}
}

// Len returns the length in bytes of the text so far.
func (t *Text) Len() int { return t.n }

// String returns the text so far, joined once: the pieces are replaced by
// the result.
func (t *Text) String() string {
	switch len(t.parts) {
	case 0:
		return ""
	case 1:
		return t.parts[0]
	}
	var b strings.Builder
	b.Grow(t.n)
	for _, p := range t.parts {
		b.WriteString(p)
	}
	s := b.String()
	t.parts = append(t.parts[:0:0], s)
	return s
}
