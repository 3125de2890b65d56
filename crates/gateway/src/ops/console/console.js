// The Switchyard console: polls the operations listener's read-only JSON and follows its
// event stream. Plain DOM, no framework, nothing loaded from elsewhere; every value from the
// gateway is written as text, never as markup.
"use strict";

const REFRESH_MS = 2000;
const HISTORY_MS = 5000;
const WINDOW_S = 600;
const PAGE_SIZE = 50;
const MAX_EVENTS = 200;
const SVG = "http://www.w3.org/2000/svg";
const OUTCOME_COLOURS = {
  completed: "#2e7d32", failed: "#c62828", timed_out: "#ef6c00", cancelled: "#6d4c41",
  unserved: "#8e24aa", transport_lost: "#d81b60", shutting_down: "#546e7a",
};

const state = {
  page: 0,
  totalWorkers: 0,
  history: new Map(),
  bucketSeconds: 10,
  identities: new Map(),
  // The last event number seen from each gateway node ("" outside a cluster).
  lastSeq: new Map(),
  explained: null,
  lastHistory: 0,
};

function $(id) { return document.getElementById(id); }

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return seconds > 0 ? `${Math.round(seconds * 1000)} ms` : "0";
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  return `${(ms / 1000).toFixed(1)} s`;
}

function fmtTime(unixMs) {
  if (!unixMs) return "–";
  return new Date(unixMs).toLocaleString();
}

function fmtClock(unixMs) {
  return new Date(unixMs).toLocaleTimeString();
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function showEmpty(id, empty) {
  $(id).hidden = !empty;
}

// ---- about ----

async function loadAbout() {
  try {
    const about = await getJson("/v1/about");
    $("about").replaceChildren(
      el("span", { class: "host", title: "host the gateway runs on" }, `gateway on ${about.host}`),
      ...(about.cluster_node ? [el("span", { class: "host", title: "cluster node this page shows" }, `node ${about.cluster_node}`)] : []),
      el("span", {}, `pid ${about.pid}`),
      el("span", {}, `ops ${about.ops_addr}`),
      el("span", {}, `v${about.version}`),
      el("span", {}, `up since ${fmtTime(about.started_unix_ms)}`),
      el("span", { class: "badge" }, "read-only"),
    );
    document.title = `Switchyard · ${about.host}`;
  } catch (error) {
    $("about").textContent = `gateway unreachable: ${error.message}`;
  }
}

// ---- pools ----

function poolKey(namespace, taskQueue) { return `${namespace}\u0000${taskQueue}`; }

function chart(series) {
  const width = 180, height = 40, barsHeight = 26;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "chart" });
  const points = series ? series.points : [];
  if (points.length === 0) {
    const text = svg("text", { x: 2, y: 24, class: "chart-empty" });
    text.textContent = "no dispatch in 10 min";
    root.append(text);
    return root;
  }
  // Always the whole window: a young history is drawn at the right, the past left empty.
  const slots = Math.max(points.length, Math.round(WINDOW_S / state.bucketSeconds));
  const offset = slots - points.length;
  const slot = width / slots;
  const maxCount = Math.max(1, ...points.map((p) => p.dispatches));
  const maxLatency = Math.max(0.001, ...points.map((p) => p.p99_ms || 0));
  points.forEach((point, i) => {
    let y = barsHeight;
    for (const [outcome, count] of Object.entries(point.outcomes)) {
      const h = (count / maxCount) * barsHeight;
      y -= h;
      root.append(svg("rect", {
        x: ((offset + i) * slot).toFixed(2), y: y.toFixed(2), width: Math.max(slot - 0.5, 0.5).toFixed(2),
        height: h.toFixed(2), fill: OUTCOME_COLOURS[outcome] || "#999",
      }));
    }
  });
  for (const [key, cls] of [["p50_ms", "p50"], ["p99_ms", "p99"]]) {
    const coords = [];
    points.forEach((point, i) => {
      if (point[key] === null || point[key] === undefined) return;
      const y = height - 1 - (point[key] / maxLatency) * (height - barsHeight - 2);
      coords.push([(offset + i) * slot + slot / 2, y]);
    });
    if (coords.length > 1) {
      const line = coords.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
      root.append(svg("polyline", { points: line, class: `line ${cls}` }));
    }
    for (const [x, y] of coords) {
      root.append(svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 1.6, class: `pt ${cls}` }));
    }
  }
  return root;
}

