package sqlite

import (
	"context"
	"database/sql"
	"errors"
)

// wtx is a write transaction on the writer's one connection. Its exec and
// queryRow run the statements a turn's end runs as prepared when the store
// was opened (prepare), and any other SQL as ExecContext does: modernc's
// driver parses a statement's SQL at every ExecContext, and a turn's end
// runs a dozen, which was a third of the CPU of 10,000 ends stored at once
// (docs/decisions/turn-ends-in-groups.md).
type wtx struct {
	*sql.Tx
	prepared map[string]*sql.Stmt
}

// exec runs query in tx, prepared if it is one of the store's statements.
func (tx *wtx) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st, ok := tx.prepared[query]; ok {
		return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return tx.ExecContext(ctx, query, args...)
}

// query is QueryContext, prepared if query is one of the store's
// statements.
func (tx *wtx) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st, ok := tx.prepared[query]; ok {
		return tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return tx.QueryContext(ctx, query, args...)
}

// queryRow is QueryRowContext, prepared if query is one of the store's
// statements.
func (tx *wtx) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st, ok := tx.prepared[query]; ok {
		return tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return tx.QueryRowContext(ctx, query, args...)
}

// preparedSQL are the statements prepared once on the writer's
// connection: those of a turn's end (finish) and of the events that carry
// a call record (appendOne).
var preparedSQL = []string{
	insertEventSQL, turnExistsSQL, storedSeqsSQL, putToolCallSQL, deleteModelCallsSQL, addModelCallSQL,
	putRecordSQL, touchSessionSQL, deleteMessagesSQL, insertMessageSQL,
}

// prepare prepares preparedSQL on w, before any transaction holds its one
// connection.
func prepare(ctx context.Context, w *sql.DB) (map[string]*sql.Stmt, error) {
	m := make(map[string]*sql.Stmt, len(preparedSQL))
	for _, q := range preparedSQL {
		st, err := w.PrepareContext(ctx, q)
		if err != nil {
			return nil, errors.Join(err, closePrepared(m))
		}
		m[q] = st
	}
	return m, nil
}

func closePrepared(m map[string]*sql.Stmt) error {
	var errs []error
	for _, st := range m {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}
