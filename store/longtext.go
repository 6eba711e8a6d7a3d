package store

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/longjson"
	"github.com/timebox-run/timebox/model"
)

// A turn's long texts — an answer of megabytes — are stored once, in
// pieces (issue 29, docs/decisions/long-texts.md). The rows that would each
// hold a copy — the turn_finished event, the turn's record and message,
// the session's messages — hold an empty string instead, and an apart
// column says which of their fields is which stored text of the turn:
// "answer=answer,message=answer". These are the rules the SQLite and
// PostgreSQL stores share; each writes and reads the texts in its SQL.

// TextPiece is the most of a text one stored piece holds: what a database
// holds of it at once, binding and building the row.
const TextPiece = 256 << 10

// LongText is one field of a row kept apart: the field, the name of the
// turn's stored text it is, and, when writing, the text.
type LongText struct {
	// Field is the row's field ("answer", "message"), Name the turn's
	// stored text it holds ("answer"), and Text that text, when writing;
	// empty when read from an apart column.
	Field, Name, Text string
}

// Apart is the long texts of one row.
type Apart []LongText

// Column returns a as a row's apart column keeps it: "" for none.
func (a Apart) Column() string {
	if len(a) == 0 {
		return ""
	}
	var b strings.Builder
	for i, t := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t.Field + "=" + t.Name)
	}
	return b.String()
}

// ParseApart reads an apart column.
func ParseApart(s string) Apart {
	if s == "" {
		return nil
	}
	var a Apart
	for f := range strings.SplitSeq(s, ",") {
		field, name, _ := strings.Cut(f, "=")
		a = append(a, LongText{Field: field, Name: name})
	}
	return a
}

// Texts returns the texts to store, each name once (the answer may be two
// fields).
func (a Apart) Texts() Apart {
	var out Apart
	for _, t := range a {
		if !out.named(t.Name) {
			out = append(out, t)
		}
	}
	return out
}

// Names returns the names of the texts a reads, each once.
func (a Apart) Names() []string {
	var out []string
	for _, t := range a.Texts() {
		out = append(out, t.Name)
	}
	return out
}

func (a Apart) named(name string) bool {
	for _, t := range a {
		if t.Name == name {
			return true
		}
	}
	return false
}

// set sets each field of a found in fields to its text: from texts (name
// → text) when given, else empty.
func (a Apart) set(texts map[string]string, fields map[string]*string) {
	for _, t := range a {
		if p := fields[t.Field]; p != nil {
			*p = texts[t.Name]
		}
	}
}

// answerApart returns the fields of a turn's end kept apart: its answer,
// and its message, which for an answered turn is the answer, stored once.
func answerApart(answer, message string) Apart {
	var a Apart
	if len(answer) >= longjson.Long {
		a = append(a, LongText{"answer", "answer", answer})
	}
	if len(message) >= longjson.Long {
		name := "message"
		if message == answer {
			name = "answer"
		}
		a = append(a, LongText{"message", name, message})
	}
	return a
}

// StoredEvent returns e as a store keeps it: a turn_finished's long answer
// and message left empty, and what they are.
func StoredEvent(e event.Event) (event.Event, Apart) {
	d, ok := e.Data.(*event.TurnFinished)
	if !ok {
		return e, nil
	}
	a := answerApart(d.Answer, d.Message)
	if len(a) == 0 {
		return e, nil
	}
	c := *d
	a.set(nil, map[string]*string{"answer": &c.Answer, "message": &c.Message})
	e.Data = &c
	return e, a
}

// EncodeEvent is e's JSON as a store keeps it (StoredEvent), for a queue's
// encoding.
func EncodeEvent(e event.Event) ([]byte, error) {
	e, _ = StoredEvent(e)
	return event.Marshal(e)
}

// FillEvent puts back e's fields kept apart.
func FillEvent(e *event.Event, a Apart, texts map[string]string) {
	if d, ok := e.Data.(*event.TurnFinished); ok {
		a.set(texts, map[string]*string{"answer": &d.Answer, "message": &d.Message})
	}
}

// RecordApart returns rec as a store keeps it, its long answer and
// message left empty, and what they are.
func RecordApart(rec *event.Turn) (*event.Turn, Apart) {
	a := answerApart(rec.Answer, rec.Message)
	if len(a) == 0 {
		return rec, nil
	}
	c := *rec
	a.set(nil, map[string]*string{"answer": &c.Answer, "message": &c.Message})
	return &c, a
}

// FillRecord puts back rec's fields kept apart.
func FillRecord(rec *event.Turn, a Apart, texts map[string]string) {
	a.set(texts, map[string]*string{"answer": &rec.Answer, "message": &rec.Message})
}

// FillMessage puts back the message of a turn's summary kept apart.
func FillMessage(message *string, a Apart, texts map[string]string) {
	a.set(texts, map[string]*string{"message": message})
}

// MessageApart returns m, the i-th message a turn adds to its session, as
// a store keeps it: a long content left empty, stored as the turn's answer
// when it is (the assistant's last message), as content:i otherwise.
func MessageApart(m model.Message, i int, answer string) (model.Message, Apart) {
	if len(m.Content) < longjson.Long {
		return m, nil
	}
	name := "content:" + strconv.Itoa(i)
	if m.Content == answer {
		name = "answer"
	}
	a := Apart{{"content", name, m.Content}}
	m.Content = ""
	return m, a
}