function chartSummary(series) {
  if (!series) return "";
  const recent = series.points.slice(-6);
  const count = recent.reduce((n, p) => n + p.dispatches, 0);
  const rate = count / (recent.length * state.bucketSeconds);
  const last = [...series.points].reverse().find((p) => p.dispatches > 0);
  const mix = last ? Object.entries(last.outcomes).map(([k, v]) => `${k} ${v}`).join(", ") : "";
  return `${rate.toFixed(rate < 10 ? 2 : 0)}/s over the last minute` +
    (last ? ` · p50 ${fmtMs(last.p50_ms)} · p99 ${fmtMs(last.p99_ms)} · ${mix}` : "");
}

async function refreshHistory() {
  const history = await getJson("/v1/history");
  state.bucketSeconds = history.bucket_seconds;
  state.history = new Map(history.pools.map((p) => [poolKey(p.namespace, p.task_queue), p]));
  state.lastHistory = Date.now();
}

async function refreshPools() {
  const { pools } = await getJson("/v1/pools");
  const keys = new Set(pools.map((p) => poolKey(p.namespace, p.task_queue)));
  const rows = pools.map((pool) => poolRow(pool));
  // A pool that only dispatched recently (no worker left, nothing parked) keeps its chart.
  for (const [key, series] of state.history) {
    if (!keys.has(key)) {
      rows.push(poolRow({
        namespace: series.namespace, task_queue: series.task_queue, workers: 0, capacity: 0,
        in_flight: 0, parked: 0, oldest_parked_seconds: 0, activity_types: [],
      }));
    }
  }
  replaceRows($("pools").tBodies[0], rows);
  showEmpty("pools-empty", rows.length === 0);
  return pools;
}

function poolRow(pool) {
  const series = state.history.get(poolKey(pool.namespace, pool.task_queue));
  const short = pool.capacity === 0 || pool.parked > 0;
  return el("tr", {
    "data-namespace": pool.namespace, "data-task-queue": pool.task_queue,
    class: short ? "warn" : "",
  },
  el("td", {}, pool.namespace),
  el("td", {}, pool.task_queue),
  el("td", { class: "n", "data-field": "workers" }, pool.workers),
  el("td", { class: "n", "data-field": "capacity" }, pool.capacity),
  el("td", { class: "n", "data-field": "in_flight" }, pool.in_flight),
  el("td", { class: "n", "data-field": "parked" }, pool.parked),
  el("td", { class: "n" }, pool.parked > 0 ? fmtDuration(pool.oldest_parked_seconds) : "–"),
  el("td", { class: "list" }, pool.activity_types.join(", ")),
  el("td", { class: "chart-cell", title: chartSummary(series) },
    chart(series), el("div", { class: "chart-text" }, chartSummary(series))));
}

function legend() {
  const items = Object.entries(OUTCOME_COLOURS).map(([name, colour]) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = colour;
    return el("span", { class: "legend-item" }, swatch, name.replace("_", " "));
  });
  const p50 = el("span", { class: "legend-item" }, el("span", { class: "swatch line-p50" }), "p50");
  const p99 = el("span", { class: "legend-item" }, el("span", { class: "swatch line-p99" }), "p99");
  $("legend").replaceChildren("Bars: dispatches per 10 s by outcome. Lines: latency ", p50, p99, " · ", ...items);
}

// ---- unserved and explanations ----

