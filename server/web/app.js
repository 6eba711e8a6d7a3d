// The timebox page: a chat whose timeline shows every model call and tool
// call of a turn as a chip with its own live clock and budget, and a page of
// past turns with their records. It speaks only the public API (spec §12);
// untrusted text is always set as textContent, never parsed as HTML.
'use strict';

// ---- small helpers ----------------------------------------------------------

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}

const $ = (sel, root = document) => root.querySelector(sel);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// fmtMS prints a duration the way the CLI does: 850ms, 1.2s, 2m05s.
function fmtMS(ms) {
  if (ms === undefined || ms === null || isNaN(ms)) return '';
  if (ms < 0) ms = 0;
  if (ms < 1000) return Math.round(ms) + 'ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + 's';
  const h = Math.floor(ms / 3600000), m = Math.floor((ms % 3600000) / 60000), s = Math.floor((ms % 60000) / 1000);
  if (h > 0) return h + 'h' + String(m).padStart(2, '0') + 'm';
  return m + 'm' + String(s).padStart(2, '0') + 's';
}

// fmtLimit prints a budget: whole seconds without a decimal.
function fmtLimit(ms) {
  if (!ms) return '';
  if (ms % 1000 === 0 && ms < 60000) return ms / 1000 + 's';
  return fmtMS(ms);
}

function short(s, n) {
  s = String(s || '');
  return s.length > n ? s.slice(0, n - 1) + '…' : s;
}

function when(iso) {
  const d = new Date(iso);
  return isNaN(d) ? '' : d.toLocaleString();
}

// ---- the API ----------------------------------------------------------------

const app = {
  token: sessionStorage.getItem('timebox.token') || '',
  session: '',     // the chat's session id
  running: null,   // the TurnView of the turn being followed
  skew: 0,         // browser clock minus server clock, when they differ by more than 2s
  views: new Set(),
};

let tokenWait = null;

// askToken shows the token dialog once, however many requests wait on it;
// refused says that the token given was refused. Closing the dialog without
// a token (Escape) fails the requests that wait, saying so: the next one
// asks again.
function askToken(refused) {
  if (tokenWait) return tokenWait;
  tokenWait = new Promise((resolve, reject) => {
    const d = $('#token-dialog');
    $('#token-refused').hidden = !refused;
    if (refused) $('#token-input').value = '';
    let given = false;
    $('#token-form').onsubmit = () => {
      given = true;
      app.token = $('#token-input').value.trim();
      sessionStorage.setItem('timebox.token', app.token);
    };
    d.onclose = () => {
      tokenWait = null;
      if (given) {
        resolve();
      } else {
        reject(new Error('this server needs its token: give it when the page asks again'));
      }
    };
    d.showModal();
  });
  return tokenWait;
}

async function api(path, opts = {}) {
  for (;;) {
    const headers = Object.assign({}, opts.headers);
    const sent = app.token;
    if (sent) headers['Authorization'] = 'Bearer ' + sent;
    const res = await fetch(path, Object.assign({}, opts, { headers }));
    if (res.status !== 401) {
      noteSkew(res);
      return res;
    }
    if (sent && sent === app.token) {
      // Refused: ask anew, not with it.
      app.token = '';
      sessionStorage.removeItem('timebox.token');
    }
    await askToken(sent !== '');
  }
}

// noteSkew compares the browser's clock with the server's Date header, so
// that live timers count from the server's event times correctly even when
// the clocks disagree. The header has whole seconds: small skews are noise.
function noteSkew(res) {
  const d = Date.parse(res.headers.get('Date') || '');
  if (isNaN(d)) return;
  const skew = Date.now() - d;
  app.skew = Math.abs(skew) > 2000 ? skew : 0;
}

// unsent says why a request api threw for was not answered: the server
// could not be reached (fetch's TypeError), or no token was given.
function unsent(e) {
  return e instanceof TypeError ? 'could not reach the server: ' + e.message : e.message;
}

async function errorText(res) {
  try {
    const b = await res.json();
    if (b && b.error) return b.error.message || b.error.code;
  } catch (_) { /* not JSON */ }
  return res.status + ' ' + res.statusText;
}

async function getJSON(path) {
  const res = await api(path, { headers: { Accept: 'application/json' } });
  if (!res.ok) throw new Error(await errorText(res));
  return res.json();
}

// readSSE reads a text/event-stream body and calls onEvent with each event's
// parsed data (the flat JSON of spec §7, which carries its own seq and type).
async function readSSE(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '', data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (data.length) {
          let ev = null;
          try { ev = JSON.parse(data.join('\n')); } catch (_) { /* a broken frame is skipped */ }
          data = [];
          if (ev) onEvent(ev);
        }
      } else if (line.startsWith('data:')) {
        data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
      }
      // id:, event:, retry: and comments are implied by the data or unused.
    }
  }
}

function setConn(state, text) {
  const c = $('#conn');
  c.className = 'conn ' + (state || '');
  c.textContent = text || '';
}

// ---- live clocks ------------------------------------------------------------

// Every running clock is an element with a start time; one interval moves
// them all. Clocks stop when their call or turn ends.
const clocks = new Set();

function startClock(node, startISO, limitMS, bar, onOver) {
  const c = { node, start: Date.parse(startISO), limit: limitMS || 0, bar, onOver };
  clocks.add(c);
  tickClock(c, Date.now());
  return c;
}

// pauseClock stops c at at (ms since the epoch, server time) until
// resumeClock: the turn's clock while the turn waits for nothing but
// people, which its timeouts.turn does not count.
function pauseClock(c, at) {
  if (c && c.pausedAt == null) c.pausedAt = at;
}

function resumeClock(c, at) {
  if (!c || c.pausedAt == null) return;
  c.paused = (c.paused || 0) + Math.max(0, at - c.pausedAt);
  c.pausedAt = null;
}

function tickClock(c, now) {
  const t = now - app.skew;
  const ms = (c.pausedAt != null ? c.pausedAt : t) - c.start - (c.paused || 0);
  c.node.textContent = fmtMS(ms) + (c.limit ? ' / ' + fmtLimit(c.limit) : '');
  if (c.bar && c.limit) {
    c.bar.firstChild.style.width = Math.min(100, (100 * ms) / c.limit) + '%';
    c.bar.classList.toggle('over', ms > c.limit);
  }
  if (c.limit && ms > c.limit && !c.over) {
    c.over = true;
    if (c.onOver) c.onOver();
  }
}

