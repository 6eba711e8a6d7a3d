// The timeline of a turn: its model attempts and tool calls as bars on one
// time axis, each with its deadline, its outcome, its progress reports and
// the failovers between attempts. It grows live from the turn's events and
// draws a past turn from its stored ones. `timebox runs show ID --timeline`
// (internal/cli/timeline.go) draws the same picture in a terminal, by the
// same rules (docs/decisions/timeline.md): keep the two in step.
'use strict';

// tlWords says how a call ended; the row's data-outcome is the key, and
// its colour (app.css).
const tlWords = {
  ok: 'ok', running: 'running', timed_out: 'timed out', cancelled: 'cancelled', error: 'error',
  abandoned: 'abandoned', interrupted: 'interrupted', insufficient: 'insufficient', refused: 'refused',
  waiting: 'waiting for a person', // drawn as the wait mark; the legend names the mark
};

// The marks drawn over the bars, as the legend names them.
const tlMarks = {
  wait: 'waiting for a person', over: 'past its budget, let run (advisory)', tail: 'abandoned, still running', lost: 'worker lost, nothing known',
  tick: 'progress report',
  notice: 'still working notice', deadline: 'deadline', later: 'deadline after the end', failover: 'failover',
};

// The round sizes the axis is labelled by.
const tlSteps = [10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5,
  18e5, 36e5, 72e5, 108e5, 216e5, 432e5, 864e5];

// axisStep is the smallest round size that labels span ms with at most n
// labels after 0.
function axisStep(span, n) {
  for (const s of tlSteps) if (Math.floor(span / s) <= n) return s;
  return 864e5 * (Math.floor(span / 864e5 / n) + 1);
}

// axisLabel writes a time on the axis: 0s, 500ms, 1.5s, 2m, 1m30s, 1h30m.
function axisLabel(ms) {
  if (ms === 0) return '0s';
  if (ms < 1000) return ms + 'ms';
  if (ms < 60000) return ms / 1000 + 's';
  const h = Math.floor(ms / 36e5), m = Math.floor((ms % 36e5) / 6e4), s = Math.floor((ms % 6e4) / 1000);
  return (h ? h + 'h' : '') + (m ? m + 'm' : '') + (s ? s + 's' : '');
}

// tlTime reads a time of the API in ms, 0 when absent (Go's zero time
// included).
function tlTime(iso) {
  const t = Date.parse(iso || '');
  return t > 0 ? t : 0;
}

function tlAfter(t, ms) {
  return ms > 0 && t ? t + ms : 0;
}

// tlApproval says how a call's wait for a person ended, and who ended it.
function tlApproval(decision, by) {
  if (decision === 'expired') return 'approval expired';
  const w = { approve: 'approved', deny: 'denied' }[decision];
  return w ? w + (by ? ' by ' + by : '') : '';
}

function tlModel(model, attempt) {
  return 'model ' + model + (attempt > 1 ? ' #' + attempt : '');
}

// tlBefore orders rows by step; in a step the model's side first (a
// compaction, the attempts and the failovers between them, by time), then
// the tool calls in the order the model asked for them, which their ids
// count (call_1_2 before call_1_10).
function tlBefore(a, b) {
  if (a.step !== b.step) return a.step - b.step;
  const at = a.kind === 'tool', bt = b.kind === 'tool';
  if (at !== bt) return at ? 1 : -1;
  if (at) return a.callID.length - b.callID.length || (a.callID < b.callID ? -1 : a.callID > b.callID ? 1 : 0);
  return a.start - b.start || a.n - b.n;
}

// Timelines still running are redrawn as time passes: their axis ends now.
const tlLive = new Set();

setInterval(() => {
  for (const t of tlLive) {
    if (t.node.isConnected) t.draw();
    else tlLive.delete(t); // its page was left
  }
}, 100);

class Timeline {
  constructor() {
    this.node = el('figure', { class: 'tl', 'data-state': 'running', hidden: true });
    this.axis = el('div', { class: 'tl-track' });
    this.grid = el('div', { class: 'tl-grid' });
    this.body = el('div', { class: 'tl-rows' }, this.grid);
    this.legend = el('figcaption', { class: 'tl-legend' });
    this.node.append(el('div', { class: 'tl-axis' }, el('span'), this.axis, el('span')), this.body, this.legend);
    this.rows = [];
    this.calls = new Map(); // call_id → row
    this.t0 = 0;
    this.end = 0;           // the turn's end, once it has ended
    this.ended = false;
    this.firstChunk = 0;
    this.compaction = 0;
    this.llm = null;        // the model attempt running
    this.comp = null;       // the compaction running
    this.pending = false;
  }

