package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/store"
)

var _ store.CallStats = (*Store)(nil)

// Percentiles are PostgreSQL's percentile_disc — nearest-rank, as
// store.PercentileRank — over each group's sample, all three from one sort
// (the array form), in the same pass as the counts; the covering indexes
// of schema version 4 (tool_calls_stats, model_calls_stats) let it read a
// million calls from the index alone once autovacuum has passed
// (docs/BENCHMARKS.md).

// ToolStats implements store.CallStats.
func (s *Store) ToolStats(ctx context.Context, f store.StatsFilter) ([]store.ToolStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, `WITH g AS (
		SELECT tool, count(*) FILTER (WHERE refused = '') AS calls, count(sample_ms) AS sample,
			COALESCE(max(sample_ms), 0) AS max_ms, COALESCE(max(sample_ms) FILTER (WHERE outcome = 'ok'), 0) AS max_ok,
			count(*) FILTER (WHERE sample_ms IS NOT NULL AND outcome IN ('timed_out', 'abandoned')) AS cut_off,
			count(*) FILTER (WHERE outcome = 'timed_out') AS timed_out,
			count(*) FILTER (WHERE outcome = 'timed_out' AND phase = 'tool_idle') AS idle_timed_out,
			count(*) FILTER (WHERE overran) AS overran, count(*) FILTER (WHERE abandoned) AS abandoned,
			count(*) FILTER (WHERE outcome = 'cancelled' AND refused = '') AS cancelled,
			count(*) FILTER (WHERE outcome = 'interrupted') AS interrupted,
			count(*) FILTER (WHERE sample_ms IS NOT NULL AND progress_count > 0) AS progressed,
			COALESCE(max(silence_ms), 0) AS silence,
			percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY sample_ms) AS pct
		FROM tool_calls WHERE started_at >= $1 AND ($2 = '' OR tool = $2)
		GROUP BY tool)
	SELECT g.tool, g.calls, g.sample, COALESCE(g.pct[1], 0), COALESCE(g.pct[2], 0), COALESCE(g.pct[3], 0), g.max_ms, g.max_ok,
		g.cut_off, g.timed_out, g.idle_timed_out, g.overran, g.abandoned, g.cancelled, g.interrupted, g.progressed, g.silence,
		COALESCE(l.timeout_ms, 0), COALESCE(l.idle_timeout_ms, 0)
	FROM g LEFT JOIN LATERAL (SELECT timeout_ms, idle_timeout_ms FROM tool_calls c
		WHERE c.tool = g.tool AND c.refused = '' ORDER BY c.started_at DESC LIMIT 1) l ON true
	ORDER BY g.tool`, nanos(f.Since), f.Tool)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ToolStat, error) {
		var t store.ToolStat
		err := r.Scan(&t.Tool, &t.Calls, &t.Sample, &t.P50MS, &t.P95MS, &t.P99MS, &t.MaxMS, &t.MaxOKMS, &t.CutOff,
			&t.TimedOut, &t.IdleTimedOut, &t.Overran, &t.Abandoned, &t.Cancelled, &t.Interrupted, &t.Progressed,
			&t.MaxSilenceMS, &t.TimeoutMS, &t.IdleTimeoutMS)
		return t, err
	})
	if out == nil && err == nil {
		out = []store.ToolStat{}
	}
	return out, err
}

// ModelStats implements store.CallStats.
func (s *Store) ModelStats(ctx context.Context, f store.StatsFilter) ([]store.ModelStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if f.Tool != "" {
		return []store.ModelStat{}, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT provider || ':' || model, sample_phase, count(*), count(sample_ms),
			percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY sample_ms),
			COALESCE(max(sample_ms), 0), COALESCE(max(sample_ms) FILTER (WHERE outcome IN ('ok', 'insufficient')), 0),
			count(*) FILTER (WHERE outcome = 'timed_out' AND phase = sample_phase),
			count(*) FILTER (WHERE outcome = 'timed_out' AND phase = 'llm_idle'),
			count(*) FILTER (WHERE outcome = 'error'), count(*) FILTER (WHERE outcome = 'cancelled')
		FROM model_calls WHERE started_at >= $1 AND sample_phase <> ''
		GROUP BY provider, model, sample_phase ORDER BY provider, model, sample_phase`, nanos(f.Since))
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ModelStat, error) {
		var m store.ModelStat
		var pct []*int64
		err := r.Scan(&m.Endpoint, &m.Phase, &m.Calls, &m.Sample, &pct, &m.MaxMS, &m.MaxOKMS,
			&m.TimedOut, &m.IdleTimedOut, &m.Failed, &m.Cancelled)
		for i, to := range []*int64{&m.P50MS, &m.P95MS, &m.P99MS} {
			if i < len(pct) && pct[i] != nil {
				*to = *pct[i]
			}
		}
		return m, err
	})
	if out == nil && err == nil {
		out = []store.ModelStat{}
	}
	return out, err
}