function stopClock(c, ms) {
  if (!c) return;
  clocks.delete(c);
  c.node.textContent = fmtMS(ms) + (c.limit ? ' / ' + fmtLimit(c.limit) : '');
  if (c.bar && c.limit) {
    c.bar.firstChild.style.width = Math.min(100, (100 * ms) / c.limit) + '%';
    c.bar.classList.toggle('over', ms > c.limit);
  }
}

setInterval(() => {
  const now = Date.now();
  for (const c of clocks) tickClock(c, now);
}, 100);

// ---- what a stopped turn's banner says ----------------------------------------

// reasonTitle says, in words, why a turn ended: the banner's headline. The
// stop_reason itself (the word the records, the Past turns filter and
// docs/events.md use) is the banner's data-stop-reason and its title's
// tooltip, not repeated after its own label.
const reasonTitle = {
  answered: 'Answered',
  turn_timeout: 'Stopped by the turn ceiling',
  no_progress: 'Stopped: no progress',
  llm_budget_exhausted: 'Stopped: model time budget spent',
  max_steps: 'Stopped: step limit',
  max_tool_calls: 'Stopped: tool call limit',
  model_unresponsive: 'Stopped: the model stopped responding',
  reply_too_long: 'Stopped: the reply grew too long',
  model_unavailable: 'Failed: no model available',
  model_rejected: 'Failed: the model refused the request',
  compaction_failed: 'Stopped: history compaction failed',
  cancelled: 'Cancelled',
  client_gone: 'Cancelled: the client went away',
  shutdown: 'Stopped: the server shut down',
  interrupted: 'Interrupted',
  engine_lost: 'Interrupted: the engine lost the turn',
  agent_mismatch: 'Failed: the worker runs another agent file',
};

// bannerTitle is the banner's headline: why the turn ended, and how long
// it ran (the rest of its totals are on the line below).
function bannerTitle(fin) {
  const words = reasonTitle[fin.stop_reason] || (fin.stop_reason ? fin.stop_reason.replaceAll('_', ' ') : fin.status);
  const wall = (fin.totals || {}).wall_ms;
  return wall > 0 ? `${words} · ${fmtMS(wall)}` : words;
}

// recordTotals gives a turn record the totals of turn_finished.
function recordTotals(rec) {
  const calls = rec.tool_calls || [];
  return { wall_ms: rec.wall_ms, steps: rec.steps, tool_calls: calls.filter((c) => !c.refused).length,
    tool_calls_refused: calls.filter((c) => c.refused).length, llm_ms: rec.llm_ms, tool_ms: rec.tool_ms,
    failovers: rec.failovers };
}

// banner builds the closing banner of a turn from turn_finished or a record.
// The budget that stopped the turn, with its value, source and knob, comes
// from the server (turn_finished's limit): the page holds no copy of the
// rules. turnID, when set, links the banner to the turn's records.
function banner(fin, turnID) {
  const b = el('div', { class: 'banner ' + fin.status, 'data-stop-reason': fin.stop_reason, 'data-status': fin.status });
  b.append(el('div', { class: 'title', title: `status ${fin.status}, stop_reason ${fin.stop_reason}`, text: bannerTitle(fin) }));
  if (fin.message && fin.stop_reason !== 'answered') b.append(el('div', { class: 'msg', text: fin.message }));
  const l = fin.limit;
  if (l) {
    const from = l.source === 'request' ? 'the request' : l.source;
    const text = `Budget: ${l.key} = ${l.value} (from ${from}). Change ${l.knob} to give turns like this more room.`;
    b.append(el('div', { class: 'knob', text }));
  }
  const flags = Object.entries(fin.flags || {}).filter(([, on]) => on).map(([k]) => el('span', { class: 'flag', text: k }));
  if (flags.length) b.append(el('div', { class: 'flags' }, ...flags));
  const t = fin.totals || {};
  const parts = [`${t.steps} step${t.steps === 1 ? '' : 's'}`,
    `${t.tool_calls} tool call${t.tool_calls === 1 ? '' : 's'}` + (t.tool_calls_refused ? ` (${t.tool_calls_refused} refused)` : ''),
    `model ${fmtMS(t.llm_ms)}`, `tools ${fmtMS(t.tool_ms)}`];
  if (t.failovers) parts.push(`${t.failovers} failover${t.failovers === 1 ? '' : 's'}`);
  const totals = el('div', { class: 'totals', text: parts.join(' · ') });
  if (turnID) totals.append(' · ', el('a', { href: '#/turns/' + encodeURIComponent(turnID), text: 'records' }));
  b.append(totals);
  return b;
}

// outcomeText says how a tool call ended, in words.
function outcomeText(r) {
  switch (r.outcome) {
    case 'ok': return 'ok';
    case 'timed_out':
      if (r.phase === 'tool_idle') return `stopped: silent for ${fmtLimit(r.idle_timeout_ms)} (idle_timeout)`;
      if (r.phase === 'tool') return `timed out at its ${fmtLimit(r.timeout_ms)} timeout`;
      return `stopped by the ${r.phase} budget`;
    case 'abandoned': return 'abandoned: it did not stop when asked';
    case 'interrupted': return 'interrupted: timebox stopped before it ended';
    case 'denied': return 'denied' + (r.approval && r.approval.by ? ' by ' + r.approval.by : '') + ': not run';
    case 'approval_expired': return `no decision within ${fmtMS(r.approval_ms || 0)}: not run`;
    case 'cancelled': return r.phase === 'turn' ? 'stopped with the turn' : 'cancelled';
    case 'error': return 'error' + (r.exit_code !== null && r.exit_code !== undefined ? ` (exit ${r.exit_code})` : '');
    default: return r.outcome || '';
  }
}

// decidedText says how a call's wait for a person ended.
function decidedText(ev) {
  const by = ev.by ? ' by ' + ev.by : '';
  const why = ev.reason ? ': ' + ev.reason : '';
  switch (ev.decision) {
    case 'approve': return `approved${by} after ${fmtMS(ev.waited_ms)}${why}`;
    case 'deny': return `denied${by} after ${fmtMS(ev.waited_ms)}${why}`;
    default: return `no decision within ${fmtMS(ev.waited_ms)}: not run`;
  }
}

