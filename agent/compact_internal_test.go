package agent

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestWeightCutKeepsWholeCharactersWithinTheWeight(t *testing.T) {
	for _, c := range []struct {
		s    string
		w    int
		want string
	}{
		{"abc", 2, "ab"},
		{"abc", 9, "abc"},
		{"中文", 3, ""},
		{"中文", 4, "中"},
		{"中文", 7, "中"},
		{"中文", 8, "中文"},
		{"a中", 4, "a"},
		{"a中", 5, "a中"},
		{"éé", 3, "é"},
		{"😀x", 3, ""},
		{"😀x", 4, "😀"},
		{"中", 0, ""},
	} {
		got := c.s[:weightCut(c.s, c.w)]
		if got != c.want || weight(got) > c.w || !utf8.ValidString(got) {
			t.Errorf("weightCut(%q, %d) kept %q, want %q", c.s, c.w, got, c.want)
		}
	}
	if w := weight(strings.Repeat("한", 10) + "abcd"); w != 44 {
		t.Errorf("weight = %d, want 44", w)
	}
}
