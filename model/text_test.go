package model_test

import (
	"testing"

	"github.com/timebox-run/timebox/model"
)

func TestText(t *testing.T) {
	var x model.Text
	if x.String() != "" || x.Len() != 0 {
		t.Fatal("zero Text not empty")
	}
	for _, p := range []string{"a", "", "bc", "def"} {
		x.Add(p)
	}
	if got := x.String(); got != "abcdef" || x.Len() != 6 {
		t.Fatalf("String %q Len %d", got, x.Len())
	}
	x.Add("g")
	if got := x.String(); got != "abcdefg" || x.Len() != 7 {
		t.Fatalf("after a join: String %q Len %d", got, x.Len())
	}
}