  // row adds a row; its DOM is made once and redrawn by draw.
  row(r) {
    r = Object.assign({ step: 0, callID: '', end: 0, deadline: 0, outcome: 'running', ticks: [], notices: [], lost: [], n: this.rows.length }, r);
    r.node = el('div', { class: 'tl-row', 'data-kind': r.kind, 'data-call-id': r.callID || null, 'data-label': r.label });
    r.track = el('div', { class: 'tl-track' });
    r.num = el('span', { class: 'tl-num' });
    r.node.append(el('span', { class: 'tl-label', text: r.label, title: r.label }), r.track, r.num);
    this.rows.push(r);
    return r;
  }

  // apply takes one event of the turn, in seq order.
  apply(ev) {
    const at = tlTime(ev.at);
    let r;
    switch (ev.type) {
      case 'turn_started': {
        const b = ev.budgets || {};
        this.t0 = at;
        this.firstChunk = (b['timeouts.llm_first_chunk'] || {}).ms || 0;
        this.compaction = (b['timeouts.compaction'] || {}).ms || 0;
        if (!this.ended) tlLive.add(this);
        break;
      }
      case 'llm_started':
        this.llm = this.row({ kind: 'model', label: tlModel(ev.model, ev.attempt), step: ev.step, start: at,
          deadline: tlAfter(at, this.firstChunk) });
        break;
      case 'llm_finished': {
        r = this.llm && this.llm.step === ev.step ? this.llm : this.row({ kind: 'model', label: tlModel(ev.model, ev.attempt), step: ev.step });
        this.llm = null;
        r.start = tlTime(ev.started_at) || r.start || at;
        // The first chunk's deadline is met once it comes.
        r.deadline = ev.first_chunk_ms ? 0 : tlAfter(r.start, this.firstChunk);
        r.end = r.start + (ev.stream_ms || 0);
        r.outcome = ev.outcome;
        r.recorded = `${ev.step}/${ev.started_at}`;
        break;
      }
      case 'llm_delta':
        if (this.llm) this.llm.deadline = 0; // its first chunk came
        break;
      case 'compaction_started':
        this.comp = this.row({ kind: 'compaction', label: 'compaction', step: ev.step, start: at, deadline: tlAfter(at, ev.limit_ms) });
        break;
      case 'compaction_finished': {
        r = this.comp || this.row({ kind: 'compaction', label: 'compaction', step: ev.step, start: at - (ev.duration_ms || 0) });
        this.comp = null;
        const rec = ev.record;
        if (rec) {
          r.start = tlTime(rec.started_at) || r.start;
          r.recorded = `${rec.step}/${rec.started_at}`;
        }
        r.deadline = tlAfter(r.start, this.compaction);
        r.end = rec ? r.start + (rec.stream_ms || 0) : at;
        r.outcome = ev.outcome;
        break;
      }
      case 'approval_requested':
        // The call waits for a person before it runs: its row is its
        // wait until it starts. A later round goes on the same wait.
        r = this.calls.get(ev.call_id);
        if (!r) {
          r = this.row({ kind: 'tool', label: ev.tool, step: ev.step, callID: ev.call_id, start: at, outcome: 'waiting' });
          this.calls.set(ev.call_id, r);
        }
        if (!r.wait) r.wait = [at, 0];
        break;
      case 'approval_decided':
        r = this.calls.get(ev.call_id);
        if (!r || !r.wait || ev.stale) return; // one too old to act on is asked again: the wait goes on
        r.wait[1] = at;
        r.approval = tlApproval(ev.decision, ev.by);
        break;
      case 'tool_started':
        r = this.calls.get(ev.call_id);
        if (r && !r.started) { // it waited for a person: it starts now
          Object.assign(r, { start: at, outcome: 'running' });
        } else if (r) {
          // A second start: the attempt before was lost with its worker
          // and the call run again (retries:); nothing is known of it
          // from its start to this one's.
          if (at > r.start) r.lost.push([r.start, at]);
          Object.assign(r, { start: at, end: 0, outcome: 'running', retried: true, ticks: [], notices: [] });
        } else {
          r = this.row({ kind: 'tool', label: ev.tool, step: ev.step, callID: ev.call_id, start: at });
          this.calls.set(ev.call_id, r);
        }
        r.started = true;
        r.deadline = tlTime(ev.deadline) || tlAfter(at, ev.timeout_ms);
        r.timeout = ev.timeout_ms;
        break;
      case 'tool_progress':
        r = this.calls.get(ev.call_id);
        if (r) r.ticks.push(at);
        break;
      case 'still_working':
        // A notice names its calls in calls, or, stored before it did, is
        // its own one call.
        for (const c of ev.calls || [ev]) {
          r = c.call_id ? this.calls.get(c.call_id) : String(c.subject || '').startsWith('model') ? this.llm : null;
          if (r && !r.end) r.notices.push({ at, text: `still working: ${c.subject} for ${fmtMS(c.elapsed_ms)}` });
        }
        break;
      case 'tool_finished': {
        r = this.calls.get(ev.call_id);
        if (!r) { // refused, or its start was not stored
          r = this.row({ kind: 'tool', label: ev.tool, step: ev.step, callID: ev.call_id });
          this.calls.set(ev.call_id, r);
        }
        r.start = tlTime(ev.started_at) || r.start || at;
        r.end = tlTime(ev.ended_at) || r.start + (ev.duration_ms || 0);
        r.timeout = ev.timeout_ms;
        r.deadline = ev.refused ? 0 : tlAfter(r.start, ev.timeout_ms);
        r.outcome = ev.refused ? 'refused' : ev.outcome;
        r.refused = ev.refused;
        r.overran = !!ev.overran;
        if (ev.approval_ms > 0 || r.wait) {
          // Its events gone, the record says how long it waited.
          if (!r.wait) r.wait = [r.start - ev.approval_ms, 0];
          if (!r.wait[1] || r.wait[1] > r.start) r.wait[1] = r.start;
          if (ev.approval) r.approval = tlApproval(ev.approval.decision, ev.approval.by);
        }
        if (ev.phase === 'worker_lost') {
          // Lost with its worker: nothing is known of it from its last
          // heartbeat (its end) to when the loss was noticed.
          r.workerLost = true;
          const noticed = tlTime(ev.noticed_at);
          if (noticed > r.end) r.lost.push([r.end, noticed]);
        }
        break;
      }
      case 'late_result':
        r = this.calls.get(ev.call_id);
        if (r) r.late = at;
        break;
      case 'failover':
        this.row({ kind: 'failover', label: 'failover', step: ev.step, start: at, end: at, outcome: 'failover',
          right: `→ ${ev.to} (${ev.phase})`, title: `${ev.from} → ${ev.to} after ${ev.phase}: ${ev.reason}` });
        break;
      case 'turn_finished':
        this.finish(at);
        return;
      default:
        return;
    }
    this.sorted = false;
    this.schedule();
  }

