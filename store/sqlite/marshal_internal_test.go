package sqlite

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/model"
)

// TestMarshalMessageIsJSONMarshal: a message is stored as json.Marshal
// writes it, its long content too.
func TestMarshalMessageIsJSONMarshal(t *testing.T) {
	long := strings.Repeat("<b>a & b</b>\u2028 é \"x\"\n\xff", 10000)
	for _, m := range []model.Message{
		{Role: model.RoleUser, Content: "hi <b>"},
		{Role: model.RoleAssistant, Content: long},
		{Role: model.RoleAssistant, Content: long, ToolCalls: []model.ToolCall{{ID: "c", Name: "n", Arguments: `{"content":""}`}}},
		{Role: model.RoleTool, Content: long, ToolCallID: "c", ToolName: "n"},
	} {
		want, _ := json.Marshal(m)
		got, err := marshalMessage(m)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: marshalMessage %.100s (%v), json.Marshal %.100s", m.Role, got, err, want)
		}
	}
}