// ---- one turn in the timeline -------------------------------------------------

class TurnView {
  // links: whether the closing banner links to the turn's records (not on
  // the records' own page).
  constructor(turnID, parent, links = true) {
    this.id = turnID;
    this.links = links;
    this.root = el('article', { class: 'turn', 'data-turn-id': turnID });
    this.userBubble = el('div', { class: 'bubble user' });
    this.head = el('div', { class: 'turn-head' });
    this.steps = el('div', { class: 'steps' });
    this.tl = new Timeline(); // the same calls, as bars on one time axis
    this.root.append(this.userBubble, this.head, this.tl.node, this.steps);
    parent.append(this.root);
    this.chips = new Map();   // call_id or model attempt → chip state
    this.lastSeq = 0;
    this.applied = 0;         // events applied, each once
    this.finished = false;
    this.budgets = {};
    this.said = null;         // the bubble the current model call streams into
    this.working = new Set(); // model attempts and tool calls under way
    this.asking = new Set();  // calls waiting for a person
    this.ctrl = new AbortController();
    app.views.add(this);
  }

  dispose() {
    this.ctrl.abort();
    for (const c of this.chips.values()) {
      clocks.delete(c.clock);
      clearInterval(c.tick);
    }
    clocks.delete(this.turnClock);
    app.views.delete(this);
  }

  apply(ev) {
    if (ev.seq && ev.seq <= this.lastSeq) return; // a replay overlap: seen already
    if (ev.seq) this.root.dataset.lastSeq = this.lastSeq = ev.seq;
    this.root.dataset.applied = ++this.applied; // equals lastSeq when none was missed
    const f = this['on_' + ev.type];
    if (f) f.call(this, ev);
    this.people(ev);
    this.tl.apply(ev);
    if (this.onApplied) this.onApplied(ev);
  }

  on_turn_started(ev) {
    this.userBubble.textContent = ev.input;
    this.budgets = ev.budgets || {};
    const turn = this.budgets['timeouts.turn'];
    this.turnTimer = el('span', { class: 'timer' });
    this.head.replaceChildren(
      el('span', { text: 'model ' + ev.model }),
      el('span', {}, 'turn ', this.turnTimer),
      el('span', { class: 'mono', text: this.id }));
    this.turnClock = startClock(this.turnTimer, ev.at, turn ? turn.ms : 0);
  }

  // people stops the turn's clock while the turn waits for nothing but
  // people's decisions, as its ceiling does (timeouts.turn counts none of
  // that wait: docs/approvals.md), and starts it again when work goes on.
  people(ev) {
    switch (ev.type) {
      case 'llm_started': this.working.add(`llm-${ev.step}-${ev.attempt}`); break;
      case 'llm_finished': this.working.delete(`llm-${ev.step}-${ev.attempt}`); break;
      case 'tool_started': this.working.add(ev.call_id); break;
      case 'tool_finished': this.working.delete(ev.call_id); this.asking.delete(ev.call_id); break;
      case 'approval_requested': this.asking.add(ev.call_id); break;
      case 'approval_decided': if (!ev.stale) this.asking.delete(ev.call_id); break;
      default: return;
    }
    if (!this.turnClock || this.finished) return;
    const at = Date.parse(ev.at);
    const paused = this.asking.size > 0 && this.working.size === 0;
    if (paused) pauseClock(this.turnClock, at);
    else resumeClock(this.turnClock, at);
    this.turnTimer.dataset.paused = paused;
    this.turnTimer.title = paused ? "waiting for a person: the turn's time (timeouts.turn) does not run" : '';
  }

  chip(key, kind, name, extra) {
    const c = { key };
    c.node = el('div', { class: 'chip running ' + kind, 'data-call-id': key, 'data-tool': name, 'data-outcome': 'running' });
    c.outcome = el('span', { class: 'outcome', text: 'running' });
    c.timer = el('span', { class: 'timer' });
    c.row = el('div', { class: 'row' }, el('span', { class: 'name', text: name }), ...extra, c.outcome, c.timer);
    c.budget = el('div', { class: 'budget' }, el('div', { class: 'used' }));
    c.node.append(c.row, c.budget);
    this.steps.append(c.node);
    this.chips.set(key, c);
    return c;
  }

  on_llm_started(ev) {
    const key = `llm-${ev.step}-${ev.attempt}-${ev.seq}`;
    const fc = this.budgets['timeouts.llm_first_chunk'];
    const c = this.chip(key, 'model', 'model ' + ev.model, [
      el('span', { class: 'badge', text: `${ev.provider}${ev.profile ? ' · ' + ev.profile : ''} · step ${ev.step}${ev.attempt > 1 ? ' · attempt ' + ev.attempt : ''}` }),
    ]);
    c.clock = startClock(c.timer, ev.at, 0, null);
    c.budget.hidden = true;
    if (fc) c.node.title = `first chunk within ${fc.value} (${fc.knob}), then no silence over ${(this.budgets['timeouts.llm_idle'] || {}).value}`;
    this.llm = c;
    this.said = null;
  }

  on_llm_delta(ev) {
    if (!this.said) {
      this.said = el('div', { class: 'bubble said' });
      this.steps.append(this.said);
    }
    this.said.append(ev.text);
  }

  on_llm_finished(ev) {
    const c = this.llm;
    if (!c) return;
    this.llm = null;
    c.node.classList.remove('running');
    c.node.dataset.outcome = ev.outcome;
    const parts = [];
    if (ev.first_chunk_ms) parts.push('first chunk ' + fmtMS(ev.first_chunk_ms));
    if (ev.tool_calls) parts.push(ev.tool_calls + ' tool call' + (ev.tool_calls === 1 ? '' : 's'));
    c.outcome.textContent = ev.outcome === 'ok' ? (parts.join(' · ') || 'ok') : `${ev.outcome}${ev.phase ? ' (' + ev.phase + ')' : ''}`;
    if (ev.error) c.node.append(el('div', { class: 'note', text: ev.error }));
    stopClock(c.clock, ev.stream_ms || Date.parse(ev.at) - Date.parse(ev.started_at));
  }

