package temporal

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// TestHistoryIsReadAMessageAtATime: a runner stores the session's history
// a message a key, and a step reads it back whole and in order; an input a
// runner stored before that, the history inside it, reads the same.
func TestHistoryIsReadAMessageAtATime(t *testing.T) {
	ctx := context.Background()
	history := []model.Message{
		{Role: model.RoleUser, Content: "first"},
		{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "big", Arguments: "{}"}}},
		{Role: model.RoleTool, Content: strings.Repeat("x", 5<<20), ToolCallID: "c1", ToolName: "big"}, // past maxPut: the history takes several puts
		{Role: model.RoleAssistant, Content: "done"},
	}
	for i := 0; i < 8; i++ { // past ten keys: h/00000010 sorts after h/00000009
		history = append(history, model.Message{Role: model.RoleUser, Content: "more"}, model.Message{Role: model.RoleAssistant, Content: "yes"})
	}
	m := store.NewMemory()
	defer m.Close()
	if err := putInput(ctx, m, "new", "next", history); err != nil {
		t.Fatal(err)
	}
	old, err := json.Marshal(input{Text: "next", History: history})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := json.Marshal(model.Message{Role: model.RoleUser, Content: "next"})
	if err := m.PutPayloads(ctx, "old", map[string][]byte{keyInput: old, messageKey(0): first}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"new", "old"} {
		tr, err := loadTranscript(ctx, m, &machine.State{TurnID: id, Messages: 1})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(history, tr.History()); diff != "" {
			t.Errorf("turn %s: history (-stored +read):\n%s", id, diff)
		}
		if tr.Input() != "next" || tr.Message(0).Content != "next" {
			t.Errorf("turn %s: input %q, first message %q", id, tr.Input(), tr.Message(0).Content)
		}
	}
	// A longer history put before under the same turn (a put that failed
	// half-way, then the turn's input put again) is read only as far as
	// the input says.
	if err := putInput(ctx, m, "again", "next", append(history, model.Message{Role: model.RoleUser, Content: "stale"})); err != nil {
		t.Fatal(err)
	}
	if err := putInput(ctx, m, "again", "next", history); err != nil {
		t.Fatal(err)
	}
	tr, err := loadTranscript(ctx, m, &machine.State{TurnID: "again", Messages: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.History(); len(got) != len(history) {
		t.Errorf("a history put again shorter: %d messages read, want %d", len(got), len(history))
	}
	var stored int
	if err := m.Payload(ctx, "new", keyInput, func(data []byte) error { stored = len(data); return nil }); err != nil {
		t.Fatal(err)
	}
	if stored > 100 {
		t.Errorf("the input holds %d bytes: the history in one value", stored)
	}
}
