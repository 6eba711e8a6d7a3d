// The stats view: per tool, how long its calls took — a histogram of the
// durations GET /v1/stats counted in the store, on a log scale — against
// the tool's timeout and idle timeout now and the timeouts `timebox stats`
// suggests, with its percentiles and how its calls ended. The figures and
// the suggestion rule are the server's (internal/advice,
// docs/decisions/timeout-advisor.md); this file only draws them.
'use strict';

const svgNS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'text') e.textContent = v;
    else e.setAttribute(k, String(v));
  }
  for (const k of kids) if (k) e.append(k);
  return e;
}

// The histogram's box (viewBox units): the plot, room above it for the
// lines' labels, and below it for the axis.
const hist = { w: 520, h: 190, left: 10, right: 510, top: 58, bottom: 160 };

// The round values the log axis is labelled by.
const histTicks = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 3e4, 6e4, 12e4, 3e5, 6e5, 18e5, 36e5, 72e5, 216e5, 864e5];

// The outcome counts a card lists, in the report's words.
const statOutcomes = [
  ['timed_out', 'timed out'], ['idle_timed_out', 'of them idle'], ['overran', 'overran'],
  ['abandoned', 'abandoned'], ['cancelled', 'cancelled'], ['interrupted', 'interrupted'],
];

let statsGen = 0;

// openStats reads the report for the chosen period and draws a card per
// tool. A newer call wins over an older one still reading.
async function openStats() {
  const gen = ++statsGen;
  const view = $('#stats-view'), cards = $('#stats-cards');
  view.dataset.state = 'loading';
  let rep;
  try {
    rep = await getJSON('/v1/stats?since=' + encodeURIComponent($('#stats-since').value));
  } catch (e) {
    if (gen !== statsGen) return;
    cards.replaceChildren(el('p', { class: 'error', text: e.message }));
    view.dataset.state = 'error';
    return;
  }
  if (gen !== statsGen) return;
  cards.replaceChildren(...rep.tools.map(statCard));
  $('#stats-empty').hidden = rep.tools.length > 0;
  view.dataset.state = 'ready';
}

// statCard draws one tool.
function statCard(t) {
  const dash = (ms) => (t.sample ? fmtMS(ms) : '–');
  const figures = el('dl', { class: 'stat-figures' },
    ...[['calls', String(t.calls)], ['p50', dash(t.p50_ms)], ['p95', dash(t.p95_ms)], ['p99', dash(t.p99_ms)], ['max', dash(t.max_ms)],
      ['silence', t.max_silence_ms === null ? '–' : fmtMS(t.max_silence_ms)]]
      .map(([k, v]) => el('div', { 'data-figure': k }, el('dt', { text: k }), el('dd', { text: v }))));
  const ended = t.calls - t.timed_out - t.abandoned - t.cancelled - t.interrupted;
  const outcomes = el('ul', { class: 'stat-outcomes' },
    el('li', { 'data-outcome': 'returned', 'data-count': ended, title: 'ended on their own: ok or error' },
      el('b', { text: String(ended) }), ' returned'),
    ...statOutcomes.filter(([k]) => t[k] > 0 || k === 'timed_out').map(([k, words]) =>
      el('li', { 'data-outcome': k, 'data-count': t[k] }, el('b', { text: String(t[k]) }), ' ' + words)));
  const now = fmtLimit(t.timeout_ms) + (t.timeout_source ? ` (${t.timeout_source})` : '');
  const advice = [`timeout ${now}`];
  if (t.idle_timeout_ms) advice.push(`idle timeout ${fmtLimit(t.idle_timeout_ms)}`);
  advice.push(t.suggested_timeout ? `suggested ${t.suggested_timeout}` : 'no suggestion');
  if (t.suggested_idle_timeout) advice.push(`suggested idle ${t.suggested_idle_timeout}`);
  return el('article', { class: 'stat-card', 'data-tool': t.tool },
    el('h3', {}, el('span', { class: 'name', text: t.tool }), el('span', { class: 'muted', text: `${t.sample} measured` })),
    histogramSVG(t), figures, outcomes,
    el('p', { class: 'stat-advice' + (t.suggested_timeout_ms && t.suggested_timeout_ms !== t.timeout_ms ? ' change' : ''), text: advice.join(' · ') }),
    t.notes.length ? el('ul', { class: 'stat-notes muted' }, ...t.notes.map((n) => el('li', { text: n }))) : null);
}

