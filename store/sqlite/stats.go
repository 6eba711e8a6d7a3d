package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/timebox-run/timebox/store"
)

var _ store.CallStats = (*Store)(nil)

// Percentiles are read from the covering indexes of schema version 2
// (tool_calls_stats, model_calls_stats), which keep each group's sample in
// order: a group's count first (one pass over its index entries), then
// each percentile by its rank, walking the index from the nearer end
// (ORDER BY … LIMIT 1 OFFSET rank-1, or from the top for p95 and p99).
// At a million calls this is a pass and a half over small index entries;
// window functions (ROW_NUMBER() OVER) sort the million rows instead, and
// took ten times as long (docs/BENCHMARKS.md).

// ToolStats implements store.CallStats.
func (s *Store) ToolStats(ctx context.Context, f store.StatsFilter) ([]store.ToolStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	since := nanos(f.Since)
	q := `SELECT tool, SUM(refused = ''), COUNT(sample_ms), COALESCE(MAX(sample_ms), 0),
		COALESCE(MAX(CASE WHEN outcome = 'ok' THEN sample_ms END), 0),
		SUM(sample_ms IS NOT NULL AND outcome IN ('timed_out', 'abandoned')),
		SUM(outcome = 'timed_out'), SUM(outcome = 'timed_out' AND phase = 'tool_idle'),
		SUM(overran), SUM(abandoned), SUM(outcome = 'cancelled' AND refused = ''), SUM(outcome = 'interrupted'),
		SUM(sample_ms IS NOT NULL AND progress_count > 0), COALESCE(MAX(silence_ms), 0)
		FROM tool_calls INDEXED BY tool_calls_stats WHERE started_at >= ?`
	args := []any{since}
	if f.Tool != "" {
		q += ` AND tool = ?`
		args = append(args, f.Tool)
	}
	rows, err := tx.QueryContext(ctx, q+` GROUP BY tool ORDER BY tool`, args...)
	if err != nil {
		return nil, s.statsErr(err)
	}
	out := []store.ToolStat{}
	for rows.Next() {
		var t store.ToolStat
		if err := rows.Scan(&t.Tool, &t.Calls, &t.Sample, &t.MaxMS, &t.MaxOKMS, &t.CutOff, &t.TimedOut, &t.IdleTimedOut,
			&t.Overran, &t.Abandoned, &t.Cancelled, &t.Interrupted, &t.Progressed, &t.MaxSilenceMS); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		t := &out[i]
		err := tx.QueryRowContext(ctx, `SELECT timeout_ms, idle_timeout_ms FROM tool_calls INDEXED BY tool_calls_latest
			WHERE tool = ? AND refused = '' ORDER BY started_at DESC LIMIT 1`, t.Tool).Scan(&t.TimeoutMS, &t.IdleTimeoutMS)
		if err != nil && err != sql.ErrNoRows {
			return nil, err
		}
		if t.Sample == 0 {
			continue
		}
		err = percentiles(ctx, tx, `SELECT sample_ms FROM tool_calls INDEXED BY tool_calls_stats
			WHERE tool = ? AND sample_ms IS NOT NULL AND started_at >= ?`, []any{t.Tool, since}, t.Sample,
			&t.P50MS, &t.P95MS, &t.P99MS)
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ModelStats implements store.CallStats.
func (s *Store) ModelStats(ctx context.Context, f store.StatsFilter) ([]store.ModelStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if f.Tool != "" {
		return []store.ModelStat{}, nil
	}
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	since := nanos(f.Since)
	rows, err := tx.QueryContext(ctx, `SELECT provider, model, sample_phase, COUNT(*), COUNT(sample_ms), COALESCE(MAX(sample_ms), 0),
		COALESCE(MAX(CASE WHEN outcome IN ('ok', 'insufficient') THEN sample_ms END), 0),
		SUM(outcome = 'timed_out' AND phase = sample_phase), SUM(outcome = 'timed_out' AND phase = 'llm_idle'),
		SUM(outcome = 'error'), SUM(outcome = 'cancelled')
		FROM model_calls INDEXED BY model_calls_stats WHERE started_at >= ? AND sample_phase <> ''
		GROUP BY provider, model, sample_phase ORDER BY provider, model, sample_phase`, since)
	if err != nil {
		return nil, s.statsErr(err)
	}
	type key struct{ provider, model string }
	var keys []key
	out := []store.ModelStat{}
	for rows.Next() {
		var m store.ModelStat
		var k key
		if err := rows.Scan(&k.provider, &k.model, &m.Phase, &m.Calls, &m.Sample, &m.MaxMS, &m.MaxOKMS,
			&m.TimedOut, &m.IdleTimedOut, &m.Failed, &m.Cancelled); err != nil {
			rows.Close()
			return nil, err
		}
		m.Endpoint = k.provider + ":" + k.model
		out, keys = append(out, m), append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		m := &out[i]
		if m.Sample == 0 {
			continue
		}
		err := percentiles(ctx, tx, `SELECT sample_ms FROM model_calls INDEXED BY model_calls_stats
			WHERE provider = ? AND model = ? AND sample_phase = ? AND sample_ms IS NOT NULL AND started_at >= ?`,
			[]any{keys[i].provider, keys[i].model, string(m.Phase), since}, m.Sample, &m.P50MS, &m.P95MS, &m.P99MS)
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// percentiles reads the 50th, 95th and 99th percentiles of the n values
// sample_ms that query (a SELECT with its WHERE, over an index ordered by
// sample_ms) selects.
func percentiles(ctx context.Context, tx *sql.Tx, query string, args []any, n int64, p50, p95, p99 *int64) error {
	for _, p := range []struct {
		pct int64
		to  *int64
	}{{50, p50}, {95, p95}, {99, p99}} {
		rank := store.PercentileRank(p.pct, n)
		q, offset := query+` ORDER BY sample_ms LIMIT 1 OFFSET ?`, rank-1
		if rank-1 > n-rank {
			q, offset = query+` ORDER BY sample_ms DESC LIMIT 1 OFFSET ?`, n-rank
		}
		if err := tx.QueryRowContext(ctx, q, append(args, offset)...).Scan(p.to); err != nil {
			return fmt.Errorf("reading the %dth percentile: %w", p.pct, err)
		}
	}
	return nil
}

// statsErr explains a store that predates the columns stats reads: one
// opened read-only (OpenReadOnly), which is never migrated.
func (s *Store) statsErr(err error) error {
	if s.readOnly {
		return fmt.Errorf("%w (the store at %s may predate schema version %d, which timebox stats needs; open it once with timebox runs list to bring it up to date)", err, s.path, SchemaVersion)
	}
	return err
}
