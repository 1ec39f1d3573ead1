// The raylite dashboard: polls /api/snapshot (with the page's token) and redraws. No framework,
// no build step: plain DOM, and an inline SVG for the Tune plot.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const POLL_MS = 2000;
const LOG_LINES = 400;
let logAfter = 0;
let lastSnap = null;   // to redraw the tasks table as the filter is typed
const logLines = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}

function num(v) {
  if (typeof v !== "number") return v == null ? "" : String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toExponential(3) : v.toPrecision(4);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i ? n.toFixed(2) + units[i] : n + "B";
}

function duration(seconds) {
  if (seconds == null || isNaN(seconds)) return "";
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 2 : 1) + " s";
  const s = Math.floor(seconds), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  return (h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}

function counts(byState) {
  return Object.entries(byState || {}).map(([k, n]) => n + " " + k).join(", ") || "none";
}

function fill(table, rows, columns) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows.map(row => el("tr", {}, ...columns.map(([fn, cls]) => {
    const text = fn(row);
    const c = typeof cls === "function" ? cls(row) : cls;
    return el("td", c ? { class: c } : {}, text);
  }))));
}

function renderSession(st) {
  document.getElementById("session").textContent =
    `session ${st.session} · pid ${st.pid} · up ${duration(st.uptime_s)} · ${st.cmdline.join(" ")}`;
}

function renderResources(st) {
  const box = document.getElementById("resources");
  const names = Object.keys(st.resources.total).sort((a, b) =>
    (["CPU", "GPU"].includes(b) - ["CPU", "GPU"].includes(a)) || a.localeCompare(b));
  const rows = [];
  for (const name of names) {
    const total = st.resources.total[name], used = st.resources.used[name] || 0;
    const memory = name.endsWith("memory");
    rows.push(el("div", { class: "res" }, name,
      el("div", { class: "bar" }, el("div", { style: `width:${total ? Math.min(100, 100 * used / total) : 0}%` })),
      el("span", { class: "num" }, memory ? `${bytes(used)} / ${bytes(total)}` : `${num(used)} / ${num(total)}`)));
    for (const dev of (st.devices || {})[name] || []) {
      rows.push(el("div", { class: "res device" }, `${name} ${dev.id}`,
        el("div", { class: "bar" }, el("div", { style: `width:${100 * dev.used}%` })),
        el("span", { class: "num" }, `${num(dev.used)} / 1`)));
    }
  }
  box.replaceChildren(...rows);
  const obj = st.objects;
  document.getElementById("summary").textContent =
    `${st.workers} worker processes · ${obj.count} objects (${bytes(obj.bytes)})`;
  document.getElementById("task-counts").textContent = counts(st.tasks);
  document.getElementById("actor-counts").textContent = counts(st.actors);
}

function renderTasks(tasks, now) {
  const words = document.getElementById("task-filter").value.trim().toLowerCase();
  if (words) tasks = tasks.filter(t => (t.name + " " + t.state).toLowerCase().includes(words));
  fill(document.getElementById("tasks-table"), tasks, [
    [t => t.name, "mono"],
    [t => t.state, t => "state-" + t.state],
    [t => t.type],
    [t => t.start_time_ms ? duration(((t.end_time_ms || now) - t.start_time_ms) / 1000) : ""],
    [t => t.worker_pid],
    [t => t.task_id, "mono"],
  ]);
}

function renderActors(actors) {
  fill(document.getElementById("actors-table"), actors, [
    [a => a.class_name, "mono"], [a => a.name], [a => a.state, a => "state-" + a.state], [a => a.pid],
    [a => a.num_restarts], [a => a.actor_id, "mono"],
  ]);
}