  on_failover(ev) {
    this.steps.append(el('div', { class: 'notice failover', text: `failover: ${ev.from} → ${ev.to} after ${ev.phase}: ${ev.reason}` }));
  }

  on_tool_started(ev) {
    const badges = [];
    if (ev.arguments && JSON.stringify(ev.arguments) !== '{}') badges.push(el('span', { class: 'args', text: JSON.stringify(ev.arguments) }));
    if (ev.enforcement && ev.enforcement !== 'hard') badges.push(el('span', { class: 'badge', text: ev.enforcement }));
    if (ev.idle_timeout_ms) badges.push(el('span', { class: 'badge', text: 'idle ' + fmtLimit(ev.idle_timeout_ms) }));
    badges.push(el('span', { class: 'badge', text: 'timeout from ' + ev.source }));
    const c = this.chip(ev.call_id, 'tool', ev.tool, badges);
    // Past its timeout a chip says what happens now: an advisory tool is
    // left to finish; any other is being stopped (kill_grace at most).
    const grace = this.budgets['timeouts.kill_grace'];
    c.clock = startClock(c.timer, ev.at, ev.timeout_ms, c.budget, () => {
      if (!c.node.classList.contains('running')) return;
      c.outcome.textContent = ev.enforcement === 'advisory'
        ? 'over its advisory budget: left to finish'
        : 'timeout reached: stopping' + (grace ? ` (kill_grace ${grace.value})` : '');
    });
    c.node.title = `${ev.kind} tool, ${ev.enforcement} enforcement, deadline ${new Date(ev.deadline).toLocaleTimeString()}`;
  }

