package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/timebox-run/timebox/model"
)

// TestFingerprintSaysTimeNotes: a runner and a worker that differ only in
// whether the model is told its time make different requests, so their
// agents are not taken for the same one (agent_mismatch).
func TestFingerprintSaysTimeNotes(t *testing.T) {
	mk := func(notes bool) string {
		a, err := New(Config{Name: "a", Models: []model.Endpoint{{Provider: nopProvider{}, ProviderName: "script", Model: "m"}}, TimeNotes: notes})
		if err != nil {
			t.Fatal(err)
		}
		return a.Ref().Fingerprint
	}
	on, off := mk(true), mk(false)
	if on == off {
		t.Error("an agent that tells the model its time has the fingerprint of one that does not")
	}
	if again := mk(false); again != off {
		t.Error("the fingerprint is not stable")
	}
}

// nopProvider is a provider never called.
type nopProvider struct{}

func (nopProvider) Stream(context.Context, model.Request) (model.Stream, error) {
	return nil, errors.New("not called")
}