  // addRecord draws the calls of a turn's record its events did not tell.
  addRecord(rec) {
    if (!this.t0) this.t0 = tlTime(rec.started_at);
    for (const c of rec.tool_calls || []) {
      if (!this.calls.has(c.call_id)) this.apply(Object.assign({}, c, { type: 'tool_finished', at: c.ended_at }));
    }
    const seen = new Set(this.rows.map((r) => r.recorded));
    for (const m of rec.model_calls || []) {
      if (seen.has(`${m.step}/${m.started_at}`)) continue;
      if (m.compaction) this.apply({ type: 'compaction_finished', at: m.started_at, step: m.step, outcome: m.outcome, record: m });
      else this.apply(Object.assign({}, m, { type: 'llm_finished', at: m.started_at }));
    }
  }

  // finish ends the axis at the turn's end; a call still open ended with
  // the turn.
  finish(at) {
    if (this.ended) return;
    this.ended = true;
    this.end = at || Math.max(this.t0, ...this.rows.map((r) => r.end || 0));
    for (const r of this.rows) {
      if (r.outcome === 'waiting') {
        // The turn ended while the call waited: it never started.
        r.wait[1] = r.start = this.end;
      }
      if (!r.end) {
        r.end = this.end;
        r.outcome = 'cancelled';
      }
    }
    tlLive.delete(this);
    this.node.dataset.state = 'ended';
    this.draw();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    setTimeout(() => this.draw(), 0);
  }