async function refreshUnserved() {
  const { unserved } = await getJson("/v1/unserved");
  const rows = unserved.map((q) => {
    const row = el("tr", {
      class: "clickable",
      "data-namespace": q.namespace, "data-task-queue": q.task_queue,
      "data-activity": q.activity_type, "data-reason": q.reason,
      title: "Click for the per-worker explanation",
    },
    el("td", {}, q.namespace),
    el("td", {}, q.task_queue),
    el("td", {}, q.activity_type),
    el("td", {}, q.node || "any"),
    el("td", { class: "reason" }, q.reason.replaceAll("_", " ")),
    el("td", { class: "detail" }, q.detail),
    el("td", { class: "n", "data-field": "waiting" }, q.waiting),
    el("td", { class: "n" }, fmtDuration(q.oldest_wait_seconds)));
    row.addEventListener("click", () => openExplanation(q));
    return row;
  });
  replaceRows($("unserved").tBodies[0], rows);
  showEmpty("unserved-empty", rows.length === 0);
  return unserved;
}

async function openExplanation(q) {
  state.explained = q;
  await refreshExplanation();
  $("explain").hidden = false;
  $("explain").scrollIntoView({ block: "nearest" });
}

async function refreshExplanation() {
  const q = state.explained;
  if (!q) return;
  const params = new URLSearchParams({
    namespace: q.namespace, task_queue: q.task_queue, activity_type: q.activity_type,
  });
  if (q.node) params.set("node", q.node);
  const explained = await getJson(`/v1/explain?${params}`);
  $("explain-title").textContent =
    `Why ${q.activity_type} in ${q.namespace}/${q.task_queue}${q.node ? ` on node ${q.node}` : ""} is not placed`;
  const rows = explained.workers.map((w) => el("tr", {
    "data-worker-id": w.worker_id, class: w.eligible ? "ok" : "",
  },
  el("td", { class: "n" }, w.worker_id),
  el("td", {}, w.identity),
  el("td", {}, w.transport),
  el("td", {}, w.node || "–"),
  el("td", { class: "n" }, `${w.in_flight} / ${w.capacity ?? "?"}`),
  el("td", {}, el("span", { class: `standing ${w.standing}` }, w.standing.replaceAll("_", " "))),
  el("td", { class: "why" }, w.explanation)));
  replaceRows($("explain").querySelector("tbody"), rows);
  showEmpty("explain-empty", rows.length === 0);
}

// ---- workers ----

function fillSelect(select, counts) {
  const chosen = select.value;
  const options = [el("option", { value: "" }, "any")];
  for (const [value, count] of Object.entries(counts)) {
    const label = value === "-" ? "(none)" : value.replaceAll("_", " ");
    options.push(el("option", { value }, `${label} (${count})`));
  }
  select.replaceChildren(...options);
  select.value = chosen;
  if (select.value !== chosen) select.value = "";
}

async function refreshWorkers() {
  const params = new URLSearchParams({ offset: state.page * PAGE_SIZE, limit: PAGE_SIZE });
  for (const name of ["node", "transport", "standing"]) {
    const value = $(`filter-${name}`).value;
    if (value) params.set(name, value);
  }
  const body = await getJson(`/v1/workers?${params}`);
  state.totalWorkers = body.total;
  const pages = Math.max(1, Math.ceil(body.total / PAGE_SIZE));
  if (state.page >= pages) {
    state.page = pages - 1;
    return refreshWorkers();
  }
  fillSelect($("filter-node"), body.nodes);
  fillSelect($("filter-transport"), body.transports);
  fillSelect($("filter-standing"), body.standings);
  const rows = body.workers.map((w) => {
    state.identities.set(w.worker_id, w.identity);
    return el("tr", { "data-worker-id": w.worker_id, "data-transport": w.transport },
      el("td", { class: "n" }, w.worker_id),
      el("td", { class: "identity" }, w.identity),
      el("td", {}, w.transport),
      el("td", {}, w.node || "–"),
      el("td", { class: "list" }, w.namespaces.join(", ")),
      el("td", {}, w.task_queue),
      el("td", { class: "list" }, w.activity_types.join(", ")),
      el("td", { class: "n" }, `${w.in_flight} / ${w.capacity ?? "?"}`),
      el("td", { title: w.eligibility },
        el("span", { class: `standing ${w.standing}` }, w.standing.replaceAll("_", " "))),
      el("td", {}, fmtTime(w.connected_since_unix_ms)));
  });
  replaceRows($("workers").tBodies[0], rows);
  showEmpty("workers-empty", rows.length === 0);
  $("workers-count").textContent =
    `${body.total} shown of ${body.registered} registered`;
  $("page-info").textContent = `page ${state.page + 1} of ${pages}`;
  $("page-prev").disabled = state.page === 0;
  $("page-next").disabled = state.page + 1 >= pages;
  return body;
}

