package sqlite

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/longjson"
	"github.com/timebox-run/timebox/model"
)

// A turn's long texts — an answer of megabytes — are stored once, in
// pieces, in the texts table (issue 29, docs/decisions/long-texts.md). The
// rows that would each hold a copy — the turn_finished event, the turn's
// record and message, the session's assistant message — hold an empty
// string instead, and their apart column says which of their fields is
// which stored text: "answer=answer,message=answer". Before, the end of a
// turn with a 15 MB answer bound it five times over to SQLite's statements,
// and SQLite copied each into its own heap whole; a piece at a time, that
// heap holds one piece.

// textPiece is the most of a text one row of texts holds.
const textPiece = 256 << 10

// longText is one field of a row kept apart: the field, the name of the
// stored text it is, and, when writing, the text.
type longText struct {
	field, name, text string
}

// apart is the long texts of one row.
type apart []longText

// column returns a as the apart column keeps it.
func (a apart) column() string {
	if len(a) == 0 {
		return ""
	}
	var b strings.Builder
	for i, t := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t.field + "=" + t.name)
	}
	return b.String()
}

// parseApart reads an apart column.
func parseApart(s string) apart {
	if s == "" {
		return nil
	}
	var a apart
	for f := range strings.SplitSeq(s, ",") {
		field, name, _ := strings.Cut(f, "=")
		a = append(a, longText{field: field, name: name})
	}
	return a
}

// answerApart returns the fields of a turn's end kept apart: its answer,
// and its message, which for an answered turn is the answer, stored once.
func answerApart(answer, message string) apart {
	var a apart
	if len(answer) >= longjson.Long {
		a = append(a, longText{"answer", "answer", answer})
	}
	if len(message) >= longjson.Long {
		name := "message"
		if message == answer {
			name = "answer"
		}
		a = append(a, longText{"message", name, message})
	}
	return a
}

// fill sets each field kept apart from texts (name → text).
func (a apart) fill(texts map[string]string, fields map[string]*string) {
	for _, t := range a {
		if p := fields[t.field]; p != nil {
			*p = texts[t.name]
		}
	}
}

// storedEvent returns e as the events table keeps it: a turn_finished's
// long answer and message left empty, and what they are.
func storedEvent(e event.Event) (event.Event, apart) {
	d, ok := e.Data.(*event.TurnFinished)
	if !ok {
		return e, nil
	}
	a := answerApart(d.Answer, d.Message)
	if len(a) == 0 {
		return e, nil
	}
	c := *d
	a.blank(map[string]*string{"answer": &c.Answer, "message": &c.Message})
	e.Data = &c
	return e, a
}

// encodeEvent is the queue's encoding of an event: its stored JSON.
func encodeEvent(e event.Event) ([]byte, error) {
	e, _ = storedEvent(e)
	return event.Marshal(e)
}

// blank empties each field kept apart.
func (a apart) blank(fields map[string]*string) {
	for _, t := range a {
		if p := fields[t.field]; p != nil {
			*p = ""
		}
	}
}

// fillEvent sets e's fields kept apart.
func fillEvent(e *event.Event, a apart, texts map[string]string) {
	if d, ok := e.Data.(*event.TurnFinished); ok {
		a.fill(texts, map[string]*string{"answer": &d.Answer, "message": &d.Message})
	}
}

// recordApart returns rec as the turns table keeps it, its long answer
// and message left empty, and what they are.
func recordApart(rec *event.Turn) (*event.Turn, apart) {
	a := answerApart(rec.Answer, rec.Message)
	if len(a) == 0 {
		return rec, nil
	}
	c := *rec
	a.blank(map[string]*string{"answer": &c.Answer, "message": &c.Message})
	return &c, a
}

// messageApart returns m as the messages table keeps it: a long content
// left empty, stored as the turn's answer when it is (the assistant's
// last message), as content:i otherwise.
func messageApart(m model.Message, i int, answer string) (model.Message, apart) {
	if len(m.Content) < longjson.Long {
		return m, nil
	}
	name := "content:" + strconv.Itoa(i)
	if m.Content == answer {
		name = "answer"
	}
	a := apart{{"content", name, m.Content}}
	m.Content = ""
	return m, a
}

// put stores the texts of a once each: a text a turn already has under
// its name (the answer, stored with turn_finished before the record) is
// not written again.
func (a apart) put(ctx context.Context, tx *sql.Tx, turnID string) error {
	for i, t := range a {
		if a[:i].named(t.name) {
			continue
		}
		if err := putText(ctx, tx, turnID, t.name, t.text); err != nil {
			return err
		}
	}
	return nil
}

func (a apart) named(name string) bool {
	for _, t := range a {
		if t.name == name {
			return true
		}
	}
	return false
}

// putText stores text as turnID's text name, in pieces of at most
// textPiece bytes cut between characters, unless the turn has it already.
func putText(ctx context.Context, tx *sql.Tx, turnID, name, text string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM texts WHERE turn_id = ? AND name = ? AND i = 0`, turnID, name).Scan(&one)
	if err == nil {
		return nil
	}
	if err != sql.ErrNoRows {
		return err
	}
	for i := 0; ; i++ {
		n := min(textPiece, len(text))
		for n < len(text) && n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		if n == 0 && len(text) > 0 {
			n = min(textPiece, len(text)) // not UTF-8: cut anywhere
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO texts (turn_id, name, i, piece) VALUES (?, ?, ?, ?)`,
			turnID, name, i, text[:n]); err != nil {
			return err
		}
		text = text[n:]
		if text == "" {
			return nil
		}
	}
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// texts reads the stored texts of turnID that a names, by name.
func (a apart) texts(ctx context.Context, q querier, turnID string) (map[string]string, error) {
	var names []any
	for i, t := range a {
		if !a[:i].named(t.name) {
			names = append(names, t.name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	rows, err := q.QueryContext(ctx, `SELECT name, piece FROM texts WHERE turn_id = ? AND name IN (?`+
		strings.Repeat(", ?", len(names)-1)+`) ORDER BY name, i`, append([]any{turnID}, names...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	pieces := map[string][]string{}
	for rows.Next() {
		var name, piece string
		if err := rows.Scan(&name, &piece); err != nil {
			return nil, err
		}
		pieces[name] = append(pieces[name], piece)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(pieces))
	for name, p := range pieces {
		out[name] = strings.Join(p, "")
	}
	return out, nil
}
