// The Eddy web UI: a thin client of the /v1 REST API. No framework and no build step, so the
// server can embed these files as they are and nothing is fetched from elsewhere.
'use strict';

(() => {
  const TOKEN_KEY = 'eddy.token';
  const POLL_MS = 1000;
  const ARTIFACTS_POLL_MS = 2000; // compiles in the background show their progress
  const CANCEL_CONFIRM_MS = 4000;
  const CHECKPOINT_ROWS = 25;
  // State entries one lookup shows.
  const STATE_ROWS = 50;
  const CHART_BARS = 60;
  // Watermarks at or after this are wall-clock times worth showing as dates; smaller ones are
  // event times of a generator that started near 0.
  const YEAR_2000_MS = 946684800000;
  const TERMINAL = new Set(['finished', 'failed', 'canceled', 'stopped']);

  const byTestId = (id, root = document) => root.querySelector(`[data-testid="${id}"]`);

  /** Builds an element. Text goes in through textContent only: job names and failure
   *  messages come from users, so nothing is ever parsed as HTML. */
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (key === 'testid') node.dataset.testid = value;
      else if (key === 'text') node.textContent = value;
      else if (key === 'class') node.className = value;
      else if (key.startsWith('data-')) node.setAttribute(key, value);
      else node[key] = value;
    }
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  // ---- Formatting -------------------------------------------------------------------------

  const plain = new Intl.NumberFormat('en', { maximumFractionDigits: 0 });
  const compact = new Intl.NumberFormat('en', { notation: 'compact', maximumFractionDigits: 1 });
  const fmtCount = (n) => (n >= 100000 ? compact.format(n) : plain.format(n));
  const fmtRate = (n) => `${fmtCount(n)}/s`;
  const fmtMs = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`);

  function fmtBytes(bytes) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = bytes;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
  }

  function fmtUptime(ms) {
    const s = Math.floor(ms / 1000);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    if (h > 0) return `${h} h ${m} min`;
    if (m > 0) return `${m} min ${s % 60} s`;
    return `${s} s`;
  }

  function fmtAgo(ms) {
    const s = Math.round((Date.now() - ms) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return `${s} s ago`;
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    return new Date(ms).toLocaleString();
  }

  function fmtWatermark(wm) {
    if (wm === null || wm === undefined) return '—';
    if (wm >= YEAR_2000_MS) return `${new Date(wm).toISOString().slice(0, 19).replace('T', ' ')}Z`;
    return `${(wm / 1000).toFixed(1)} s`;
  }

  const shortDigest = (digest) => {
    const [algo, hex = ''] = digest.split(':');
    return hex.length > 12 ? `${algo}:${hex.slice(0, 12)}…` : digest;
  };

  // ---- The API ----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail, field) {
      super(field ? `${detail} (${field})` : detail);
      this.status = status;
      this.field = field;
    }
  }

  /** The API's problem details when it sent them; a proxy's or a crash's page is reported by
   *  its status alone. */
  async function problemOf(response) {
    let detail = `${response.status} ${response.statusText || 'error'}`.trim();
    let field;
    try {
      const body = await response.json();
      if (body && typeof body.detail === 'string') {
        detail = body.detail;
        field = typeof body.field === 'string' ? body.field : undefined;
      }
    } catch {
      // Not JSON: the status line says enough.
    }
    return new ApiError(response.status, detail, field);
  }

  async function api(path, { method = 'GET', token = sessionStorage.getItem(TOKEN_KEY), json } = {}) {
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: 'no-store' };
    if (json !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(json);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, `cannot reach the server (${e.message})`);
    }
    if (!response.ok) throw await problemOf(response);
    const type = response.headers.get('content-type') || '';
    return type.includes('json') ? response.json() : null;
  }

  // ---- Banner, session --------------------------------------------------------------------

  const banner = byTestId('error');

  function showBanner(message) {
    banner.textContent = message;
    banner.hidden = false;
  }

  function clearBanner() {
    banner.hidden = true;
    banner.textContent = '';
  }

  let admin = false;

  function showSession(who) {
    const name = who.kind === 'admin' ? 'admin' : who.name || who.tenant;
    byTestId('whoami').textContent = `${name} · ${who.kind}`;
    byTestId('session').hidden = false;
    byTestId('nav').hidden = false;
    // The machines are the operator's business: only the admin sees them.
    admin = who.kind === 'admin';
    byTestId('nav-workers').hidden = !admin;
  }

  /** Forgets the token and shows the sign-in form, with why when the API said why. */
  function signOut(reason) {
    sessionStorage.removeItem(TOKEN_KEY);
    byTestId('session').hidden = true;
    byTestId('nav').hidden = true;
    admin = false;
    stopView();
    clearBanner();
    showSignIn(reason);
  }

  /** A 401 means the token is no good any more: back to the sign-in form. */
  function reportError(error) {
    if (error instanceof ApiError && error.status === 401) signOut(error.message);
    else showBanner(error.message);
  }

  // ---- Views ------------------------------------------------------------------------------

  let current = null;

  function stopView() {
    if (current) current.stop();
    current = null;
  }

  function showOnly(name) {
    byTestId('signin').hidden = name !== 'signin';
    for (const section of document.querySelectorAll('[data-view]')) {
      section.hidden = section.dataset.view !== name;
    }
    for (const link of document.querySelectorAll('[data-nav]')) {
      link.classList.toggle('active', link.dataset.nav === name || (name === 'job' && link.dataset.nav === 'jobs'));
    }
  }

  /** Calls `load` and then `render` every `ms` until stopped; never two requests at once, so a
   *  slow server is not piled on. */
  function poll(load, render, ms) {
    let stopped = false;
    let timer = 0;
    const tick = async () => {
      if (!document.hidden) {
        try {
          const data = await load();
          if (stopped) return;
          clearBanner();
          render(data);
        } catch (error) {
          if (stopped) return;
          reportError(error);
          if (!sessionStorage.getItem(TOKEN_KEY)) return;
        }
      }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    tick();
    return {
      stop() {
        stopped = true;
        clearTimeout(timer);
      },
    };
  }

  function route() {
    stopView();
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      showSignIn();
      return;
    }
    // The admin runs no jobs of its own: its home is the workers page.
    const hash = location.hash || (admin ? '#/workers' : '#/jobs');
    const job = hash.match(/^#\/jobs\/([^/]+)$/);
    if (job) current = jobView(decodeURIComponent(job[1]));
    else if (hash === '#/artifacts') current = artifactsView();
    else if (hash === '#/workers' && admin) current = workersView();
    else current = jobsView();
  }

  // ---- Sign in ----------------------------------------------------------------------------

  function showSignIn(reason) {
    showOnly('signin');
    const error = byTestId('signin-error');
    error.textContent = reason || '';
    error.hidden = !reason;
    byTestId('token-input').focus();
  }

  async function signIn(event) {
    event.preventDefault();
    const input = byTestId('token-input');
    const button = byTestId('signin-button');
    const error = byTestId('signin-error');
    const token = input.value.trim();
    if (!token) return;
    button.disabled = true;
    error.hidden = true;
    try {
      const who = await api('/v1/whoami', { token });
      sessionStorage.setItem(TOKEN_KEY, token);
      input.value = '';
      showSession(who);
      route();
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  }

  // ---- Jobs list --------------------------------------------------------------------------

  function statusBadge(status, testid) {
    return el('span', { class: `badge ${status}`, testid, text: status });
  }

  function jobRow(job) {
    const href = `#/jobs/${encodeURIComponent(job.id)}`;
    const row = el(
      'tr',
      { class: 'clickable', testid: 'job-row', 'data-job-id': job.id },
      el('td', {}, el('a', { href, testid: 'job-link', text: job.name })),
      el('td', {}, statusBadge(job.status, 'job-row-status')),
      el('td', { class: 'mono', text: job.id }),
      el('td', { title: new Date(job.created_ms).toLocaleString(), text: fmtAgo(job.created_ms) }),
    );
    row.addEventListener('click', (event) => {
      if (event.target.closest('a')) return;
      location.hash = href;
    });
    return row;
  }

  function jobsView() {
    showOnly('jobs');
    const table = byTestId('jobs-table');
    return poll(
      () => api('/v1/jobs'),
      (jobs) => {
        table.tBodies[0].replaceChildren(...jobs.map(jobRow));
        table.hidden = jobs.length === 0;
        byTestId('jobs-empty').hidden = jobs.length > 0;
      },
      POLL_MS,
    );
  }

  // ---- One job ----------------------------------------------------------------------------

  function fact(label, value, testid) {
    return el('div', {}, el('dt', { text: label }), el('dd', { testid, text: value }));
  }

  function renderFacts(job) {
    const live = job.live;
    const facts = [
      fact('Id', job.id, 'job-id'),
      fact('Submitted', new Date(job.created_ms).toLocaleString()),
      fact('Slots', String(job.slots)),
      fact('Restarts', String(job.restarts), 'job-restarts'),
      fact('Attempts', String(job.attempts), 'job-attempts'),
    ];
    if (live) {
      facts.push(
        fact('Up', fmtUptime(live.elapsed_ms), 'job-uptime'),
        fact('Read', plain.format(live.source_records), 'job-source-records'),
        fact('Written', plain.format(live.sink_records), 'job-sink-records'),
      );
      if (live.restored_from !== null && live.restored_from !== undefined) {
        facts.push(fact('Restored from', `checkpoint ${live.restored_from}`, 'job-restored-from'));
      }
    }
    byTestId('job-facts').replaceChildren(...facts);
  }

  /** A chain's label names its steps joined by ` -> `, e.g. `source:g -> split`. */
  function stepChip(step) {
    const kind = ['source', 'sink', 'window'].find((k) => step.startsWith(`${k}:`));
    return el('span', { class: kind ? `step ${kind}` : 'step', text: step });
  }

  function metric(label, testid) {
    return [el('dt', { text: label }), el('dd', { testid, text: '—' })];
  }

  function taskBox(task, index) {
    return el(
      'div',
      { class: 'task', testid: 'task', 'data-task-index': String(index), title: task.label },
      el(
        'div',
        { class: 'task-head' },
        el('span', { class: 'task-title', testid: 'task-title', text: `Task ${index + 1}` }),
        el('span', { class: 'task-par', testid: 'task-parallelism', text: `×${task.parallelism}` }),
      ),
      el('div', { class: 'steps', testid: 'task-label' }, ...task.label.split(' -> ').map(stepChip)),
      el(
        'dl',
        { class: 'metrics' },
        ...metric('In', 'task-in-rate'),
        ...metric('Out', 'task-out-rate'),
        ...metric('Records in', 'task-records-in'),
        ...metric('Records out', 'task-records-out'),
        ...metric('Watermark', 'task-watermark'),
        ...metric('Backpressure', 'task-backpressure'),
        ...metric('Late', 'task-late'),
      ),
      el('div', { class: 'bp', title: 'Backpressure' }, el('div', { class: 'bp-fill' })),
    );
  }

  /** Sets a metric's text and keeps its raw number in data-value, for tools and tests. */
  function setMetric(box, testid, value, text) {
    const node = byTestId(testid, box);
    node.dataset.value = value === null || value === undefined ? '' : String(value);
    node.textContent = text;
  }

  function updateTaskBox(box, task) {
    setMetric(box, 'task-in-rate', task.records_in_per_sec, fmtRate(task.records_in_per_sec));
    setMetric(box, 'task-out-rate', task.records_out_per_sec, fmtRate(task.records_out_per_sec));
    setMetric(box, 'task-records-in', task.records_in, plain.format(task.records_in));
    setMetric(box, 'task-records-out', task.records_out, plain.format(task.records_out));
    setMetric(box, 'task-watermark', task.watermark, fmtWatermark(task.watermark));
    const pct = Math.round(task.backpressure * 100);
    setMetric(box, 'task-backpressure', task.backpressure, `${pct}%`);
    setMetric(box, 'task-late', task.late_records, plain.format(task.late_records));
    const fill = box.querySelector('.bp-fill');
    fill.style.width = `${pct}%`;
    fill.classList.toggle('mid', task.backpressure > 0.25 && task.backpressure <= 0.6);
    fill.classList.toggle('high', task.backpressure > 0.6);
  }

  /** The arrow into `task`, named by how records reach it (`hash(/user)`, `forward`). */
  function exchangeArrow(task) {
    const inputs = task.inputs || [];
    const kinds = [...new Set(inputs.map((i) => i.split(' from ')[0]))];
    return el(
      'div',
      { class: 'exchange', testid: 'exchange', title: inputs.join('\n') || 'exchange' },
      el('span', { class: 'exchange-type', testid: 'exchange-type', text: kinds.join(', ') }),
    );
  }

  function subtaskRow(task, taskIndex, s) {
    const cell = (testid, value, text, cls = 'num') => el('td', { class: cls, testid, 'data-value': String(value ?? ''), text });
    return el(
      'tr',
      { testid: 'subtask-row', 'data-task-index': String(taskIndex), 'data-subtask-index': String(s.index) },
      el('td', { testid: 'subtask-task', title: task.label, text: `Task ${taskIndex + 1}` }),
      cell('subtask-index', s.index, String(s.index)),
      el('td', { testid: 'subtask-worker', text: s.worker || 'this server' }),
      cell('subtask-records-in', s.records_in, plain.format(s.records_in)),
      cell('subtask-in-rate', s.records_in_per_sec, fmtRate(s.records_in_per_sec)),
      cell('subtask-backpressure', s.backpressure, `${Math.round(s.backpressure * 100)}%`),
      cell('subtask-watermark', s.watermark, fmtWatermark(s.watermark), ''),
      cell('subtask-late', s.late_records, plain.format(s.late_records)),
      cell('subtask-cpu', s.cpu_seconds, `${s.cpu_seconds.toFixed(2)} s`),
      cell('subtask-state', s.state_bytes, s.state_bytes === null ? '—' : fmtBytes(s.state_bytes)),
    );
  }

  /** Every subtask of every task, one row each: where a skewed key or a slow worker shows. */
  function renderSubtasks(tasks) {
    const table = byTestId('subtasks');
    const rows = tasks.flatMap((t, i) => (t.subtasks || []).map((s) => subtaskRow(t, i, s)));
    table.tBodies[0].replaceChildren(...rows);
    table.hidden = rows.length === 0;
  }

  /** Rebuilds the boxes only when the plan changed, so a refresh does not flicker. */
  function renderGraph(tasks) {
    const graph = byTestId('job-graph');
    byTestId('graph-idle').hidden = tasks.length > 0;
    const shape = tasks.map((t) => `${t.label}×${t.parallelism}`).join('|');
    if (graph.dataset.shape !== shape) {
      const nodes = [];
      tasks.forEach((task, i) => {
        if (i > 0) nodes.push(exchangeArrow(task));
        nodes.push(taskBox(task, i));
      });
      graph.replaceChildren(...nodes);
      graph.dataset.shape = shape;
    }
    const boxes = graph.querySelectorAll('[data-testid="task"]');
    tasks.forEach((task, i) => updateTaskBox(boxes[i], task));
  }

  function checkpointRow(c) {
    return el(
      'tr',
      { testid: 'checkpoint-row', 'data-checkpoint-id': String(c.id) },
      el('td', { class: 'mono', text: String(c.id) }),
      el('td', { class: 'num', text: fmtMs(c.duration_ms) }),
      el('td', { class: 'num', text: fmtMs(c.alignment_ms) }),
      el('td', { class: 'num', text: fmtBytes(c.full_bytes) }),
      el('td', { class: 'num', text: fmtBytes(c.incremental_bytes) }),
      el('td', { class: 'num', testid: 'checkpoint-in-flight', 'data-value': String(c.in_flight_bytes), text: c.unaligned ? fmtBytes(c.in_flight_bytes) : '—' }),
    );
  }

  function renderChart(checkpoints) {
    const svg = byTestId('checkpoint-chart');
    const ns = 'http://www.w3.org/2000/svg';
    const recent = checkpoints.slice(-CHART_BARS);
    const longest = Math.max(...recent.map((c) => c.duration_ms), 1e-3);
    const slot = 300 / CHART_BARS;
    const bars = recent.map((c, i) => {
      const height = Math.max(1, (c.duration_ms / longest) * 56);
      const bar = document.createElementNS(ns, 'rect');
      bar.setAttribute('x', String((CHART_BARS - recent.length + i) * slot + 0.5));
      bar.setAttribute('y', String(58 - height));
      bar.setAttribute('width', String(slot - 1));
      bar.setAttribute('height', String(height));
      const title = document.createElementNS(ns, 'title');
      title.textContent = `checkpoint ${c.id}: ${fmtMs(c.duration_ms)}, ${fmtBytes(c.incremental_bytes)} written`;
      bar.append(title);
      return bar;
    });
    svg.replaceChildren(...bars);
    // An SVG element has no `hidden` property, only the attribute.
    svg.toggleAttribute('hidden', recent.length === 0);
  }

  /** Minimum, average and maximum of `values` through `fmt`. */
  function spread(values, fmt) {
    const sum = values.reduce((a, b) => a + b, 0);
    return `${fmt(Math.min(...values))} / ${fmt(sum / values.length)} / ${fmt(Math.max(...values))}`;
  }

  /** Duration, size and alignment over the checkpoints shown, as Flink's summary has them. */
  function renderCheckpointStats(checkpoints) {
    const stats = byTestId('checkpoint-stats');
    stats.hidden = checkpoints.length === 0;
    if (!checkpoints.length) return;
    const n = checkpoints.length;
    stats.dataset.count = String(n);
    stats.textContent =
      `${n} checkpoint${n === 1 ? '' : 's'} · duration min / avg / max ${spread(checkpoints.map((c) => c.duration_ms), fmtMs)}` +
      ` · size ${spread(checkpoints.map((c) => c.full_bytes), fmtBytes)}` +
      ` · written ${spread(checkpoints.map((c) => c.incremental_bytes), fmtBytes)}` +
      ` · longest alignment ${fmtMs(Math.max(...checkpoints.map((c) => c.alignment_ms)))}` +
      ` · in flight ${fmtBytes(checkpoints.reduce((sum, c) => sum + c.in_flight_bytes, 0))}` +
      ` (${checkpoints.filter((c) => c.unaligned).length} unaligned)`;
  }

  function renderCheckpoints(checkpoints) {
    const table = byTestId('checkpoints');
    const newest = checkpoints.slice(-CHECKPOINT_ROWS).reverse();
    table.tBodies[0].replaceChildren(...newest.map(checkpointRow));
    table.hidden = checkpoints.length === 0;
    byTestId('checkpoints-empty').hidden = checkpoints.length > 0;
    renderChart(checkpoints);
    renderCheckpointStats(checkpoints);
  }

  /** One series of the job's last minutes as a line scaled to its largest value, with the
   *  newest value beside its caption. `value` maps a point to a number or null (no value). */
  function renderTimeline(testid, points, value, fmt) {
    const svg = byTestId(testid);
    const values = points.map(value);
    const shown = values.filter((v) => v !== null && v !== undefined);
    const top = Math.max(...shown, 1e-9);
    const step = 300 / Math.max(points.length - 1, 1);
    const coords = values
      .map((v, i) => (v === null || v === undefined ? null : `${(i * step).toFixed(1)},${(58 - (v / top) * 56).toFixed(1)}`))
      .filter((c) => c !== null);
    const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
    line.setAttribute('points', coords.join(' '));
    svg.replaceChildren(line);
    svg.dataset.points = String(coords.length);
    const newest = values[values.length - 1];
    const now = byTestId(`${testid}-now`);
    if (newest === null || newest === undefined) {
      now.textContent = '—';
      delete now.dataset.value;
    } else {
      now.textContent = fmt(newest);
      now.dataset.value = String(newest);
    }
  }

  /** Throughput, backpressure and watermark lag over the last minutes, a point a second. */
  function renderTimelines(points) {
    byTestId('timelines').hidden = points.length === 0;
    byTestId('timelines-empty').hidden = points.length > 0;
    if (!points.length) return;
    renderTimeline('timeline-throughput', points, (p) => p.source_records_per_sec, fmtRate);
    renderTimeline('timeline-backpressure', points, (p) => p.backpressure, (v) => `${Math.round(v * 100)}%`);
    // A lag behind a generator's event time (which starts near 0) says nothing: not drawn.
    const lag = (p) =>
      p.watermark_lag_ms === null || p.at_ms - p.watermark_lag_ms < YEAR_2000_MS ? null : p.watermark_lag_ms;
    renderTimeline('timeline-lag', points, lag, fmtMs);
  }

  /** A failure: what the guest said, then the host's cause chain outermost first, with the
   *  whole message folded away; a failure that is not the engine's has its message only. */
  function failureItem(f) {
    const causes = f.causes || [];
    const when = el('time', { dateTime: new Date(f.at_ms).toISOString(), text: new Date(f.at_ms).toLocaleString() });
    if (!causes.length) return el('li', { testid: 'failure' }, when, el('div', { class: 'message', testid: 'failure-message', text: f.message }));
    return el(
      'li',
      { testid: 'failure' },
      when,
      f.guest_message ? el('div', { class: 'guest', testid: 'failure-guest', text: `The operator said: ${f.guest_message}` }) : null,
      el('ol', { class: 'causes', testid: 'failure-causes' }, ...causes.map((c) => el('li', { class: 'message', testid: 'failure-cause', text: c }))),
      el('details', {}, el('summary', { text: 'Whole message' }), el('div', { class: 'message', testid: 'failure-message', text: f.message })),
    );
  }

  function renderFailures(failures) {
    byTestId('failures').replaceChildren(...[...failures].reverse().map(failureItem));
    byTestId('failures-empty').hidden = failures.length > 0;
  }

  // ---- State lookup -----------------------------------------------------------------------

  /** The steps of the live chains (`source:g -> count -> sink:files`), for the step field. */
  function offerSteps(tasks) {
    const steps = tasks
      .flatMap((t) => t.label.split(' -> '))
      .filter((s) => !s.startsWith('source:') && !s.startsWith('sink:'));
    const list = byTestId('state-steps');
    if (list.dataset.steps === steps.join('\n')) return;
    list.dataset.steps = steps.join('\n');
    list.replaceChildren(...steps.map((s) => el('option', { value: s })));
    for (const input of [byTestId('state-step'), byTestId('replay-step'), byTestId('upgrade-step')]) {
      if (!input.value && steps.length) input.value = steps[steps.length - 1];
    }
  }

  function stateRow(e) {
    const window = e.window ? `[${e.window.start}, ${e.window.end})${e.fired ? ' fired' : ''}` : '';
    const name = e.map_key === undefined ? e.state : `${e.state} [${JSON.stringify(e.map_key)}]`;
    return el(
      'tr',
      { testid: 'state-row' },
      el('td', { class: 'mono', testid: 'state-row-key', text: JSON.stringify(e.key) }),
      el('td', { testid: 'state-row-state', text: name }),
      el('td', { class: 'mono', testid: 'state-row-window', text: window }),
      el('td', { class: 'mono', testid: 'state-row-value', text: JSON.stringify(e.value) }),
    );
  }

  /** Looks a step's state up (one key, or the first entries) in the newest checkpoint. */
  function armStateLookup(id) {
    const form = byTestId('state-form');
    const table = byTestId('state-table');
    const error = byTestId('state-error');
    const summary = byTestId('state-summary');
    form.onsubmit = async (event) => {
      event.preventDefault();
      const query = new URLSearchParams({ step: byTestId('state-step').value.trim(), limit: String(STATE_ROWS) });
      const key = byTestId('state-key').value.trim();
      if (key) query.set('key', key);
      error.hidden = true;
      try {
        const read = await api(`/v1/jobs/${encodeURIComponent(id)}/state?${query}`);
        table.tBodies[0].replaceChildren(...read.entries.map(stateRow));
        table.hidden = read.entries.length === 0;
        const more = read.truncated ? ` (the first ${read.entries.length}: give a key to narrow it)` : '';
        const n = read.entries.length;
        const found = n ? `${n} ${n === 1 ? 'entry' : 'entries'}${more}` : 'nothing for that key';
        summary.textContent = `Checkpoint ${read.checkpoint}, step ${read.step}: ${found}.`;
        summary.dataset.checkpoint = String(read.checkpoint);
      } catch (e) {
        if (e.status === 401) return reportError(e);
        table.hidden = true;
        summary.textContent = '';
        delete summary.dataset.checkpoint;
        error.textContent = e.message;
        error.hidden = false;
      }
    };
  }

  /** What one replay event says, beyond its kind and key. */
  function replayDetail(e) {
    const json = (v) => JSON.stringify(v);
    switch (e.event) {
      case 'input':
        return `#${e.n} ${json(e.value)}` + (e.channel === undefined ? '' : ` (channel ${e.channel})`);
      case 'output':
        return (e.output === 'main' ? '' : `[${e.output}] `) + json(e.value);
      case 'state_read':
        return e.found ? `${e.state} = ${json(e.value)}` : `${e.state} (absent)`;
      case 'state_write':
        return `${e.state} = ${json(e.value)}`;
      case 'state_delete':
        return e.state;
      case 'timer':
        return `${e.change} ${e.domain} at ${e.timestamp}`;
      case 'watermark':
        return String(e.watermark);
      case 'processing_time':
        return String(e.now_ms);
      case 'log':
        return `${e.level}: ${e.message}`;
      case 'barrier':
        return `checkpoint ${e.checkpoint}`;
      case 'segment':
        return e.after_checkpoint ? `after checkpoint ${e.after_checkpoint}` : "from the job's start";
      default:
        return '';
    }
  }

  function replayRow(e) {
    return el(
      'tr',
      { testid: 'replay-row', 'data-event': e.event },
      el('td', { testid: 'replay-row-what', text: e.event.replace('_', ' ') }),
      el('td', { class: 'mono', testid: 'replay-row-key', text: e.key === undefined ? '' : JSON.stringify(e.key) }),
      el('td', { class: 'mono', testid: 'replay-row-detail', text: replayDetail(e) }),
    );
  }

  /** Replays one subtask of a journaled step from its journal, in the server. */
  function armReplay(id) {
    const form = byTestId('replay-form');
    const table = byTestId('replay-table');
    const error = byTestId('replay-error');
    const summary = byTestId('replay-summary');
    form.onsubmit = async (event) => {
      event.preventDefault();
      const subtask = byTestId('replay-subtask').value.trim();
      const query = new URLSearchParams({ step: byTestId('replay-step').value.trim(), subtask, limit: '300' });
      const key = byTestId('replay-key').value.trim();
      if (key) query.set('key', key);
      error.hidden = true;
      summary.textContent = `Replaying subtask ${subtask}…`;
      try {
        const r = await api(`/v1/jobs/${encodeURIComponent(id)}/replay?${query}`);
        table.tBodies[0].replaceChildren(...r.events.map(replayRow));
        table.hidden = r.events.length === 0;
        if (r.failure) {
          summary.textContent = `The operator failed as it ran: ${r.failure}`;
          return;
        }
        const s = r.summary;
        const from = s.from_checkpoint ? `checkpoint ${s.from_checkpoint}` : "the job's start";
        const elsewhere =
          s.key_subtask !== undefined && s.key_subtask !== s.subtask
            ? ` The key is in subtask ${s.key_subtask}'s key groups.`
            : '';
        summary.textContent =
          `Step ${s.step}, subtask ${s.subtask}, from ${from}: ${s.records} input records, ` +
          `${s.outputs} outputs (${s.end.end.replace('_', ' ')}).${elsewhere}`;
        summary.dataset.from = String(s.from_checkpoint);
      } catch (e) {
        if (e.status === 401) return reportError(e);
        table.hidden = true;
        summary.textContent = '';
        delete summary.dataset.from;
        error.textContent = e.message;
        error.hidden = false;
      }
    };
  }

  /** Swaps a step's code at the next checkpoint (`mode: live`); the answer names that checkpoint. */
  function armUpgrade(id) {
    const form = byTestId('upgrade-form');
    const error = byTestId('upgrade-error');
    const summary = byTestId('upgrade-summary');
    form.onsubmit = async (event) => {
      event.preventDefault();
      const step = byTestId('upgrade-step').value.trim();
      const wasm = byTestId('upgrade-wasm').value.trim();
      error.hidden = true;
      summary.textContent = `Swapping step ${step} to ${wasm} at the next checkpoint…`;
      try {
        const done = await api(`/v1/jobs/${encodeURIComponent(id)}/upgrade`, {
          method: 'POST',
          json: { step, wasm, mode: 'live' },
        });
        summary.textContent =
          `Step ${done.step} runs ${done.artifact} from checkpoint ${done.checkpoint} on ` +
          `(subtasks swapped: ${done.subtasks}, the longest in ${done.longest_swap_ms.toFixed(2)} ms).`;
        summary.dataset.checkpoint = String(done.checkpoint);
      } catch (e) {
        if (e.status === 401) return reportError(e);
        summary.textContent = '';
        delete summary.dataset.checkpoint;
        error.textContent = e.message;
        error.hidden = false;
      }
    };
  }

  /** Cancelling cannot be undone, so the first click only arms the button for a moment. */
  function armCancel(id) {
    const button = byTestId('cancel-job');
    let disarm = 0;
    const reset = () => {
      button.classList.remove('confirming');
      button.textContent = 'Cancel job';
    };
    button.onclick = async () => {
      if (!button.classList.contains('confirming')) {
        button.classList.add('confirming');
        button.textContent = 'Click again to cancel';
        disarm = setTimeout(reset, CANCEL_CONFIRM_MS);
        return;
      }
      clearTimeout(disarm);
      button.disabled = true;
      button.textContent = 'Canceling…';
      try {
        await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: 'POST' });
      } catch (error) {
        reportError(error);
        reset();
        button.disabled = false;
      }
    };
    reset();
    return () => clearTimeout(disarm);
  }

  function renderJob(job) {
    byTestId('job-name').textContent = job.name;
    const status = byTestId('job-status');
    status.textContent = job.status;
    status.className = `badge ${job.status}`;
    const cancel = byTestId('cancel-job');
    if (TERMINAL.has(job.status)) {
      cancel.disabled = true;
      cancel.textContent = job.status === 'canceled' ? 'Canceled' : 'Cancel job';
    }
    renderFacts(job);
    renderGraph(job.live ? job.live.tasks : []);
    renderSubtasks(job.live ? job.live.tasks : []);
    offerSteps(job.live ? job.live.tasks : []);
    renderTimelines(job.live ? job.live.timeline : []);
    renderCheckpoints(job.live ? job.live.checkpoints : []);
    renderFailures(job.failures);
  }

  function clearJob() {
    byTestId('job-name').textContent = '';
    byTestId('job-status').textContent = '';
    byTestId('job-facts').replaceChildren();
    const graph = byTestId('job-graph');
    graph.replaceChildren();
    delete graph.dataset.shape;
    renderTimelines([]);
    renderCheckpoints([]);
    renderFailures([]);
    byTestId('cancel-job').disabled = false;
    byTestId('state-step').value = '';
    byTestId('state-key').value = '';
    byTestId('state-table').hidden = true;
    byTestId('state-error').hidden = true;
    byTestId('state-summary').textContent = 'Keys and values from the newest completed checkpoint.';
    byTestId('upgrade-step').value = '';
    byTestId('upgrade-wasm').value = '';
    byTestId('upgrade-error').hidden = true;
    byTestId('upgrade-summary').textContent =
      "Swaps the step's code at the next checkpoint: its state and timers stay, nothing restarts.";
  }

  function jobView(id) {
    clearJob();
    showOnly('job');
    const disarm = armCancel(id);
    armStateLookup(id);
    armReplay(id);
    armUpgrade(id);
    const polling = poll(() => api(`/v1/jobs/${encodeURIComponent(id)}`), renderJob, POLL_MS);
    return {
      stop() {
        polling.stop();
        disarm();
      },
    };
  }

  // ---- Artifacts --------------------------------------------------------------------------

  function artifactRow(a) {
    return el(
      'tr',
      { testid: 'artifact-row', 'data-digest': a.digest },
      el('td', { class: 'mono', testid: 'artifact-digest', title: a.digest, text: shortDigest(a.digest) }),
      el('td', { testid: 'artifact-names', text: a.names.length ? a.names.join(', ') : '—' }),
      el('td', { testid: 'artifact-world', text: a.world }),
      el('td', { class: 'num', testid: 'artifact-size', text: fmtBytes(a.size) }),
      el('td', { title: new Date(a.created_ms).toLocaleString(), text: fmtAgo(a.created_ms) }),
    );
  }

  // A background compile (`eddy upload` sends `wait=false`): compiling, ready or failed.
  function compileRow(c) {
    return el(
      'tr',
      { testid: 'compile-row', 'data-digest': c.digest },
      el('td', { class: 'mono', title: c.digest, text: shortDigest(c.digest) }),
      el('td', { testid: 'compile-status', class: `status-${c.status}`, text: c.status }),
      el('td', { class: 'num', text: fmtBytes(c.size) }),
      el('td', { class: 'num', testid: 'compile-elapsed', text: fmtMs(c.elapsed_ms) }),
      el('td', { testid: 'compile-error', text: c.error || '' }),
    );
  }

  function artifactsView() {
    showOnly('artifacts');
    const table = byTestId('artifacts-table');
    const compiles = byTestId('compiles-table');
    return poll(
      () => Promise.all([api('/v1/artifacts'), api('/v1/artifacts/compiles')]),
      ([artifacts, recent]) => {
        const newest = [...artifacts].sort((a, b) => b.created_ms - a.created_ms);
        table.tBodies[0].replaceChildren(...newest.map(artifactRow));
        table.hidden = artifacts.length === 0;
        byTestId('artifacts-empty').hidden = artifacts.length > 0;
        compiles.tBodies[0].replaceChildren(...recent.map(compileRow));
        compiles.hidden = recent.length === 0;
      },
      ARTIFACTS_POLL_MS,
    );
  }

  // ---- Workers (the admin's) ---------------------------------------------------------------

  function workerRow(w) {
    const beat = w.last_heartbeat_ms_ago;
    return el(
      'tr',
      { testid: 'worker-row', 'data-worker': w.name },
      el('td', { class: 'mono', testid: 'worker-name', text: w.name }),
      el('td', { class: 'num', testid: 'worker-slots', text: String(w.slots) }),
      el('td', { class: 'num', testid: 'worker-free-slots', text: String(w.free_slots) }),
      el('td', { class: 'mono', testid: 'worker-data-addr', text: w.data_addr }),
      el('td', { class: 'num', text: String(w.incarnation) }),
      el('td', { class: 'num', testid: 'worker-heartbeat', 'data-value': String(beat), text: `${fmtMs(beat)} ago` }),
    );
  }

  function workersView() {
    showOnly('workers');
    const table = byTestId('workers-table');
    return poll(
      () => api('/v1/workers'),
      (workers) => {
        const sorted = [...workers].sort((a, b) => a.name.localeCompare(b.name));
        table.tBodies[0].replaceChildren(...sorted.map(workerRow));
        table.hidden = workers.length === 0;
        byTestId('workers-empty').hidden = workers.length > 0;
      },
      POLL_MS,
    );
  }

  // ---- Start ------------------------------------------------------------------------------

  async function start() {
    byTestId('signin-form').addEventListener('submit', signIn);
    byTestId('sign-out').addEventListener('click', () => signOut());
    window.addEventListener('hashchange', route);
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      route();
      return;
    }
    try {
      showSession(await api('/v1/whoami'));
      route();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) signOut(error.message);
      else {
        route();
        showBanner(error.message);
      }
    }
  }

  start();
})();