  // on_approval_requested shows a call waiting for a person: its
  // arguments, the time left to decide, and Approve and Deny, which post
  // the decision (the first one, through any gateway, wins).
  on_approval_requested(ev) {
    const key = 'approval-' + ev.call_id;
    let c = this.chips.get(key);
    if (c) c.node.remove();
    const badges = [];
    if (ev.arguments && JSON.stringify(ev.arguments) !== '{}') badges.push(el('span', { class: 'args', text: JSON.stringify(ev.arguments) }));
    badges.push(el('span', { class: 'badge', text: 'needs approval' + (ev.round > 1 ? ' · asked again' : '') }));
    c = this.chip(key, 'approval', ev.tool, badges);
    c.node.classList.add('waiting');
    c.node.dataset.outcome = 'waiting';
    c.node.dataset.callId = ev.call_id;
    c.outcome.textContent = 'waiting for a decision';
    c.budget.hidden = true;
    c.left = el('span', { class: 'left' });
    const expires = Date.parse(ev.expires_at);
    const tick = () => {
      const ms = Math.max(0, expires - (Date.now() - app.skew));
      c.left.textContent = `${fmtMS(ms)} left to decide (${ev.knob || 'timeouts.approval'})`;
    };
    tick();
    c.tick = setInterval(tick, 500);
    c.reason = el('input', { type: 'text', class: 'reason', placeholder: 'reason (told to the model with a denial)', 'aria-label': 'reason' });
    c.approve = el('button', { type: 'button', class: 'approve', text: 'Approve' });
    c.deny = el('button', { type: 'button', class: 'deny', text: 'Deny' });
    c.said = el('span', { class: 'said' });
    const decide = async (decision) => {
      c.approve.disabled = c.deny.disabled = true;
      let res;
      try {
        res = await api(`/v1/turns/${encodeURIComponent(this.id)}/approvals/${encodeURIComponent(ev.call_id)}`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ decision, reason: c.reason.value, by: 'the page' }),
        });
      } catch (e) {
        // The server could not be reached: the call still waits, and may
        // be decided again.
        c.said.textContent = 'not sent: ' + unsent(e);
        c.approve.disabled = c.deny.disabled = false;
        return;
      }
      if (!res.ok) {
        const b = await res.json().catch(() => ({}));
        c.said.textContent = (b.error && b.error.message) || `refused (${res.status})`;
        if (res.status !== 409) c.approve.disabled = c.deny.disabled = false;
        return;
      }
      c.said.textContent = decision === 'approve' ? 'approved: the call starts' : 'denied';
    };
    c.approve.addEventListener('click', () => decide('approve'));
    c.deny.addEventListener('click', () => decide('deny'));
    c.actions = el('div', { class: 'actions' }, c.approve, c.deny, c.reason, c.left, c.said);
    c.node.append(c.actions);
  }

  // on_approval_decided closes the wait: the decision, who made it, and
  // how long the call waited (never charged to its timeout nor the turn).
  on_approval_decided(ev) {
    const c = this.chips.get('approval-' + ev.call_id);
    if (!c) return;
    this.closeApproval(c, ev.decision, ev.stale
      ? `approved by ${ev.by || 'someone'}, too long ago to act on: asked again`
      : decidedText(ev));
  }

  closeApproval(c, decision, text) {
    clearInterval(c.tick);
    c.node.classList.remove('running', 'waiting');
    c.node.dataset.outcome = decision === 'approve' ? 'approved' : decision === 'deny' ? 'denied' : decision;
    c.outcome.textContent = text;
    if (c.actions) c.actions.remove();
  }

  on_tool_progress(ev) {
    const c = this.chips.get(ev.call_id);
    if (!c) return;
    if (!c.progress) {
      c.fill = el('div', { class: 'fill' });
      c.ptext = el('span', { class: 'ptext' });
      c.progress = el('div', { class: 'progress' }, el('div', { class: 'bar' }, c.fill), c.ptext);
      c.budget.after(c.progress);
      c.count = 0;
    }
    c.count++;
    const known = typeof ev.progress === 'number' && typeof ev.total === 'number' && ev.total > 0;
    c.progress.classList.toggle('indeterminate', !known);
    if (known) c.fill.style.width = Math.min(100, (100 * ev.progress) / ev.total) + '%';
    c.progress.dataset.progress = known ? String(ev.progress / ev.total) : '';
    c.ptext.textContent = ev.message || (known ? `${ev.progress} of ${ev.total}` : `${c.count} progress reports`);
  }

  // on_still_working puts a note on the chip of each silent call the notice
  // names (calls); a notice stored before notices named their calls is its
  // own one call.
  on_still_working(ev) {
    if (ev.waiting) {
      // Nothing of the turn runs (the Temporal engine: no worker takes its
      // work); the engine says so once for each wait.
      this.steps.append(el('div', { class: 'notice waiting', text: 'Waiting: ' + ev.waiting }));
      return;
    }
    for (const call of ev.calls || [ev]) this.stillWorking(call);
  }

  stillWorking(call) {
    const text = `still working: ${call.subject} for ${fmtMS(call.elapsed_ms)}` +
      (typeof call.silent_ms === 'number' ? `, no progress for ${fmtMS(call.silent_ms)}` : '') +
      (call.limit_ms ? ` (budget ${fmtLimit(call.limit_ms)})` : '');
    const c = call.call_id && this.chips.get(call.call_id);
    if (c && c.node.classList.contains('running')) {
      if (!c.still) {
        c.still = el('div', { class: 'note still-working' });
        c.node.append(c.still);
      }
      c.still.textContent = text;
      return;
    }
    if (this.llm && call.subject.startsWith('model')) {
      if (!this.llm.still) {
        this.llm.still = el('div', { class: 'note still-working' });
        this.llm.node.append(this.llm.still);
      }
      this.llm.still.textContent = text;
      return;
    }
    this.steps.append(el('div', { class: 'notice still-working', text }));
  }

  on_tool_finished(ev) {
    const c = this.chips.get(ev.call_id);
    const waited = this.chips.get('approval-' + ev.call_id);
    if (!c && waited) {
      // The call never ran: denied, expired, or its turn stopped.
      if (waited.node.classList.contains('waiting')) this.closeApproval(waited, ev.outcome, outcomeText(ev));
      if (ev.result) waited.node.append(el('details', {}, el('summary', { text: 'what the model was given' }), el('pre', { text: ev.result })));
      return;
    }
    if (!c) return;
    c.node.classList.remove('running');
    c.node.dataset.outcome = ev.outcome;
    c.node.classList.toggle('overran', !!ev.overran);
    c.outcome.textContent = outcomeText(ev);
    stopClock(c.clock, ev.duration_ms);
    if (c.progress && ev.progress_count) c.ptext.textContent += ` · ${ev.progress_count} reports`;
    const notes = [];
    if (ev.overran) notes.push(`ran ${fmtMS(ev.duration_ms)} against its advisory ${fmtLimit(ev.timeout_ms)} budget` +
      (ev.outcome === 'ok' ? '; its result was used' : ''));
    if (ev.outcome === 'timed_out' || ev.outcome === 'abandoned') notes.push('the model was told it timed out and the turn went on');
    if (ev.abandoned) notes.push('still running after kill_grace: abandoned, counted, and not waited for');
    if (ev.truncated) notes.push('output cut to limits.max_tool_output');
    if (notes.length) c.node.append(el('div', { class: 'note', text: notes.join('; ') }));
    if (ev.result) c.node.append(el('details', {}, el('summary', { text: 'what the model was given' }), el('pre', { text: ev.result })));
  }

  on_late_result(ev) {
    const c = this.chips.get(ev.call_id);
    const text = `late result after ${fmtMS(ev.duration_ms)}: recorded, not given to the model`;
    if (c) c.node.append(el('div', { class: 'note late', text }));
  }

  on_compaction_started(ev) {
    this.compaction = el('div', { class: 'notice', text: `compacting history: ~${ev.estimated_tokens} tokens over ${ev.compact_at} (budget ${fmtLimit(ev.limit_ms)})` });
    this.steps.append(this.compaction);
  }

  on_compaction_finished(ev) {
    const text = ev.outcome === 'ok'
      ? `history compacted in ${fmtMS(ev.duration_ms)}: ${ev.tokens_before} → ${ev.tokens_after} tokens`
      : `compaction ${ev.outcome}${ev.phase ? ' (' + ev.phase + ')' : ''}: ${ev.message || ''}`;
    this.steps.append(el('div', { class: 'notice', text }));
  }

  on_turn_finished(ev) {
    this.finished = true;
    for (const c of this.chips.values()) {
      if (c.node.classList.contains('waiting')) this.closeApproval(c, 'cancelled', 'ended with the turn');
      if (c.node.classList.contains('running')) {
        c.node.classList.remove('running');
        c.node.dataset.outcome = 'cancelled';
        c.outcome.textContent = 'ended with the turn';
        clocks.delete(c.clock);
      }
    }
    // The turn's time against its ceiling: its wall time less its waits
    // for nothing but people.
    const tot = ev.totals || {};
    if (this.turnClock) stopClock(this.turnClock, tot.wall_ms == null ? undefined : tot.wall_ms - (tot.approval_ms || 0));
    if (this.turnTimer && tot.approval_ms) {
      this.turnTimer.dataset.paused = false;
      this.turnTimer.title = `and ${fmtMS(tot.approval_ms)} waiting for people, which timeouts.turn does not count`;
    }
    if (ev.answer) {
      if (this.said && this.said.textContent === ev.answer) this.said.classList.add('answer');
      else this.steps.append(el('div', { class: 'bubble said answer', text: ev.answer }));
    }
    this.root.append(banner(ev, this.links ? this.id : ''));
  }
}

// closeFrom ends a view from the turn's record when its events did not: a
// turn interrupted by a crash has no turn_finished.
TurnView.prototype.closeFrom = function (rec) {
  if (this.finished || rec.status === 'running') return;
  this.tl.addRecord(rec);
  this.tl.finish(tlTime(rec.ended_at));
  this.on_turn_finished({ status: rec.status, stop_reason: rec.stop_reason, message: rec.message,
    answer: '', flags: rec.flags, totals: recordTotals(rec) });
};

// follow streams a turn's events after the last one view has applied
// (view.lastSeq) into view, reconnecting with ?after= when the connection
// drops, until the turn has ended. It is how every view of a running turn
// is live: the chat's, and the records page's of a turn still running.
async function follow(view) {
  view.following = true;
  try {
    await followStream(view);
  } finally {
    view.following = false;
    connIdle();
  }
}

// connIdle clears the stream indicator once no view follows a turn.
function connIdle() {
  if (![...app.views].some((v) => v.following)) setConn('', '');
}

