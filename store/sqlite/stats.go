package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

var _ store.CallStats = (*Store)(nil)

// The figures are read from the indexes of schema version 2, never from
// the tables: one pass over each group's entries of the main index
// (tool_calls_stats, model_calls_stats) counts them; the few calls that
// end unusually (timed out, cancelled, refused…) and those that reported
// progress are counted from partial indexes of their own; percentiles and
// maxima are read by walking a group's sample, kept in order by the main
// index, from the nearer end (ORDER BY … LIMIT 1 OFFSET rank-1, or from the
// top for p95 and p99). Counting every outcome in the one pass, or ranking
// with window functions (ROW_NUMBER() OVER), took several times as long
// at a million calls (docs/BENCHMARKS.md).

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
	where, args := ` AND started_at >= ?`, []any{since}
	if f.Tool != "" {
		where, args = where+` AND tool = ?`, append(args, f.Tool)
	}

	var out []store.ToolStat
	byTool := map[string]*store.ToolStat{}
	err = each(ctx, tx, `SELECT tool, COUNT(*), COUNT(sample_ms) FROM tool_calls INDEXED BY tool_calls_stats
		WHERE 1`+where+` GROUP BY tool ORDER BY tool`, args, func(rows *sql.Rows) error {
		var t store.ToolStat
		if err := rows.Scan(&t.Tool, &t.Calls, &t.Sample); err != nil {
			return err
		}
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, s.statsErr(err)
	}
	for i := range out {
		byTool[out[i].Tool] = &out[i]
	}
	// cut is NULL for a call its own budget did not end, and SUM over
	// nothing but NULLs is NULL: hence the COALESCEs.
	err = each(ctx, tx, `SELECT tool, SUM(refused <> ''),
		COALESCE(SUM(cut = 'tool'), 0), COALESCE(MAX(CASE WHEN cut = 'tool' THEN timeout_ms END), 0),
		COALESCE(SUM(cut = 'tool_idle'), 0), COALESCE(MAX(CASE WHEN cut = 'tool_idle' THEN idle_timeout_ms END), 0),
		SUM(outcome = 'timed_out'), SUM(outcome = 'timed_out' AND phase = 'tool_idle'), SUM(overran <> 0), SUM(abandoned <> 0),
		SUM(outcome = 'cancelled' AND refused = ''), SUM(outcome = 'interrupted')
		FROM (SELECT tool, refused, outcome, phase, overran, abandoned, timeout_ms, idle_timeout_ms,
				CASE WHEN sample_ms IS NOT NULL AND outcome IN ('timed_out', 'abandoned') THEN phase END AS cut
			FROM tool_calls INDEXED BY tool_calls_unusual
			WHERE (outcome NOT IN ('ok', 'error') OR overran OR abandoned OR refused <> '')`+where+`)
		GROUP BY tool`, args,
		func(rows *sql.Rows) error {
			var tool string
			var refused int64
			var u store.ToolStat
			if err := rows.Scan(&tool, &refused, &u.CutOff, &u.CutOffTimeoutMS, &u.IdleCutOff, &u.IdleCutOffTimeoutMS,
				&u.TimedOut, &u.IdleTimedOut, &u.Overran, &u.Abandoned, &u.Cancelled, &u.Interrupted); err != nil {
				return err
			}
			if t := byTool[tool]; t != nil {
				u.Tool, u.Calls, u.Sample = tool, t.Calls-refused, t.Sample
				*t = u
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = each(ctx, tx, `SELECT tool, COUNT(*), COALESCE(MAX(silence_ms), 0) FROM tool_calls INDEXED BY tool_calls_progress
		WHERE progress_count > 0 AND sample_ms IS NOT NULL`+where+` GROUP BY tool`, args, func(rows *sql.Rows) error {
		var tool string
		var n, silence int64
		if err := rows.Scan(&tool, &n, &silence); err != nil {
			return err
		}
		if t := byTool[tool]; t != nil {
			t.Progressed, t.MaxSilenceMS = n, silence
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	kept := out[:0]
	for _, t := range out {
		if t.Calls == 0 {
			continue // only refused calls: a name the model made up
		}
		err := tx.QueryRowContext(ctx, `SELECT timeout_ms, idle_timeout_ms FROM tool_calls INDEXED BY tool_calls_latest
			WHERE tool = ? AND refused = '' ORDER BY started_at DESC LIMIT 1`, t.Tool).Scan(&t.TimeoutMS, &t.IdleTimeoutMS)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, err
		}
		if t.Sample > 0 {
			g := group{tx: tx, from: `tool_calls INDEXED BY tool_calls_stats WHERE tool = ?`, args: []any{t.Tool, since}, n: t.Sample}
			if err := g.percentiles(ctx, &t.P50MS, &t.P95MS, &t.P99MS, &t.MaxMS); err != nil {
				return nil, err
			}
			if err := tx.QueryRowContext(ctx, g.query("", "ASC"), append(g.args, 0)...).Scan(&t.MinMS); err != nil {
				return nil, fmt.Errorf("reading the shortest call: %w", err)
			}
			if t.MaxOKMS, err = g.top(ctx, `outcome = 'ok'`); err != nil {
				return nil, err
			}
			// The longest silence of a call that reported nothing is its
			// duration.
			quiet, err := g.top(ctx, `progress_count = 0`)
			if err != nil {
				return nil, err
			}
			t.MaxSilenceMS = max(t.MaxSilenceMS, quiet)
		}
		kept = append(kept, t)
	}
	return append([]store.ToolStat{}, kept...), nil
}

// ToolHistogram implements store.CallStats: one pass over the tool's
// sample in the main index, each call put in its bucket by a CASE of the
// bounds.
func (s *Store) ToolHistogram(ctx context.Context, f store.StatsFilter, tool string, bounds []int64) ([]int64, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if err := store.CheckBounds(bounds); err != nil {
		return nil, err
	}
	q := `SELECT 0, COUNT(*)`
	args := []any{}
	if len(bounds) > 0 {
		q = `SELECT CASE`
		for i, b := range bounds {
			q += fmt.Sprintf(` WHEN sample_ms < ? THEN %d`, i)
			args = append(args, b)
		}
		q += fmt.Sprintf(` ELSE %d END AS bucket, COUNT(*)`, len(bounds))
	}
	q += ` FROM tool_calls INDEXED BY tool_calls_stats WHERE tool = ? AND sample_ms IS NOT NULL AND started_at >= ?`
	if len(bounds) > 0 {
		q += ` GROUP BY bucket`
	}
	args = append(args, tool, nanos(f.Since))
	counts := make([]int64, len(bounds)+1)
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.statsErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var n int64
		if err := rows.Scan(&i, &n); err != nil {
			return nil, err
		}
		counts[i] = n
	}
	return counts, rows.Err()
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
	type key struct{ provider, model, phase string }
	var keys []key
	var out []store.ModelStat
	err = each(ctx, tx, `SELECT provider, model, sample_phase, COUNT(*), COUNT(sample_ms) FROM model_calls INDEXED BY model_calls_stats
		WHERE started_at >= ? AND sample_phase <> '' GROUP BY provider, model, sample_phase ORDER BY provider, model, sample_phase`,
		[]any{since}, func(rows *sql.Rows) error {
			var k key
			var m store.ModelStat
			if err := rows.Scan(&k.provider, &k.model, &k.phase, &m.Calls, &m.Sample); err != nil {
				return err
			}
			m.Endpoint, m.Phase = k.provider+":"+k.model, budget.Phase(k.phase)
			keys, out = append(keys, k), append(out, m)
			return nil
		})
	if err != nil {
		return nil, s.statsErr(err)
	}
	at := map[key]*store.ModelStat{}
	for i := range out {
		at[keys[i]] = &out[i]
	}
	err = each(ctx, tx, `SELECT provider, model, sample_phase, SUM(outcome = 'timed_out' AND phase = sample_phase),
		SUM(outcome = 'timed_out' AND phase = 'llm_idle'), SUM(outcome = 'error'), SUM(outcome = 'cancelled')
		FROM model_calls INDEXED BY model_calls_unusual
		WHERE outcome NOT IN ('ok', 'insufficient') AND started_at >= ? GROUP BY provider, model, sample_phase`,
		[]any{since}, func(rows *sql.Rows) error {
			var k key
			var u store.ModelStat
			if err := rows.Scan(&k.provider, &k.model, &k.phase, &u.TimedOut, &u.IdleTimedOut, &u.Failed, &u.Cancelled); err != nil {
				return err
			}
			if m := at[k]; m != nil {
				m.TimedOut, m.IdleTimedOut, m.Failed, m.Cancelled = u.TimedOut, u.IdleTimedOut, u.Failed, u.Cancelled
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	for i := range out {
		m := &out[i]
		if m.Sample == 0 {
			continue
		}
		g := group{tx: tx, from: `model_calls INDEXED BY model_calls_stats WHERE provider = ? AND model = ? AND sample_phase = ?`,
			args: []any{keys[i].provider, keys[i].model, keys[i].phase, since}, n: m.Sample}
		if err := g.percentiles(ctx, &m.P50MS, &m.P95MS, &m.P99MS, &m.MaxMS); err != nil {
			return nil, err
		}
		if m.MaxOKMS, err = g.top(ctx, `outcome IN ('ok', 'insufficient')`); err != nil {
			return nil, err
		}
	}
	return append([]store.ModelStat{}, out...), nil
}

// group is the sample of one tool or model endpoint and phase: from (an
// index ordered by sample_ms within the group, and the group's WHERE)
// with args, then the since argument; n values.
type group struct {
	tx   *sql.Tx
	from string
	args []any
	n    int64
}

func (g group) query(cond, order string) string {
	if cond != "" {
		cond = " AND " + cond
	}
	return `SELECT sample_ms FROM ` + g.from + ` AND sample_ms IS NOT NULL AND started_at >= ?` + cond +
		` ORDER BY sample_ms ` + order + ` LIMIT 1 OFFSET ?`
}

// percentiles reads the 50th, 95th, 99th and 100th percentiles.
func (g group) percentiles(ctx context.Context, p50, p95, p99, p100 *int64) error {
	for _, p := range []struct {
		pct int64
		to  *int64
	}{{50, p50}, {95, p95}, {99, p99}, {100, p100}} {
		rank := store.PercentileRank(p.pct, g.n)
		q, offset := g.query("", "ASC"), rank-1
		if rank-1 > g.n-rank {
			q, offset = g.query("", "DESC"), g.n-rank
		}
		if err := g.tx.QueryRowContext(ctx, q, append(g.args, offset)...).Scan(p.to); err != nil {
			return fmt.Errorf("reading the %dth percentile: %w", p.pct, err)
		}
	}
	return nil
}

// top returns the largest value of the sample that meets cond, 0 when none
// does.
func (g group) top(ctx context.Context, cond string) (int64, error) {
	var v int64
	err := g.tx.QueryRowContext(ctx, g.query(cond, "DESC"), append(g.args, 0)...).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// each runs query and calls fn for each row.
func each(ctx context.Context, tx *sql.Tx, query string, args []any, fn func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// statsErr explains a store that predates the columns stats reads: one
// opened read-only (OpenReadOnly), which is never migrated.
func (s *Store) statsErr(err error) error {
	if s.readOnly {
		return fmt.Errorf("%w (the store at %s may predate schema version %d, which timebox stats needs; open it once with timebox runs list to bring it up to date)", err, s.path, SchemaVersion)
	}
	return err
}
