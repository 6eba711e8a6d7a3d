package server

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
)

// long is an answer written apart (longjson.Long), with what escapes.
var long = strings.Repeat("<b>a & b</b>\u2028 é \"x\"\n", 20000)

// TestWriteRecordIsEncode: writeRecord writes what json.Encoder wrote.
func TestWriteRecordIsEncode(t *testing.T) {
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	for _, rec := range []*event.Turn{
		{TurnID: "t1", Answer: "<b>a & b</b>\u2028", StartedAt: at},
		{TurnID: "t2", Answer: "done", StartedAt: at, Events: []event.Event{
			{Seq: 1, TurnID: "t2", Type: event.TypeLLMDelta, At: at, Data: &event.LLMDelta{Step: 1, Text: "<x> \"y\""}},
			{Seq: 2, TurnID: "t2", Type: event.TypeTurnFinished, At: at, Data: &event.TurnFinished{Answer: "done"}},
		}},
		// A long answer, written a piece at a time.
		{TurnID: "t3", Answer: long, StartedAt: at, Events: []event.Event{
			{Seq: 1, TurnID: "t3", Type: event.TypeLLMDelta, At: at, Data: &event.LLMDelta{Step: 1, Text: long}},
			{Seq: 2, TurnID: "t3", Type: event.TypeTurnFinished, At: at, Data: &event.TurnFinished{Answer: long}},
		}},
	} {
		var want, got bytes.Buffer
		if err := json.NewEncoder(&want).Encode(rec); err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(&got, rec); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("%s:\n got %s\nwant %s", rec.TurnID, got.String(), want.String())
		}
	}
}