async function followStream(view) {
  let delay = 500;
  while (!view.finished && !view.ctrl.signal.aborted) {
    try {
      const res = await api(`/v1/turns/${encodeURIComponent(view.id)}/events?after=${view.lastSeq}`,
        { headers: { Accept: 'text/event-stream' }, signal: view.ctrl.signal });
      if (res.status === 204) break; // ended, and nothing we have not seen
      if (!res.ok) throw new Error(await errorText(res));
      setConn('live', 'live');
      await readSSE(res.body, (ev) => {
        // Keep the newest step in sight, unless the reader scrolled up.
        const stick = window.innerHeight + window.scrollY >= document.body.scrollHeight - 160;
        view.apply(ev);
        if (stick) window.scrollTo(0, document.body.scrollHeight);
      });
      delay = 500;
    } catch (e) {
      if (view.ctrl.signal.aborted) return;
      console.warn('event stream:', e);
    }
    if (view.finished) break;
    setConn('reconnecting', `reconnecting after event ${view.lastSeq}…`);
    await sleep(delay);
    delay = Math.min(delay * 2, 5000);
  }
  if (!view.finished && !view.ctrl.signal.aborted) {
    try {
      view.closeFrom(await getJSON('/v1/turns/' + encodeURIComponent(view.id) + '?events=false'));
    } catch (e) {
      view.root.append(el('p', { class: 'error', text: e.message }));
    }
  }
  if (app.running === view) {
    app.running = null;
    composerIdle();
  }
}

// ---- the chat ---------------------------------------------------------------

function composerBusy(view) {
  app.running = view;
  $('#send').disabled = true;
  $('#cancel').hidden = false;
}

function composerIdle() {
  $('#send').disabled = false;
  $('#cancel').hidden = true;
  $('#cancel').disabled = false;
}

function showError(msg) {
  const e = $('#composer-error');
  e.textContent = msg || '';
  e.hidden = !msg;
}

function clearChat() {
  for (const v of [...app.views]) v.dispose();
  $('#timeline').replaceChildren();
  app.running = null;
  setConn('', '');
  composerIdle();
  showError('');
}

// chatLink points the Chat tab at the conversation on screen, so that a
// visit to Past turns comes back to it.
function chatLink() {
  $('#nav-chat').href = app.session ? '#/chat/' + encodeURIComponent(app.session) : '#/';
}

async function openChat(session) {
  clearChat();
  app.session = session || '';
  chatLink();
  $('#session-label').textContent = session ? 'conversation ' + session : 'new conversation';
  $('#empty').hidden = !!session;
  if (!session) return;
  let s;
  try {
    s = await getJSON('/v1/sessions/' + encodeURIComponent(session));
  } catch (e) {
    showError(e.message);
    return;
  }
  if (app.session !== session) return; // the user moved on meanwhile
  for (const t of s.turns) {
    const view = new TurnView(t.turn_id, $('#timeline'));
    if (t.status === 'running') {
      composerBusy(view);
      follow(view);
      continue;
    }
    try {
      const rec = await getJSON('/v1/turns/' + encodeURIComponent(t.turn_id));
      for (const ev of rec.events || []) view.apply(ev);
      view.closeFrom(rec);
    } catch (e) {
      view.root.append(el('p', { class: 'error', text: e.message }));
    }
  }
}

// turnBody is POST /v1/turns's body: the message, and the turn budget when
// one is given (the server checks it against its ceiling).
function turnBody(input) {
  const body = { session_id: app.session, input, detach: true };
  const turn = $('#turn-budget').value.trim();
  if (turn) body.budgets = { turn };
  return body;
}

async function send(ev) {
  ev.preventDefault();
  const input = $('#input').value;
  if (!input.trim() || app.running) return;
  showError('');
  $('#send').disabled = true;
  let res;
  try {
    // detach: the turn outlives this page; it is followed through its
    // event stream, which survives reloads and dropped connections.
    res = await api('/v1/turns', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify(turnBody(input)),
    });
  } catch (e) {
    showError(unsent(e));
    $('#send').disabled = false;
    return;
  }
  if (res.status !== 202) {
    showError(await errorText(res));
    $('#send').disabled = false;
    return;
  }
  const acc = await res.json();
  $('#input').value = '';
  $('#empty').hidden = true;
  if (app.session !== acc.session_id) {
    app.session = acc.session_id;
    $('#session-label').textContent = 'conversation ' + acc.session_id;
    history.replaceState(null, '', '#/chat/' + encodeURIComponent(acc.session_id));
    chatLink();
  }
  const view = new TurnView(acc.turn_id, $('#timeline'));
  composerBusy(view);
  follow(view);
}

async function cancelTurn() {
  const view = app.running;
  if (!view) return;
  $('#cancel').disabled = true;
  try {
    const res = await api(`/v1/turns/${encodeURIComponent(view.id)}/cancel`, { method: 'POST' });
    if (!res.ok && res.status !== 202 && res.status !== 409) showError(await errorText(res));
  } catch (e) {
    showError(unsent(e));
    $('#cancel').disabled = false;
  }
}

// ---- past turns ---------------------------------------------------------------

let turnsBefore = '';

async function openTurns(more) {
  const tbody = $('#turns-table tbody');
  if (!more) {
    tbody.replaceChildren();
    turnsBefore = '';
  }
  const q = new URLSearchParams({ limit: '50' });
  if ($('#filter-status').value) q.set('status', $('#filter-status').value);
  if ($('#filter-reason').value) q.set('stop_reason', $('#filter-reason').value);
  if (more && turnsBefore) q.set('before', turnsBefore);
  let list;
  try {
    list = await getJSON('/v1/turns?' + q);
  } catch (e) {
    tbody.append(el('tr', {}, el('td', { colspan: '7', class: 'error', text: e.message })));
    return;
  }
  for (const t of list.turns) {
    const go = () => { location.hash = '#/turns/' + encodeURIComponent(t.turn_id); };
    tbody.append(el('tr', { class: 'link', 'data-turn-id': t.turn_id, onclick: go },
      el('td', { text: when(t.started_at) }),
      el('td', { text: short(t.input, 80) }),
      el('td', {}, el('span', { class: 'status ' + t.status, text: t.status })),
      el('td', { text: t.stop_reason || '' }),
      el('td', { class: 'num', text: t.status === 'running' ? '' : fmtMS(t.wall_ms) }),
      el('td', { class: 'num', text: String(t.steps) }),
      el('td', { class: 'num', text: String(t.tool_calls) })));
  }
  turnsBefore = list.next_before || '';
  $('#turns-more').hidden = !turnsBefore;
  $('#turns-empty').hidden = tbody.children.length > 0;
}

