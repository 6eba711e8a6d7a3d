package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"

	"github.com/timebox-run/timebox/event"
)

// writeRecordJSON answers rec as writeJSON does, with writeRecord.
func writeRecordJSON(w http.ResponseWriter, status int, rec *event.Turn) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = writeRecord(w, rec)
}

// writeRecord writes rec as json.NewEncoder(w).Encode(rec) does, byte for
// byte, but its events one at a time: the events of a long reply's turn
// hold its every delta, and the record built whole held the reply as JSON
// three times over, beside the encoder's copy of each event
// (docs/decisions/reply-text.md). Events is the record's last field.
func writeRecord(w io.Writer, rec *event.Turn) error {
	r := *rec
	r.Events = nil
	b, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	if len(rec.Events) == 0 {
		_, err = w.Write(append(b, '\n'))
		return err
	}
	bw := bufio.NewWriterSize(w, 32<<10)
	bw.Write(b[:len(b)-1]) // without its closing brace: rec has fields, never {}
	bw.WriteString(`,"events":[`)
	for i, e := range rec.Events {
		if i > 0 {
			bw.WriteByte(',')
		}
		d, err := event.Marshal(e)
		if err != nil {
			return err
		}
		bw.Write(d)
	}
	bw.WriteString("]}\n")
	return bw.Flush()
}