function plot(history, metric, mode, now) {
  const W = 560, H = 180, L = 64, R = 12, T = 24, B = 26;
  const svg = svgEl("svg", { class: "plot", viewBox: `0 0 ${W} ${H}`, role: "img",
                             "aria-label": `best ${metric} over time` });
  if (!history || !history.length) {
    svg.append(svgEl("text", { x: L, y: H / 2 }, "no results yet"));
    return svg;
  }
  const xs = history.map(p => p[0]), ys = history.map(p => p[1]);
  const x0 = 0, x1 = Math.max(...xs, now || 0, 1e-9);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const px = x => L + (W - L - R) * (x - x0) / (x1 - x0);
  const py = y => T + (H - T - B) * (1 - (y - y0) / (y1 - y0));
  svg.append(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#9ca3af" }));
  svg.append(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#9ca3af" }));
  svg.append(svgEl("text", { x: 4, y: T + 8 }, num(y1)));
  svg.append(svgEl("text", { x: 4, y: H - B }, num(y0)));
  svg.append(svgEl("text", { x: L, y: H - 8 }, "0 s"));
  svg.append(svgEl("text", { x: W - R - 60, y: H - 8 }, duration(x1)));
  svg.append(svgEl("text", { x: L + 8, y: 14 }, `best ${metric} (${mode})`));
  let d = "";
  history.forEach(([x, y], i) => {   // a step line: the best so far holds until the next one
    d += i === 0 ? `M${px(x)},${py(y)}` : `H${px(x)}V${py(y)}`;
  });
  d += `H${px(x1)}`;
  svg.append(svgEl("path", { d, fill: "none", stroke: "#2563eb", "stroke-width": 2 }));
  for (const [x, y] of history) svg.append(svgEl("circle", { cx: px(x), cy: py(y), r: 2.5, fill: "#2563eb" }));
  return svg;
}

function renderTune(views) {
  const panel = document.getElementById("tune-panel");
  panel.hidden = !views.length;
  document.getElementById("tune").replaceChildren(...views.map(v => {
    const best = v.best ? `${num(v.best.value)} (trial ${v.best.trial_id})` : "none yet";
    const table = el("table", {}, el("thead", {}, el("tr", {},
      ...["trial", "status", v.metric || "metric", "iteration", "config"].map(h => el("th", {}, h)))), el("tbody"));
    fill(table, v.trials || [], [
      [t => t.trial_id, "mono"], [t => t.status, t => "state-" + t.status], [t => num(t.metric)],
      [t => t.iteration], [t => JSON.stringify(t.config), "mono"],
    ]);
    return el("div", {},
      el("h3", {}, `${v.name} `, el("span", { class: "muted" }, v.finished ? "finished" : "running")),
      el("div", { class: "kv" }, el("span", {}, el("b", {}, "trials: "), counts(v.trial_states)),
        el("span", {}, el("b", {}, "best: "), best), el("span", {}, el("b", {}, "elapsed: "), duration(v.elapsed_s))),
      plot(v.best_history, v.metric, v.mode, v.elapsed_s), table);
  }));
}

function renderTrain(views) {
  const panel = document.getElementById("train-panel");
  panel.hidden = !views.length;
  document.getElementById("train").replaceChildren(...views.map(v => {
    const metrics = Object.entries(v.last_metrics || {}).slice(0, 12).map(([k, x]) => `${k}=${num(x)}`).join("  ");
    const table = el("table", {}, el("thead", {}, el("tr", {},
      ...["rank", "pid", "devices"].map(h => el("th", {}, h)))), el("tbody"));
    fill(table, v.worker_info || [], [[w => w.rank], [w => w.pid], [w => w.devices, "mono"]]);
    return el("div", {},
      el("h3", {}, `${v.name} `, el("span", { class: "muted" }, v.finished ? (v.state || "finished") : "running")),
      el("div", { class: "kv" }, el("span", {}, el("b", {}, "reports: "), v.reports),
        el("span", {}, el("b", {}, "iteration: "), v.iteration == null ? "" : v.iteration),
        el("span", {}, el("b", {}, "elapsed: "), duration(v.elapsed_s)),
        el("span", {}, el("b", {}, "workers: "), v.workers)),
      el("div", { class: "mono" }, metrics), table);
  }));
}

function renderLogs(logs) {
  logAfter = logs.next;
  for (const l of logs.lines) logLines.push(l);
  logLines.splice(0, Math.max(0, logLines.length - LOG_LINES));
  const pre = document.getElementById("logs");
  const stick = pre.parentElement.scrollTop + pre.parentElement.clientHeight >= pre.parentElement.scrollHeight - 4;
  pre.replaceChildren(...logLines.map(l => el("div", l.stream === "stderr" ? { class: "err" } : {},
    `(${l.name} pid=${l.pid}) ${l.line}`)));
  if (stick) pre.parentElement.scrollTop = pre.parentElement.scrollHeight;
}

async function poll() {
  const conn = document.getElementById("conn");
  try {
    const r = await fetch(`/api/snapshot?token=${encodeURIComponent(TOKEN)}&after=${logAfter}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const snap = lastSnap = await r.json();
    const st = snap.status;
    renderSession(st);
    renderResources(st);
    renderTasks(snap.tasks, snap.time * 1000);
    renderActors(snap.actors);
    renderTune((st.panels || {}).tune || []);
    renderTrain((st.panels || {}).train || []);
    renderLogs(snap.logs);
    conn.textContent = "live";
    conn.classList.remove("down");
  } catch (e) {
    conn.textContent = `disconnected (${e.message}): the driver may have ended`;
    conn.classList.add("down");
  }
  setTimeout(poll, POLL_MS);
}

document.getElementById("task-filter").addEventListener("input", () => {
  if (lastSnap) renderTasks(lastSnap.tasks, lastSnap.time * 1000);
});
poll();
