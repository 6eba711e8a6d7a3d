package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

var _ store.CallStats = (*Store)(nil)

// The figures are read as SQLite reads them (store/sqlite/stats.go), from
// the indexes of schema version 4, in one read-only snapshot: one pass
// over the main index (tool_calls_stats, model_calls_stats) counts each
// group and gives its percentiles — percentile_disc, nearest-rank as
// store.PercentileRank, the four from one sort (the array form); the few
// calls that end unusually and those that reported progress are counted
// from partial indexes of their own; the other maxima are read by walking
// a group's sample from the top. The indexes answer alone (index-only
// scans) once autovacuum has passed over the tables. Counting every
// outcome in the one pass took twice as long at a million calls
// (docs/BENCHMARKS.md).

// ToolStats implements store.CallStats. Like every read, it is tried again
// on a cut connection, and a database that cannot be reached is
// store.ErrUnavailable (again).
func (s *Store) ToolStats(ctx context.Context, f store.StatsFilter) ([]store.ToolStat, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.ToolStat, error) { return s.toolStats(ctx, f) })
}

func (s *Store) toolStats(ctx context.Context, f store.StatsFilter) ([]store.ToolStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var out []store.ToolStat
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		since := nanos(f.Since)
		rows, err := tx.Query(ctx, `SELECT tool, count(*), count(sample_ms),
				percentile_disc(ARRAY[0.5, 0.95, 0.99, 1]) WITHIN GROUP (ORDER BY sample_ms), COALESCE(min(sample_ms), 0)
			FROM tool_calls WHERE started_at >= $1 AND ($2 = '' OR tool = $2) GROUP BY tool ORDER BY tool`, since, f.Tool)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ToolStat, error) {
			var t store.ToolStat
			var pct []*int64
			err := r.Scan(&t.Tool, &t.Calls, &t.Sample, &pct, &t.MinMS)
			setPercentiles(pct, &t.P50MS, &t.P95MS, &t.P99MS, &t.MaxMS)
			return t, err
		})
		if err != nil {
			return err
		}
		byTool := map[string]*store.ToolStat{}
		names := make([]string, len(out))
		for i := range out {
			byTool[out[i].Tool], names[i] = &out[i], out[i].Tool
		}
		rows, err = tx.Query(ctx, `SELECT tool, count(*) FILTER (WHERE refused <> ''),
				count(*) FILTER (WHERE cut = 'tool'), COALESCE(max(timeout_ms) FILTER (WHERE cut = 'tool'), 0),
				count(*) FILTER (WHERE cut = 'tool_idle'), COALESCE(max(idle_timeout_ms) FILTER (WHERE cut = 'tool_idle'), 0),
				count(*) FILTER (WHERE outcome = 'timed_out'), count(*) FILTER (WHERE outcome = 'timed_out' AND phase = 'tool_idle'),
				count(*) FILTER (WHERE overran), count(*) FILTER (WHERE abandoned),
				count(*) FILTER (WHERE outcome = 'cancelled' AND refused = ''), count(*) FILTER (WHERE outcome = 'interrupted')
			FROM (SELECT tool, refused, outcome, phase, overran, abandoned, timeout_ms, idle_timeout_ms,
				CASE WHEN sample_ms IS NOT NULL AND outcome IN ('timed_out', 'abandoned') THEN phase END AS cut
				FROM tool_calls WHERE (outcome NOT IN ('ok', 'error') OR overran OR abandoned OR refused <> '')
					AND started_at >= $1 AND ($2 = '' OR tool = $2)) u
			GROUP BY tool`, since, f.Tool)
		if err != nil {
			return err
		}
		var tool string
		var refused int64
		var u store.ToolStat
		_, err = pgx.ForEachRow(rows, []any{&tool, &refused, &u.CutOff, &u.CutOffTimeoutMS, &u.IdleCutOff, &u.IdleCutOffTimeoutMS,
			&u.TimedOut, &u.IdleTimedOut, &u.Overran, &u.Abandoned, &u.Cancelled, &u.Interrupted}, func() error {
			if t := byTool[tool]; t != nil {
				calls, sample := t.Calls-refused, t.Sample
				p50, p95, p99, top, bottom := t.P50MS, t.P95MS, t.P99MS, t.MaxMS, t.MinMS
				*t = u
				t.Tool, t.Calls, t.Sample, t.P50MS, t.P95MS, t.P99MS, t.MaxMS, t.MinMS = tool, calls, sample, p50, p95, p99, top, bottom
			}
			return nil
		})
		if err != nil {
			return err
		}
		// The longest silence of a call that reported nothing is its
		// duration (quiet).
		rows, err = tx.Query(ctx, `SELECT t.tool, COALESCE(l.timeout_ms, 0), COALESCE(l.idle_timeout_ms, 0), COALESCE(ok.ms, 0),
				COALESCE(p.n, 0), GREATEST(COALESCE(p.silence, 0), COALESCE(quiet.ms, 0))
			FROM unnest($2::text[]) AS t(tool)
			LEFT JOIN LATERAL (SELECT timeout_ms, idle_timeout_ms FROM tool_calls c
				WHERE c.tool = t.tool AND c.refused = '' ORDER BY c.started_at DESC LIMIT 1) l ON true
			LEFT JOIN LATERAL (SELECT sample_ms AS ms FROM tool_calls c
				WHERE c.tool = t.tool AND c.sample_ms IS NOT NULL AND c.started_at >= $1 AND c.outcome = 'ok'
				ORDER BY c.sample_ms DESC LIMIT 1) ok ON true
			LEFT JOIN LATERAL (SELECT sample_ms AS ms FROM tool_calls c
				WHERE c.tool = t.tool AND c.sample_ms IS NOT NULL AND c.started_at >= $1 AND c.progress_count = 0
				ORDER BY c.sample_ms DESC LIMIT 1) quiet ON true
			LEFT JOIN LATERAL (SELECT count(*) AS n, max(silence_ms) AS silence FROM tool_calls c
				WHERE c.tool = t.tool AND c.progress_count > 0 AND c.sample_ms IS NOT NULL AND c.started_at >= $1) p ON true`,
			since, names)
		if err != nil {
			return err
		}
		var x store.ToolStat
		_, err = pgx.ForEachRow(rows, []any{&tool, &x.TimeoutMS, &x.IdleTimeoutMS, &x.MaxOKMS, &x.Progressed, &x.MaxSilenceMS}, func() error {
			if t := byTool[tool]; t != nil {
				t.TimeoutMS, t.IdleTimeoutMS, t.MaxOKMS, t.Progressed, t.MaxSilenceMS = x.TimeoutMS, x.IdleTimeoutMS, x.MaxOKMS, x.Progressed, x.MaxSilenceMS
			}
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	kept := []store.ToolStat{}
	for _, t := range out {
		if t.Calls > 0 { // else only refused calls: a name the model made up
			kept = append(kept, t)
		}
	}
	return kept, nil
}

// ToolHistogram implements store.CallStats: one pass over the tool's
// sample, each call put in its bucket by width_bucket, whose buckets are
// those of store.CallStats (0 under the first bound, len(bounds) at or
// above the last).
func (s *Store) ToolHistogram(ctx context.Context, f store.StatsFilter, tool string, bounds []int64) ([]int64, error) {
	return again(ctx, s, func(ctx context.Context) ([]int64, error) { return s.toolHistogram(ctx, f, tool, bounds) })
}

func (s *Store) toolHistogram(ctx context.Context, f store.StatsFilter, tool string, bounds []int64) ([]int64, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if err := store.CheckBounds(bounds); err != nil {
		return nil, err
	}
	counts := make([]int64, len(bounds)+1)
	q := `SELECT width_bucket(sample_ms, $3::bigint[]), count(*) FROM tool_calls
		WHERE tool = $1 AND sample_ms IS NOT NULL AND started_at >= $2 GROUP BY 1`
	args := []any{tool, nanos(f.Since), bounds}
	if len(bounds) == 0 {
		q = `SELECT 0, count(*) FROM tool_calls WHERE tool = $1 AND sample_ms IS NOT NULL AND started_at >= $2`
		args = args[:2]
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	var i int
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&i, &n}, func() error {
		counts[i] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return counts, nil
}

// ModelStats implements store.CallStats.
func (s *Store) ModelStats(ctx context.Context, f store.StatsFilter) ([]store.ModelStat, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.ModelStat, error) { return s.modelStats(ctx, f) })
}

