package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/internal/testenv"
)

// TestBatchSendsAsItFills: a batch sends what it holds once its queued
// records pass maxBatch bytes, so that it never holds much more than one
// large record, and its statements run in the order they were queued.
func TestBatchSendsAsItFills(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE queued (n serial, v int)`); err != nil {
		t.Fatal(err)
	}
	b := newBatch(tx)
	third := maxBatch/2 + 1
	var held []int
	for v := 1; v <= 3; v++ {
		if err := b.queueSized(ctx, third, `INSERT INTO queued (v) VALUES ($1)`, v); err != nil {
			t.Fatal(err)
		}
		held = append(held, b.Len())
	}
	b.Queue(`INSERT INTO queued (v) VALUES (4)`) // a small statement, not counted
	if err := b.send(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 0, 1}; held[0] != want[0] || held[1] != want[1] || held[2] != want[2] {
		t.Errorf("statements held after each of three records of %d bytes: %v, want %v (sent once past %d)", third, held, want, maxBatch)
	}
	rows, err := tx.Query(ctx, `SELECT v FROM queued ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != 1 || got[1] != 2 || got[2] != 3 || got[3] != 4 {
		t.Errorf("rows in the order %v, want [1 2 3 4]", got)
	}
}