// ---- webhook deliveries -------------------------------------------------------

// openDeliveries lists GET /v1/webhooks/deliveries: each delivery's event,
// receiver and state, its attempts, the last one's status, time and error,
// and when it is tried again.
async function openDeliveries() {
  const tbody = $('#deliveries-table tbody');
  tbody.replaceChildren();
  const q = new URLSearchParams({ limit: '100' });
  if ($('#filter-delivery').value) q.set('state', $('#filter-delivery').value);
  let list;
  try {
    list = await getJSON('/v1/webhooks/deliveries?' + q);
  } catch (e) {
    tbody.append(el('tr', {}, el('td', { colspan: '7', class: 'error', text: e.message })));
    return;
  }
  for (const d of list.deliveries) {
    const last = d.attempts.length ? d.attempts[d.attempts.length - 1] : null;
    const lastText = last ? (last.status ? String(last.status) : 'no answer') + ' in ' + fmtMS(last.duration_ms) + (last.error ? ': ' + last.error : '') : '';
    const turn = d.turn_id ? el('a', { href: '#/turns/' + encodeURIComponent(d.turn_id), text: d.event_type }) : d.event_type;
    tbody.append(el('tr', { 'data-delivery-id': d.id, title: d.id },
      el('td', { text: when(d.created_at) }),
      el('td', {}, turn),
      el('td', { text: short(d.url, 60) }),
      el('td', {}, el('span', { class: 'status ' + d.state, text: d.state })),
      el('td', { class: 'num', text: String(d.attempts.length) }),
      el('td', { text: lastText }),
      el('td', { text: d.state === 'pending' && d.next_attempt_at ? when(d.next_attempt_at) : '' })));
  }
  $('#deliveries-empty').hidden = tbody.children.length > 0;
}

// against draws a duration against its budget.
function against(ms, limit) {
  const over = limit && ms > limit;
  const fill = el('div', { class: 'fill' });
  fill.style.width = (limit ? Math.min(100, (100 * ms) / limit) : 0) + '%';
  return el('div', { class: 'against' + (over ? ' over' : '') }, el('div', { class: 'bar' }, fill),
    el('span', { text: fmtMS(ms) + (limit ? ' / ' + fmtLimit(limit) : '') }));
}

// turnPage is the live view on the records page of a turn that was running
// when the page opened; turnGen counts the records pages opened, so that one
// left while it loaded does not draw over the next.
let turnPage = null;
let turnGen = 0;

function closeTurnPage() {
  turnGen++;
  if (turnPage) {
    turnPage.dispose();
    turnPage = null;
    connIdle();
  }
}

// openTurn shows a turn's records page. A turn that has ended is a static
// view of its record. A running one shows what is stored, as the chat does,
// then follows its event stream from the last stored event until
// turn_finished, and then its final record.
async function openTurn(id) {
  closeTurnPage();
  const gen = turnGen;
  const root = $('#turn-view');
  root.replaceChildren(el('p', { class: 'muted', text: 'Loading turn ' + id + '…' }));
  delete root.dataset.state;
  let rec;
  try {
    rec = await getJSON('/v1/turns/' + encodeURIComponent(id));
  } catch (e) {
    if (gen === turnGen) root.replaceChildren(el('p', { class: 'error', text: e.message }));
    return;
  }
  if (gen !== turnGen) return; // the reader moved on meanwhile
  if (rec.status === 'running') {
    await openLiveTurn(root, rec, gen);
    return;
  }
  root.dataset.state = 'ended';
  const finished = (rec.events || []).find((e) => e.type === 'turn_finished');
  const kids = turnFacts(rec);
  kids.push(el('h2', { text: 'Timeline' }), Timeline.of(rec).node);
  kids.push(banner({ status: rec.status, stop_reason: rec.stop_reason, message: rec.message, flags: rec.flags,
    totals: recordTotals(rec), limit: finished && finished.limit }, ''));
  if (rec.answer) kids.push(el('div', { class: 'bubble said answer', text: rec.answer }));
  root.replaceChildren(...kids, ...recordTables(rec));
}

async function openLiveTurn(root, rec, gen) {
  const id = rec.turn_id;
  root.dataset.state = 'running';
  const facts = el('div', { class: 'turn-facts' }, ...turnFacts(rec));
  const timeline = el('div', { class: 'live-timeline' });
  const records = el('div', { class: 'records' });
  root.replaceChildren(facts, el('h2', { text: 'Timeline' }), timeline, records);
  const view = new TurnView(id, timeline, false);
  turnPage = view;
  // While it runs, the tables grow with the records that tool_finished and
  // llm_finished carry, as the events are applied (each once).
  const sofar = { status: 'running', tool_calls: [], model_calls: [] };
  let loading = true;
  view.onApplied = (ev) => {
    if (ev.type === 'tool_finished') sofar.tool_calls.push(ev);
    else if (ev.type === 'llm_finished') sofar.model_calls.push(ev);
    else return;
    if (!loading) records.replaceChildren(...recordTables(sofar));
  };
  for (const ev of rec.events || []) view.apply(ev);
  loading = false;
  records.replaceChildren(...recordTables(sofar));
  await follow(view);
  if (gen !== turnGen || view.ctrl.signal.aborted) return;
  // The stream ends once the record is stored; should the store lag, the
  // record is read again for a few seconds before the tables stay as they
  // are.
  let fin = null;
  for (let i = 0; i < 20 && gen === turnGen; i++) {
    try {
      fin = await getJSON('/v1/turns/' + encodeURIComponent(id) + '?events=false');
    } catch (e) {
      records.prepend(el('p', { class: 'error', text: e.message }));
      break;
    }
    if (fin.status !== 'running') break;
    await sleep(250);
  }
  if (gen !== turnGen) return;
  if (fin && fin.status !== 'running') {
    facts.replaceChildren(...turnFacts(fin));
    records.replaceChildren(...recordTables(fin));
  }
  root.dataset.state = 'ended';
}