func (s *Store) modelStats(ctx context.Context, f store.StatsFilter) ([]store.ModelStat, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	out := []store.ModelStat{}
	if f.Tool != "" {
		return out, nil
	}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		since := nanos(f.Since)
		type key struct{ provider, model, phase string }
		var keys []key
		at := map[key]int{}
		var k key
		var m store.ModelStat
		var pct []*int64
		rows, err := tx.Query(ctx, `SELECT provider, model, sample_phase, count(*), count(sample_ms),
				percentile_disc(ARRAY[0.5, 0.95, 0.99, 1]) WITHIN GROUP (ORDER BY sample_ms)
			FROM model_calls WHERE started_at >= $1 AND sample_phase <> ''
			GROUP BY provider, model, sample_phase ORDER BY provider, model, sample_phase`, since)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&k.provider, &k.model, &k.phase, &m.Calls, &m.Sample, &pct}, func() error {
			x := store.ModelStat{Endpoint: k.provider + ":" + k.model, Phase: budget.Phase(k.phase), Calls: m.Calls, Sample: m.Sample}
			setPercentiles(pct, &x.P50MS, &x.P95MS, &x.P99MS, &x.MaxMS)
			at[k] = len(out)
			keys, out = append(keys, k), append(out, x)
			return nil
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT provider, model, sample_phase,
				count(*) FILTER (WHERE outcome = 'timed_out' AND phase = sample_phase),
				count(*) FILTER (WHERE outcome = 'timed_out' AND phase = 'llm_idle'),
				count(*) FILTER (WHERE outcome = 'error'), count(*) FILTER (WHERE outcome = 'cancelled')
			FROM model_calls WHERE outcome NOT IN ('ok', 'insufficient') AND started_at >= $1
			GROUP BY provider, model, sample_phase`, since)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&k.provider, &k.model, &k.phase, &m.TimedOut, &m.IdleTimedOut, &m.Failed, &m.Cancelled}, func() error {
			if i, ok := at[k]; ok {
				x := &out[i]
				x.TimedOut, x.IdleTimedOut, x.Failed, x.Cancelled = m.TimedOut, m.IdleTimedOut, m.Failed, m.Cancelled
			}
			return nil
		})
		if err != nil {
			return err
		}
		var providers, models, phases []string
		for _, k := range keys {
			providers, models, phases = append(providers, k.provider), append(models, k.model), append(phases, k.phase)
		}
		rows, err = tx.Query(ctx, `SELECT COALESCE(ok.ms, 0) FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS g(provider, model, phase, i)
			LEFT JOIN LATERAL (SELECT sample_ms AS ms FROM model_calls c
				WHERE c.provider = g.provider AND c.model = g.model AND c.sample_phase = g.phase
					AND c.sample_ms IS NOT NULL AND c.started_at >= $1 AND c.outcome IN ('ok', 'insufficient')
				ORDER BY c.sample_ms DESC LIMIT 1) ok ON true
			ORDER BY g.i`, since, providers, models, phases)
		if err != nil {
			return err
		}
		i := 0
		var okMS int64
		_, err = pgx.ForEachRow(rows, []any{&okMS}, func() error {
			if i < len(out) {
				out[i].MaxOKMS = okMS
			}
			i++
			return nil
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// setPercentiles copies percentile_disc's array (NULLs when a group has
// no sample) to the figures.
func setPercentiles(pct []*int64, to ...*int64) {
	for i, p := range to {
		if i < len(pct) && pct[i] != nil {
			*p = *pct[i]
		}
	}
}