// FillContent puts back a session message's content kept apart.
func FillContent(m *model.Message, a Apart, texts map[string]string) {
	a.set(texts, map[string]*string{"content": &m.Content})
}

// TextPieces cuts text into pieces of at most TextPiece bytes, between
// characters (anywhere in bytes that are not UTF-8), and calls put with
// each and its index, in order, until put fails.
func TextPieces(text string, put func(i int, piece string) error) error {
	for i := 0; ; i++ {
		n := min(TextPiece, len(text))
		for n < len(text) && n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		if n == 0 && len(text) > 0 {
			n = min(TextPiece, len(text))
		}
		if err := put(i, text[:n]); err != nil {
			return err
		}
		text = text[n:]
		if text == "" {
			return nil
		}
	}
}

// pieces gathers the pieces of a turn's stored texts as a store reads
// them, in order, and joins each text once, into a string of its length.
type pieces map[string][][]byte

// texts returns the texts, by name.
func (p pieces) texts() map[string]string {
	out := make(map[string]string, len(p))
	for name, ps := range p {
		n := 0
		for _, b := range ps {
			n += len(b)
		}
		var s strings.Builder
		s.Grow(n)
		for _, b := range ps {
			s.Write(b)
		}
		out[name] = s.String()
	}
	return out
}

// Rows is what a store reads texts from: *sql.Rows, pgx.Rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ReadTexts reads rows of a store's texts — a name and a piece, in order —
// and returns the texts, by name.
func ReadTexts(rows Rows) (map[string]string, error) {
	p := pieces{}
	for rows.Next() {
		var name string
		var piece []byte
		if err := rows.Scan(&name, &piece); err != nil {
			return nil, err
		}
		p[name] = append(p[name], piece)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return p.texts(), nil
}

// FinalRecord is a turn's record as a store's turns table keeps it: its
// calls and events live in their own tables. The JSON is json.Marshal's,
// made in one buffer (event.MarshalTurn).
func FinalRecord(rec *event.Turn) ([]byte, error) {
	r := *rec
	r.ToolCalls, r.ModelCalls, r.Events = nil, nil, nil
	return event.MarshalTurn(&r)
}

// TextReader reads the long texts a of turn turnID, by name (a store's
// readTexts).
type TextReader func(turnID string, a Apart) (map[string]string, error)

// ReadRows reads a store's rows to the end — scan reads one: the row, its
// turn, the fields it keeps apart, and ok false to drop it — then, once
// close has closed them (a connection reads no texts while it reads rows),
// reads each row's long texts (read) and puts them back (fill). Each store
// keeps its queries and scans; the rest of every read of rows with long
// texts is this.
func ReadRows[T any](rows Rows, close func(), scan func() (row T, turnID string, a Apart, ok bool, err error),
	read TextReader, fill func(row *T, a Apart, texts map[string]string)) ([]T, error) {
	type kept struct {
		i      int
		turnID string
		a      Apart
	}
	out := []T{}
	var long []kept
	for rows.Next() {
		row, turnID, a, ok, err := scan()
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if len(a) > 0 {
			long = append(long, kept{len(out), turnID, a})
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	close()
	for _, k := range long {
		texts, err := read(k.turnID, k.a)
		if err != nil {
			return nil, fmt.Errorf("turn %s: reading its long texts: %w", k.turnID, err)
		}
		fill(&out[k.i], k.a, texts)
	}
	return out, nil
}

// ReadEvents reads rows of turnID's events — their JSON and their apart
// column — with ReadRows, their long texts in place. An event that cannot
// be read is an error, or skipped when skipBad.
func ReadEvents(rows Rows, close func(), turnID string, skipBad bool, read TextReader) ([]event.Event, error) {
	return ReadRows(rows, close, func() (e event.Event, _ string, _ Apart, ok bool, err error) {
		var (
			b []byte
			a string
		)
		if err := rows.Scan(&b, &a); err != nil {
			return e, "", nil, false, err
		}
		if err := json.Unmarshal(b, &e); err != nil {
			if skipBad {
				return e, "", nil, false, nil
			}
			return e, "", nil, false, fmt.Errorf("turn %s: reading an event: %w", turnID, err)
		}
		return e, turnID, ParseApart(a), true, nil
	}, read, func(e *event.Event, a Apart, texts map[string]string) { FillEvent(e, a, texts) })
}

// ReadMessages reads rows of a session's messages — their turn, their JSON
// and their apart column — with ReadRows, their long contents in place.
func ReadMessages(rows Rows, close func(), read TextReader) ([]Message, error) {
	return ReadRows(rows, close, func() (m Message, _ string, _ Apart, ok bool, err error) {
		var (
			b []byte
			a string
		)
		if err := rows.Scan(&m.TurnID, &b, &a); err != nil {
			return m, "", nil, false, err
		}
		if err := json.Unmarshal(b, &m.Message); err != nil {
			return m, "", nil, false, err
		}
		return m, m.TurnID, ParseApart(a), true, nil
	}, read, func(m *Message, a Apart, texts map[string]string) { FillContent(&m.Message, a, texts) })
}