// turnFacts is the heading of a turn's records page.
function turnFacts(rec) {
  return [el('h2', { text: 'Turn ' + rec.turn_id }), el('dl', { class: 'facts' },
    el('dt', { text: 'Input' }), el('dd', { text: rec.input }),
    el('dt', { text: 'Started' }), el('dd', { text: when(rec.started_at) }),
    el('dt', { text: 'Status' }), el('dd', {}, el('span', { class: 'status ' + rec.status, text: rec.status }),
      rec.stop_reason ? ' · ' + rec.stop_reason : ''),
    el('dt', { text: 'Conversation' }), el('dd', {}, rec.session_id
      ? el('a', { href: '#/chat/' + encodeURIComponent(rec.session_id), text: rec.session_id }) : '—'))];
}

// recordTables are a turn's tool and model call records.
function recordTables(rec) {
  const kids = [el('h2', { text: 'Tool calls' })];
  const tools = rec.tool_calls || [];
  if (!tools.length) kids.push(el('p', { class: 'muted', text: rec.status === 'running' ? 'None ended yet.' : 'None.' }));
  else {
    const rows = tools.map((c) => {
      const notes = [];
      if (c.phase) notes.push('phase ' + c.phase);
      if (c.overran) notes.push('overran');
      if (c.abandoned) notes.push('abandoned');
      if (c.late_result) notes.push('late result recorded');
      if (c.truncated) notes.push('output truncated');
      if (c.exit_code !== null && c.exit_code !== undefined) notes.push('exit ' + c.exit_code);
      return el('tr', { 'data-call-id': c.call_id, 'data-outcome': c.outcome },
        el('td', { class: 'mono', text: c.tool }),
        el('td', { text: c.kind }),
        el('td', { text: String(c.step) }),
        el('td', { text: c.outcome }),
        el('td', {}, against(c.duration_ms, c.timeout_ms)),
        el('td', { text: c.timeout_source }),
        el('td', { text: c.idle_timeout_ms ? fmtLimit(c.idle_timeout_ms) : '—' }),
        el('td', { text: c.enforcement }),
        el('td', { class: 'num', text: String(c.progress_count) }),
        el('td', { text: notes.join(', ') }));
    });
    kids.push(el('table', { class: 'grid calls' },
      el('thead', {}, el('tr', {}, ...['Tool', 'Kind', 'Step', 'Outcome', 'Duration / budget', 'Budget from', 'Idle', 'Enforcement', 'Progress', 'Notes']
        .map((h) => el('th', { text: h })))),
      el('tbody', {}, ...rows)));
  }

  kids.push(el('h2', { text: 'Model calls' }));
  const models = rec.model_calls || [];
  if (!models.length) kids.push(el('p', { class: 'muted', text: rec.status === 'running' ? 'None ended yet.' : 'None.' }));
  else {
    kids.push(el('table', { class: 'grid models' },
      el('thead', {}, el('tr', {}, ...['Step', 'Model', 'Credential', 'Attempt', 'First chunk', 'Streaming', 'Outcome', 'Error']
        .map((h) => el('th', { text: h })))),
      el('tbody', {}, ...models.map((m) => el('tr', { 'data-outcome': m.outcome },
        el('td', { text: String(m.step) + (m.compaction ? ' (compaction)' : '') }),
        el('td', { class: 'mono', text: m.provider + ':' + m.model }),
        el('td', { text: m.profile || '—' }),
        el('td', { class: 'num', text: String(m.attempt) }),
        el('td', { class: 'num', text: fmtMS(m.first_chunk_ms) }),
        el('td', { class: 'num', text: fmtMS(m.stream_ms) }),
        el('td', { text: m.outcome + (m.phase ? ' (' + m.phase + ')' : '') }),
        el('td', { text: m.error || '' }))))));
  }
  return kids;
}

// ---- routing ----------------------------------------------------------------

// Routes: #/ a new chat; #/chat/{session} a conversation (its running turn is
// followed); #/turns past turns; #/turns/{id} one turn's records (followed
// while it runs); #/stats each tool's calls against its budgets (stats.js);
// #/webhooks the webhook deliveries.
function route() {
  closeTurnPage(); // a records page left stops following its turn
  const parts = location.hash.replace(/^#\/?/, '').split('/').map((p) => {
    try {
      return decodeURIComponent(p);
    } catch (_) {
      return p; // a malformed escape: taken as written
    }
  });
  const view = parts[0] || 'chat';
  for (const s of ['chat-view', 'turns-view', 'turn-view', 'stats-view', 'webhooks-view']) $('#' + s).hidden = true;
  $('#nav-chat').classList.toggle('active', view === 'chat');
  $('#nav-turns').classList.toggle('active', view === 'turns');
  $('#nav-stats').classList.toggle('active', view === 'stats');
  $('#nav-webhooks').classList.toggle('active', view === 'webhooks');
  if (view === 'webhooks') {
    $('#webhooks-view').hidden = false;
    openDeliveries();
  } else if (view === 'stats') {
    $('#stats-view').hidden = false;
    openStats();
  } else if (view === 'turns' && parts[1]) {
    $('#turn-view').hidden = false;
    openTurn(parts[1]);
  } else if (view === 'turns') {
    $('#turns-view').hidden = false;
    openTurns(false);
  } else {
    $('#chat-view').hidden = false;
    const session = parts[0] === 'chat' ? parts[1] || '' : '';
    if (session !== app.session || !session) openChat(session);
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('#composer').addEventListener('submit', send);
  $('#cancel').addEventListener('click', cancelTurn);
  $('#input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) {
      e.preventDefault();
      $('#composer').requestSubmit();
    }
  });
  $('#filter-status').addEventListener('change', () => openTurns(false));
  $('#filter-reason').addEventListener('change', () => openTurns(false));
  $('#turns-more').addEventListener('click', () => openTurns(true));
  $('#stats-since').addEventListener('change', () => openStats());
  $('#filter-delivery').addEventListener('change', () => openDeliveries());
  window.addEventListener('hashchange', route);
  app.session = null; // force the first route to open the chat
  route();
});
