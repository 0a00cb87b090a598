// The operator dashboard: a read-only view of one run, from the coordinator's JSON API and its
// server-sent event stream. No framework, no build step, nothing from another origin.
//
// Data flow: the JSON endpoints give the state (run progress, nodes, leaderboard); the event
// stream gives what happens (joins, steps, loss, completed shards) and drives the loss chart and
// the event list. Events update the view at once where they carry the whole fact (a peer's
// state, the step, a loss point) and schedule a debounced JSON refresh where they do not (shard
// counts, the ledger). A slow periodic refresh catches what raises no event (heartbeats, leases).
//
// Reconnect: on any stream error the page closes the EventSource and opens a new one after a
// back-off, asking for the whole ring again (?after=0) and skipping events it already has, keyed
// by (id, time). Resuming by Last-Event-ID alone would lose events after a coordinator restart,
// whose event ids start again from 1.
'use strict';

(function () {
  const API = '/api/v1';
  const REFRESH_EVERY_MS = 5000;
  const REFRESH_DEBOUNCE_MS = 300;
  const MAX_EVENTS_SHOWN = 100;
  const MAX_LOSS_POINTS = 4000;
  const MAX_PEER_ROWS = 200;
  const LEADERBOARD_ROWS = 20;
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 30000;
  const EVENT_TYPES = ['run_created', 'peer_joined', 'peer_left', 'peer_evicted', 'step_progress',
    'loss', 'shard_completed', 'lease_expired'];
  const STATE_ORDER = { active: 0, gone: 1, left: 2, evicted: 3 };

  const st = {
    runId: null,
    run: null,
    nodes: new Map(),        // peer_id -> node record (API shape)
    leaderboard: [],
    losses: [],              // {step, loss}
    lossVersion: 0,          // bumped on every change of losses (the chart redraws on a new one)
    steps: [],               // {t (ms), step} for the step rate
    events: [],              // newest last
    seen: new Set(),         // "id:time" of events applied
    seenOrder: [],
    es: null,
    retryMs: RETRY_MIN_MS,
    refreshTimer: null,
    refreshing: false,
    refreshAgain: false,
    clockOffsetS: 0,         // server clock - browser clock, from the Date header
  };

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ helpers

  function shortPeer(peer) {
    if (typeof peer !== 'string') return '?';
    return peer.length > 10 ? '…' + peer.slice(-8) : peer;
  }

  function fmtInt(n) {
    return Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '–';
  }

  function fmtDuration(s) {
    if (!Number.isFinite(s) || s < 0) return '–';
    if (s < 60) return Math.floor(s) + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min';
    if (s < 86400) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(1) + ' d';
  }

  function nowServerS() {
    return Date.now() / 1000 + st.clockOffsetS;
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function setText(id, text) {
    const e = $(id);
    if (e.textContent !== String(text)) e.textContent = String(text);
  }

  function showMessage(text) {
    const m = $('message');
    m.textContent = text || '';
    m.hidden = !text;
  }

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = text;
  }

  async function getJSON(path) {
    const r = await fetch(API + path, { headers: { Accept: 'application/json' }, cache: 'no-store' });
    const date = Date.parse(r.headers.get('Date') || '');
    if (Number.isFinite(date)) st.clockOffsetS = (date - Date.now()) / 1000;
    if (!r.ok) {
      let msg = r.status + ' ' + r.statusText;
      try {
        const body = await r.json();
        if (body && body.error && body.error.message) msg = body.error.message;
      } catch (_) { /* not JSON */ }
      throw new Error(msg);
    }
    return r.json();
  }

  // ------------------------------------------------------------------ run choice

  function runFromUrl() {
    const q = new URLSearchParams(window.location.search).get('run');
    if (q) return q;
    const h = new URLSearchParams(window.location.hash.replace(/^#/, '')).get('run');
    return h || null;
  }

  async function chooseRun() {
    const { runs } = await getJSON('/runs');
    const sel = $('run-select');
    sel.replaceChildren();
    for (const id of runs) {
      const o = el('option', id);
      o.value = id;
      sel.appendChild(o);
    }
    const wanted = runFromUrl();
    const id = wanted || runs[0] || null;
    if (id !== null && !runs.includes(id)) {
      const o = el('option', id);
      o.value = id;
      sel.appendChild(o);
    }
    if (id !== null) sel.value = id;
    sel.addEventListener('change', () => {
      const u = new URL(window.location.href);
      u.searchParams.set('run', sel.value);
      u.hash = '';
      window.location.assign(u.toString());
    });
    return id;
  }

  // ------------------------------------------------------------------ JSON state

  async function refresh() {
    if (st.refreshing) { st.refreshAgain = true; return; }
    st.refreshing = true;
    try {
      const id = encodeURIComponent(st.runId);
      const [run, nodes, board] = await Promise.all([
        getJSON('/runs/' + id),
        getJSON('/runs/' + id + '/nodes'),
        getJSON('/runs/' + id + '/leaderboard?limit=' + LEADERBOARD_ROWS),
      ]);
      // A read that started before a step event must not move the step back: steps only grow.
      if (st.run) run.progress.step = Math.max(run.progress.step, st.run.progress.step);
      st.run = run;
      const fresh = new Map();
      for (const n of nodes.nodes) {
        const old = st.nodes.get(n.peer_id);
        if (old) n.last_step = Math.max(n.last_step, old.last_step || 0);
        fresh.set(n.peer_id, n);
      }
      st.nodes = fresh;
      st.leaderboard = board.leaderboard;
      showMessage('');
      render();
    } catch (e) {
      showMessage('cannot read run ' + st.runId + ': ' + e.message);
    } finally {
      st.refreshing = false;
      if (st.refreshAgain) { st.refreshAgain = false; scheduleRefresh(); }
    }
  }

  function scheduleRefresh() {
    if (st.refreshTimer !== null) return;
    st.refreshTimer = setTimeout(() => { st.refreshTimer = null; refresh(); }, REFRESH_DEBOUNCE_MS);
  }

  // ------------------------------------------------------------------ events

  function remember(key) {
    st.seen.add(key);
    st.seenOrder.push(key);
    if (st.seenOrder.length > 8192) {
      for (const k of st.seenOrder.splice(0, 4096)) st.seen.delete(k);
    }
  }

  function upsertNode(peer, patch) {
    const n = st.nodes.get(peer);
    if (n) Object.assign(n, patch);
    else st.nodes.set(peer, Object.assign({ peer_id: peer, last_step: 0, agent: '', last_seen: null }, patch));
  }

  function summary(type, d) {
    switch (type) {
      case 'run_created': return 'run created (' + d.units + ' shard units)';
      case 'peer_joined': return shortPeer(d.peer_id) + (d.returned ? ' came back' : ' joined');
      case 'peer_left': return shortPeer(d.peer_id) + ' left (' + d.reason + ')';
      case 'peer_evicted': return shortPeer(d.peer_id) + ' evicted: ' + d.reason;
      case 'step_progress': return 'step ' + d.step + ' (' + shortPeer(d.peer_id) + ')';
      case 'loss': return 'loss ' + Number(d.loss).toFixed(4) + ' at step ' + d.step + ' (' + d.reports + ' reports)';
      case 'shard_completed': return shortPeer(d.peer_id) + ' completed ' + d.shard_id + ' (unit ' + d.unit + ')';
      case 'lease_expired': return 'lease of unit ' + d.unit + ' expired';
      default: return type;
    }
  }

  function apply(type, d) {
    const p = st.run && st.run.progress;
    switch (type) {
      case 'peer_joined':
        upsertNode(d.peer_id, { state: 'active', last_seen: d.time });
        scheduleRefresh();
        break;
      case 'peer_left':
        upsertNode(d.peer_id, { state: d.reason === 'timeout' ? 'gone' : 'left' });
        scheduleRefresh();
        break;
      case 'peer_evicted':
        upsertNode(d.peer_id, { state: 'evicted' });
        scheduleRefresh();
        break;
      case 'step_progress': {
        if (p) p.step = Math.max(p.step, d.step);
        const n = st.nodes.get(d.peer_id);
        if (n) { n.last_step = Math.max(n.last_step || 0, d.step); n.last_seen = d.time; }
        st.steps.push({ t: d.time * 1000, step: d.step });
        if (st.steps.length > 600) st.steps.splice(0, st.steps.length - 600);
        break;
      }
      case 'loss':
        if (Number.isFinite(d.loss)) {
          st.losses.push({ step: d.step, loss: d.loss });
          if (st.losses.length > MAX_LOSS_POINTS) st.losses.splice(0, st.losses.length - MAX_LOSS_POINTS);
          st.lossVersion += 1;
        }
        if (p) p.step = Math.max(p.step, d.step);
        break;
      case 'shard_completed':
      case 'lease_expired':
      case 'run_created':
        scheduleRefresh();
        break;
      default:
        break;
    }
  }

  function onEvent(ev) {
    let d;
    try { d = JSON.parse(ev.data); } catch (_) { return; }
    if (!d || typeof d !== 'object') return;
    const key = ev.lastEventId + ':' + d.time;
    if (st.seen.has(key)) return;
    remember(key);
    apply(ev.type, d);
    st.events.push({ id: ev.lastEventId, type: ev.type, time: d.time, text: summary(ev.type, d) });
    if (st.events.length > MAX_EVENTS_SHOWN) st.events.splice(0, st.events.length - MAX_EVENTS_SHOWN);
    renderSoon();
  }

  function connect() {
    if (st.es) st.es.close();
    setConn('connecting', 'connecting…');
    const url = API + '/runs/' + encodeURIComponent(st.runId) + '/events?after=0';
    const es = new EventSource(url);
    st.es = es;
    es.onopen = () => {
      st.retryMs = RETRY_MIN_MS;
      setConn('live', 'live');
      scheduleRefresh(); // what changed while we were away
    };
    es.onerror = () => {
      // Reconnect ourselves (see the header): close, wait, reopen with the whole ring.
      es.close();
      if (st.es !== es) return;
      st.es = null;
      const wait = st.retryMs;
      st.retryMs = Math.min(RETRY_MAX_MS, st.retryMs * 2);
      setConn('reconnecting', 'reconnecting in ' + Math.round(wait / 1000) + ' s…');
      setTimeout(connect, wait);
    };
    for (const t of EVENT_TYPES) es.addEventListener(t, onEvent);
  }

  // ------------------------------------------------------------------ rendering

  let renderQueued = false;
  function renderSoon() {
    if (renderQueued) return;
    renderQueued = true;
    requestAnimationFrame(() => { renderQueued = false; render(); });
  }

  function render() {
    renderSummary();
    renderShards();
    renderLoss();
    renderPeers();
    renderLeaderboard();
    renderEvents();
  }

  function renderSummary() {
    const r = st.run;
    if (!r) return;
    const p = r.progress;
    setText('run-state', r.state);
    $('run-state').dataset.state = r.state;
    setText('step', fmtInt(p.step));
    const s = st.steps;
    let rate = '';
    if (s.length >= 2) {
      const a = s[Math.max(0, s.length - 30)];
      const b = s[s.length - 1];
      const dt = (b.t - a.t) / 1000;
      if (dt > 0) rate = ((b.step - a.step) / dt).toFixed(2) + ' steps/s';
    }
    setText('step-rate', rate);
    let live = 0;
    for (const n of st.nodes.values()) if (n.state === 'active') live += 1;
    setText('peers-live', fmtInt(live));
    setText('peers-total', fmtInt(st.nodes.size) + ' known');
    const last = st.losses[st.losses.length - 1];
    setText('loss-latest', last ? last.loss.toFixed(4) : '–');
    setText('loss-step', last ? 'at step ' + last.step : 'no report yet');
  }

  function renderShards() {
    const r = st.run;
    if (!r) return;
    const p = r.progress;
    const total = p.units;
    const pending = Math.max(0, total - p.done - p.leased);
    setText('shards-done', fmtInt(p.done));
    setText('shards-leased', fmtInt(p.leased));
    setText('shards-pending', fmtInt(pending));
    setText('shards-total', fmtInt(total));
    setText('shards-done-big', fmtInt(p.done) + ' / ' + fmtInt(total));
    const pct = total > 0 ? (100 * p.done) / total : 0;
    setText('shards-pct', pct.toFixed(1) + ' %');
    $('bar-done').style.width = (total > 0 ? (100 * p.done) / total : 0) + '%';
    $('bar-leased').style.width = (total > 0 ? (100 * p.leased) / total : 0) + '%';
  }

  const SVG = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function renderLoss() {
    const chart = $('loss-chart');
    if (chart.dataset.version === String(st.lossVersion) && chart.childNodes.length > 0) return;
    const pts = st.losses.slice().sort((a, b) => a.step - b.step);
    chart.dataset.version = String(st.lossVersion);
    chart.dataset.points = String(pts.length);
    // Drawn in CSS pixels (the viewBox is the element's size), so text is never stretched.
    const W = Math.max(320, Math.round(chart.clientWidth || 640)), H = 220, L = 56, R = 12, T = 12, B = 28;
    chart.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    const parts = [svg('rect', { x: L, y: T, width: W - L - R, height: H - T - B, class: 'plot' })];
    if (pts.length === 0) {
      parts.push(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty' }, 'no loss reported yet'));
      chart.replaceChildren(...parts);
      return;
    }
    let x0 = pts[0].step, x1 = pts[pts.length - 1].step;
    let y0 = Infinity, y1 = -Infinity;
    for (const q of pts) { y0 = Math.min(y0, q.loss); y1 = Math.max(y1, q.loss); }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const pad = (y1 - y0) * 0.05;
    y0 -= pad; y1 += pad;
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const v = y0 + ((y1 - y0) * i) / 4;
      const y = sy(v);
      parts.push(svg('line', { x1: L, x2: W - R, y1: y, y2: y, class: 'grid' }));
      parts.push(svg('text', { x: L - 6, y: y + 4, 'text-anchor': 'end', class: 'tick' }, v.toFixed(3)));
    }
    parts.push(svg('text', { x: L, y: H - 8, 'text-anchor': 'start', class: 'tick' }, 'step ' + pts[0].step));
    parts.push(svg('text', { x: W - R, y: H - 8, 'text-anchor': 'end', class: 'tick' }, 'step ' + pts[pts.length - 1].step));
    const d = pts.map((q, i) => (i ? 'L' : 'M') + sx(q.step).toFixed(1) + ' ' + sy(q.loss).toFixed(1)).join(' ');
    parts.push(svg('path', { d: d, class: 'line' }));
    const lastPt = pts[pts.length - 1];
    parts.push(svg('circle', { cx: sx(lastPt.step), cy: sy(lastPt.loss), r: 3, class: 'dot' }));
    chart.replaceChildren(...parts);
  }

  function peerCell(peer) {
    const td = el('td', shortPeer(peer), 'peer');
    td.title = peer;
    return td;
  }

  // How a node reaches its peers (its last heartbeat's reach): counts by route, and the cause
  // when it reaches none. Values come from the API: text only, never markup.
  function reachCell(r) {
    const td = el('td', '', 'reach');
    if (!r || typeof r !== 'object') { td.textContent = '–'; return td; }
    const parts = [fmtInt(r.direct) + ' direct'];
    if (r.hole_punched) parts.push(fmtInt(r.hole_punched) + ' punched');
    parts.push(fmtInt(r.relayed) + ' relayed');
    td.appendChild(el('span', parts.join(' · '), 'routes'));
    if (r.diagnosis) {
      td.appendChild(document.createTextNode(' '));
      const b = el('span', 'reaches nobody: ' + String(r.diagnosis).replace(/_/g, ' '), 'badge diagnosis');
      b.dataset.cause = r.diagnosis;
      td.appendChild(b);
    }
    td.dataset.direct = r.direct;
    td.dataset.holePunched = r.hole_punched;
    td.dataset.relayed = r.relayed;
    return td;
  }

  function renderPeers() {
    const tbody = $('peers').tBodies[0];
    const now = nowServerS();
    const nodes = Array.from(st.nodes.values()).sort((a, b) =>
      (STATE_ORDER[a.state] ?? 9) - (STATE_ORDER[b.state] ?? 9) || (b.last_seen || 0) - (a.last_seen || 0));
    const rows = [];
    for (const n of nodes.slice(0, MAX_PEER_ROWS)) {
      const tr = el('tr');
      tr.dataset.peer = n.peer_id;
      tr.dataset.state = n.state;
      tr.appendChild(peerCell(n.peer_id));
      const s = el('td');
      s.appendChild(el('span', n.state, 'badge state-' + n.state));
      tr.appendChild(s);
      tr.appendChild(el('td', fmtInt(n.last_step), 'num step'));
      const seen = n.last_seen ? fmtDuration(Math.max(0, now - n.last_seen)) + ' ago' : '–';
      tr.appendChild(el('td', seen, 'num seen'));
      tr.appendChild(reachCell(n.reach));
      tr.appendChild(el('td', n.agent || '', 'agent'));
      rows.push(tr);
    }
    if (nodes.length > MAX_PEER_ROWS) {
      const tr = el('tr');
      const td = el('td', '+ ' + (nodes.length - MAX_PEER_ROWS) + ' more');
      td.colSpan = 6;
      tr.appendChild(td);
      rows.push(tr);
    }
    if (rows.length === 0) {
      const tr = el('tr');
      const td = el('td', 'no peer has joined yet', 'empty');
      td.colSpan = 6;
      tr.appendChild(td);
      rows.push(tr);
    }
    tbody.replaceChildren(...rows);
  }

  function renderLeaderboard() {
    const tbody = $('leaderboard').tBodies[0];
    const rows = st.leaderboard.map((n) => {
      const tr = el('tr');
      tr.dataset.peer = n.peer_id;
      tr.appendChild(el('td', n.rank, 'num'));
      tr.appendChild(peerCell(n.peer_id));
      tr.appendChild(el('td', fmtInt(n.tokens), 'num tokens'));
      tr.appendChild(el('td', fmtInt(n.shards), 'num shards'));
      tr.appendChild(el('td', fmtInt(n.steps_acknowledged), 'num'));
      tr.appendChild(el('td', fmtDuration(n.uptime_s), 'num'));
      tr.appendChild(el('td', Number(n.tokens_per_s).toFixed(1), 'num'));
      return tr;
    });
    if (rows.length === 0) {
      const tr = el('tr');
      const td = el('td', 'no contribution yet', 'empty');
      td.colSpan = 7;
      tr.appendChild(td);
      rows.push(tr);
    }
    tbody.replaceChildren(...rows);
  }

  function renderEvents() {
    const ol = $('events');
    const items = [];
    for (let i = st.events.length - 1; i >= 0; i--) {
      const e = st.events[i];
      const li = el('li');
      li.dataset.type = e.type;
      li.appendChild(el('time', new Date(e.time * 1000).toLocaleTimeString()));
      li.appendChild(el('span', e.type, 'etype'));
      li.appendChild(el('span', e.text, 'etext'));
      items.push(li);
    }
    ol.replaceChildren(...items);
  }

  // ------------------------------------------------------------------ start

  async function start() {
    let id = null;
    while (id === null) {
      try {
        id = await chooseRun();
        if (id === null) showMessage('this coordinator has no run yet; waiting…');
      } catch (e) {
        showMessage('cannot reach the coordinator: ' + e.message);
      }
      if (id === null) await new Promise((ok) => setTimeout(ok, REFRESH_EVERY_MS));
    }
    st.runId = id;
    document.title = 'distro-node · ' + id;
    await refresh();
    connect();
    setInterval(refresh, REFRESH_EVERY_MS);
    setInterval(renderPeers, 1000); // "last seen" ages
    window.addEventListener('resize', () => { $('loss-chart').dataset.version = ''; renderSoon(); });
  }

  document.addEventListener('DOMContentLoaded', start);
})();
