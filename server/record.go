package server

import (
	"bufio"
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
// byte, but its answer a piece at a time and its events one at a time
// (event.WriteTurn): the events of a long reply's turn hold its every
// delta, and the record built whole held the reply as JSON three times
// over, beside the encoder's copy of each event
// (docs/decisions/reply-text.md).
func writeRecord(w io.Writer, rec *event.Turn) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := event.WriteTurn(bw, rec); err != nil {
		return err
	}
	bw.WriteByte('\n')
	return bw.Flush()
}