  // draw lays every row out on the axis, which runs from the turn's start
  // to its end (to now while it runs), or to the last call's end past it.
  draw() {
    this.pending = false;
    this.node.hidden = this.rows.length === 0;
    if (!this.rows.length || !this.t0) return;
    const now = Date.now() - app.skew;
    let end = this.ended ? this.end : now;
    for (const r of this.rows) end = Math.max(end, r.end || 0, r.late || 0);
    const span = Math.max(end - this.t0, 1);
    const pct = (t) => Math.min(100, Math.max(0, (100 * (t - this.t0)) / span));
    const put = (node, t) => { node.style.left = pct(t) + '%'; return node; };
    const from = (node, a, b) => { put(node, a).style.width = (pct(b) - pct(a)) + '%'; return node; };

    if (!this.sorted) {
      this.rows.sort(tlBefore);
      this.body.append(...this.rows.map((r) => r.node));
      this.sorted = true;
    }

    const step = axisStep(span, Math.max(2, Math.floor((this.axis.clientWidth || 600) / 70)));
    const labels = [], lines = [];
    for (let t = 0; t <= span; t += step) {
      labels.push(put(el('span', { class: 'tl-t', text: axisLabel(t) }), this.t0 + t));
      lines.push(put(el('span'), this.t0 + t));
    }
    this.axis.replaceChildren(...labels);
    this.grid.replaceChildren(...lines);

    const used = new Set();
    for (const r of this.rows) {
      const kids = [];
      const stop = r.end || end;
      r.node.dataset.outcome = r.outcome;
      if (r.wait) {
        // The wait for a person, up to where the call began.
        const [a, b] = r.wait;
        kids.push(from(el('div', { class: 'tl-wait', title: 'waiting for a person' + (r.approval ? ': ' + r.approval : '') }),
          a, r.outcome === 'waiting' ? (b || end) : Math.min(b || r.start, r.start)));
        used.add('wait');
      }
      if (r.outcome === 'waiting') {
        // No bar: it has not started.
      } else if (r.kind === 'failover' || r.outcome === 'refused') {
        kids.push(put(el('span', { class: 'tl-mark' }), r.start));
        used.add(r.kind === 'failover' ? 'failover' : r.outcome);
      } else {
        kids.push(from(el('div', { class: 'tl-bar' }), r.start, stop));
        used.add(r.outcome);
        if (r.overran && r.deadline && r.deadline < stop) {
          kids.push(from(el('div', { class: 'tl-over' }), r.deadline, stop));
          used.add('over');
        }
        for (const [a, b] of r.lost) {
          kids.push(from(el('div', { class: 'tl-lost' }), a, b));
          used.add('lost');
        }
        if (r.outcome === 'abandoned') {
          kids.push(from(el('div', { class: 'tl-tail' }), stop, r.late || end));
          used.add('tail');
        }
        const seen = new Set(); // ticks closer than 1/500 of the axis are one
        for (const t of r.ticks) {
          const k = Math.round(pct(t) * 5);
          if (seen.has(k)) continue;
          seen.add(k);
          kids.push(put(el('span', { class: 'tl-tick' }), t));
          used.add('tick');
        }
        for (const n of r.notices) {
          kids.push(put(el('span', { class: 'tl-notice', title: n.text }), n.at));
          used.add('notice');
        }
        if (r.deadline && r.deadline <= end) {
          kids.push(put(el('span', { class: 'tl-deadline', title: 'deadline' }), r.deadline));
          used.add('deadline');
        } else if (r.deadline) {
          kids.push(el('span', { class: 'tl-deadline later', title: `deadline at ${axisLabel(Math.round(r.deadline - this.t0))}, after the end` }));
          used.add('later');
        }
      }
      r.track.replaceChildren(...kids);
      r.num.textContent = this.right(r, now);
      r.node.title = r.title || `${r.label}: ${r.num.textContent}`;
    }

    this.legend.replaceChildren(
      ...Object.keys(tlWords).filter((k) => used.has(k)).map((k) => el('span', { class: 'tl-key', 'data-outcome': k }, el('i'), tlWords[k])),
      ...Object.keys(tlMarks).filter((k) => used.has(k)).map((k) => el('span', { class: 'tl-key', 'data-mark': k }, el('i'), tlMarks[k])));
  }

  // right is a row's numbers and words, after its bar.
  right(r, now) {
    if (r.right) return r.right;
    if (r.outcome === 'refused') return r.approval || 'refused: ' + r.refused; // denied, expired: said so
    if (r.outcome === 'waiting') return fmtMS(now - r.start) + '… ' + tlWords.waiting;
    // Interrupted, as only a worker's loss is on an engine.
    const word = (r.workerLost ? 'worker lost' : tlWords[r.outcome] || r.outcome) + (r.overran ? ', overran' : '') +
      (r.retried ? ', run again' : '') + (r.approval ? ', ' + r.approval : '');
    const took = r.end ? fmtMS(r.end - r.start) : fmtMS(now - r.start) + '…';
    return took + (r.kind === 'tool' && r.timeout ? ' / ' + fmtLimit(r.timeout) : '') + ' ' + word;
  }
}

// Timeline.of draws a turn that has ended from its record and events.
Timeline.of = function (rec) {
  const t = new Timeline();
  for (const ev of rec.events || []) t.apply(ev);
  t.addRecord(rec);
  t.finish(tlTime(rec.ended_at));
  t.schedule(); // once it is on the page, to its width
  return t;
};