// histogramSVG draws the tool's histogram on a log axis of durations,
// with a vertical line, labelled, for each budget: the timeout now, the
// idle timeout, and the suggestions.
function histogramSVG(t) {
  const h = t.histogram, b = h.bounds_ms;
  const lines = [
    ['timeout', t.timeout_ms, 'timeout ' + fmtLimit(t.timeout_ms)],
    ['idle', t.idle_timeout_ms, 'idle ' + fmtLimit(t.idle_timeout_ms)],
    ['suggested', t.suggested_timeout_ms, 'suggested ' + (t.suggested_timeout || '')],
    ['suggested-idle', t.suggested_idle_timeout_ms, 'suggested idle ' + (t.suggested_idle_timeout || '')],
  ].filter(([, ms]) => ms > 0);
  // The axis spans the calls and every line, with a margin.
  const floor = b.length ? (b[0] > 0 ? b[0] : b[1] / 2) : 1;
  const values = [floor, ...(b.length ? [b[b.length - 1]] : []), ...lines.map(([, ms]) => ms)];
  const lo = Math.log10(Math.min(...values) / 1.4), hi = Math.log10(Math.max(...values) * 1.4);
  const x = (ms) => hist.left + ((Math.log10(Math.max(ms, floor)) - lo) / (hi - lo)) * (hist.right - hist.left);
  const root = svg('svg', { class: 'hist', viewBox: `0 0 ${hist.w} ${hist.h}`, role: 'img',
    'aria-label': `${t.tool}: durations of ${t.sample} calls against its budgets` });

  const axis = svg('g', { class: 'hist-axis' }, svg('line', { x1: hist.left, x2: hist.right, y1: hist.bottom, y2: hist.bottom }));
  let ticks = histTicks.filter((v) => Math.log10(v) >= lo && Math.log10(v) <= hi);
  while (ticks.length > 7) ticks = ticks.filter((_, i) => i % 2 === 0);
  for (const v of ticks) {
    axis.append(svg('line', { x1: x(v), x2: x(v), y1: hist.bottom, y2: hist.bottom + 4 }),
      svg('text', { x: x(v), y: hist.bottom + 16, 'text-anchor': 'middle', text: axisLabel(v) }));
  }
  root.append(axis);

  const most = Math.max(1, ...h.counts);
  const bars = svg('g', { class: 'hist-bars' });
  h.counts.forEach((n, i) => {
    const x0 = x(b[i]), x1 = x(b[i + 1]), ht = (n / most) * (hist.bottom - hist.top);
    bars.append(svg('rect', { class: 'hist-bar', 'data-count': n, 'data-lo': b[i], 'data-hi': b[i + 1],
      x: x0 + 0.5, width: Math.max(x1 - x0 - 1, 0.5), y: hist.bottom - ht, height: ht },
    svg('title', { text: `${n} call${n === 1 ? '' : 's'} of ${fmtMS(b[i])} to ${fmtMS(b[i + 1])}` })));
  });
  root.append(bars);
  if (!h.counts.length) {
    root.append(svg('text', { class: 'hist-none', x: hist.w / 2, y: (hist.top + hist.bottom) / 2, 'text-anchor': 'middle',
      text: 'no call measured' }));
  }

  // Each line's label on a row of its own above the plot, so that lines
  // close together stay readable.
  lines.forEach(([kind, ms, label], i) => {
    const at = x(ms), right = at > (hist.left + hist.right) / 2;
    root.append(svg('g', { class: 'hist-line', 'data-kind': kind, 'data-ms': ms },
      svg('line', { x1: at, x2: at, y1: 8 + 13 * i, y2: hist.bottom }),
      svg('text', { x: right ? at - 4 : at + 4, y: 17 + 13 * i, 'text-anchor': right ? 'end' : 'start', text: label })));
  });
  return root;
}