// ---- summary ----

function summary(pools, unserved, workers) {
  const tile = (label, value, cls) =>
    el("div", { class: `tile ${cls || ""}` }, el("div", { class: "value" }, value), el("div", {}, label));
  const parked = unserved.reduce((n, q) => n + q.waiting, 0);
  const s = workers.standings;
  const notEligible = Object.entries(s).filter(([k]) => k !== "eligible").reduce((n, [, v]) => n + v, 0);
  $("summary").replaceChildren(
    tile("workers", workers.registered),
    tile("eligible", s.eligible || 0, "ok"),
    tile("not eligible", notEligible, notEligible > 0 ? "warn" : ""),
    tile("pools", pools.length),
    tile("parked dispatches", parked, parked > 0 ? "warn" : ""),
  );
}

// ---- events ----

function eventItem(e) {
  const who = e.identity || state.identities.get(e.worker_id);
  return el("li", { "data-kind": e.kind, "data-worker-id": e.worker_id, "data-detail": e.detail },
    el("time", {}, fmtClock(e.at_unix_ms)),
    el("span", { class: `kind ${e.kind}` }, e.kind),
    e.kind === "missed" || e.kind === "silent_nodes" ? null
      : el("span", { class: "who" }, `worker ${e.worker_id}${who ? ` (${who})` : ""}${e.gateway_node ? ` on ${e.gateway_node}` : ""}`),
    el("span", { class: "detail" }, e.detail));
}

function followEvents() {
  const source = new EventSource("/v1/events");
  source.onmessage = (message) => {
    let e;
    try { e = JSON.parse(message.data); } catch { return; }
    const from = e.gateway_node || "";
    if (e.seq && e.seq <= (state.lastSeq.get(from) || 0)) return;
    if (e.seq) state.lastSeq.set(from, e.seq);
    if (e.kind === "connected" && e.identity) state.identities.set(e.worker_id, e.identity);
    const list = $("events");
    list.prepend(eventItem(e));
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
    showEmpty("events-empty", false);
  };
  source.onerror = () => $("live").classList.remove("on");
  source.onopen = () => $("live").classList.add("on");
}

// ---- the loop ----

async function refresh() {
  try {
    if (Date.now() - state.lastHistory >= HISTORY_MS) await refreshHistory();
    const [pools, unserved, workers] =
      await Promise.all([refreshPools(), refreshUnserved(), refreshWorkers()]);
    if (state.explained && !$("explain").hidden) await refreshExplanation();
    summary(pools, unserved, workers);
    $("refreshed").textContent = `refreshed ${fmtClock(Date.now())}`;
    document.body.dataset.refreshed = String(Date.now());
  } catch (error) {
    $("refreshed").textContent = `refresh failed: ${error.message}`;
  }
}

function schedule() {
  setTimeout(async () => {
    if (!document.hidden) await refresh();
    schedule();
  }, REFRESH_MS);
}

function init() {
  $("tz").textContent = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  legend();
  for (const name of ["node", "transport", "standing"]) {
    $(`filter-${name}`).addEventListener("change", () => { state.page = 0; refreshWorkers(); });
  }
  $("page-prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); refreshWorkers(); });
  $("page-next").addEventListener("click", () => { state.page += 1; refreshWorkers(); });
  $("explain-close").addEventListener("click", () => { $("explain").hidden = true; state.explained = null; });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  loadAbout();
  followEvents();
  refresh().then(schedule);
}

document.addEventListener("DOMContentLoaded", init);
