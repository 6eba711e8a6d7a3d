package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// maxBatch bounds the bytes of call records a batch holds before it is
// sent: a turn's end rewrites every call record, and a call's record holds
// its result (up to limits.max_tool_output). Queued whole, ten 5 MB
// results were encoded into one buffer of some 100 MB, and the turn's end
// took several times its conversation in memory (issue 29).
const maxBatch = 1 << 20

// batch is a pgx.Batch of a transaction that sends what it holds once the
// call records queued in it (queueToolCall) pass maxBatch bytes, so that
// it holds about one large record at a time. The statements keep their
// order: what is queued is sent before what comes after it.
type batch struct {
	pgx.Batch
	tx    pgx.Tx
	bytes int
}

func newBatch(tx pgx.Tx) *batch { return &batch{tx: tx} }

// queueSized queues a statement whose arguments hold size bytes, and sends
// the batch when it passes maxBatch.
func (b *batch) queueSized(ctx context.Context, size int, query string, args ...any) error {
	b.Queue(query, args...)
	b.bytes += size
	if b.bytes < maxBatch {
		return nil
	}
	return b.send(ctx)
}

// send sends what is queued, if anything, and empties the batch.
func (b *batch) send(ctx context.Context) error {
	if b.Len() == 0 {
		return nil
	}
	err := b.tx.SendBatch(ctx, &b.Batch).Close()
	b.Batch, b.bytes = pgx.Batch{}, 0
	return err
}
