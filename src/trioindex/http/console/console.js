// trioindex console. Every figure comes from the service's own HTTP API (/v1/...), fetched with
// the session cookie; actions send the session's CSRF token. No external asset, no innerHTML of
// data: every text is set with textContent.
"use strict";

const POLL_MS = 3000;
const PAGE = 50;
const STATUSES = ["PENDING", "PROCESSING", "SUCCEEDED", "FAILED"];
const FAILURE_TYPES = [
  "STORAGE_UNAVAILABLE", "DOCUMENT_CONTENT_INVALID", "EMBEDDING_PROVIDER_UNAVAILABLE",
  "EMBEDDING_RESULT_INVALID", "INDEXING_STATE_INCONSISTENT", "WORKER_INTERNAL_ERROR",
];
const MESSAGE_CHARS = 4000;
const ROLES = ["read", "write", "admin"];

let who = null;          // {name, role, auth, csrf}
let timer = null;        // the current page's poll
let generation = 0;      // bumped on every navigation: late answers of a left page are dropped

// --- DOM helpers ---------------------------------------------------------------------------

function h(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

// Replace the children of `node` (arrays flattened, null and false left out).
function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function badge(text) { return h("span", { class: `badge ${text}`, text }); }
function shortId(id) { return id ? id.slice(0, 8) : "—"; }
function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }
function allows(role) { return who && ROLES.indexOf(who.role) >= ROLES.indexOf(role); }

function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const t = Math.max(0, Math.round(seconds));
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min ${t % 60} s`;
  if (t < 86400) return `${Math.floor(t / 3600)} h ${Math.floor((t % 3600) / 60)} min`;
  return `${Math.floor(t / 86400)} d ${Math.floor((t % 86400) / 3600)} h`;
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function took(start, end) {
  if (!start || !end) return "—";
  const ms = new Date(end) - new Date(start);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(1)} MiB`;
}

// --- the API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  const init = { method: options.method || "GET", headers, credentials: "same-origin", cache: "no-store" };
  if (init.method !== "GET" && who && who.csrf) headers["X-CSRF-Token"] = who.csrf;
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  let answer;
  try {
    answer = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network", "the service cannot be reached");
  }
  const body = await answer.json().catch(() => null);
  if (!answer.ok) {
    const error = (body && body.error) || { code: "http_" + answer.status, message: answer.statusText };
    if (answer.status === 401 && options.signIn !== false) showSignIn(error.message);
    throw new ApiError(answer.status, error.code, error.message);
  }
  return body;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const text = q.toString();
  return text ? `?${text}` : "";
}

// --- shell: sign-in, navigation, polling -----------------------------------------------------

const main = () => document.getElementById("main");

function render(...nodes) {
  fill(main(), nodes);
}

function notice(text, kind = "") {
  return h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status", text });
}

function showSignIn(message) {
  stopPolling();
  who = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  const input = h("input", { type: "password", id: "api-key", name: "key", autocomplete: "off", required: true, placeholder: "ti_…", "aria-describedby": "key-help" });
  const error = h("div", { id: "sign-in-error" });
  const form = h("form", {
    id: "sign-in",
    onsubmit: async (event) => {
      event.preventDefault();
      fill(error);
      try {
        who = await api("/console/session", { method: "POST", body: { key: input.value }, signIn: false });
        input.value = "";
        signedIn();
      } catch (err) {
        fill(error, notice(err.message, "error"));
      }
    },
  },
    h("label", { for: "api-key" }, "API key", input),
    h("p", { id: "key-help", class: "muted small", text: "A key from `trioindex keys create NAME --role read|write|admin`. It is sent once; the browser then holds an HttpOnly session cookie, never the key." }),
    h("button", { type: "submit", id: "sign-in-button" }, "Sign in"),
    error);
  render(h("section", { class: "panel signin" }, h("h1", { text: "Sign in to the trioindex console" }), message ? notice(message) : null, form));
  input.focus();
}

function signedIn() {
  document.getElementById("nav").hidden = false;
  document.getElementById("who").hidden = !who.auth;
  document.getElementById("who-name").textContent = who.auth ? `${who.name} · ${who.role}` : "";
  route();
}

async function signOut() {
  try { await api("/console/session", { method: "DELETE", signIn: false }); } catch (err) { /* signed out anyway */ }
  showSignIn("Signed out.");
}

function stopPolling() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
}

// Run `load` now and every POLL_MS while the page is shown; `show` gets its result.
function poll(load, show, every = POLL_MS) {
  const mine = generation;
  const tick = async () => {
    if (mine !== generation) return;
    const live = document.getElementById("live");
    try {
      const data = await load();
      if (mine !== generation) return;
      show(data);
      if (live) { live.classList.remove("stale"); live.textContent = `live · updated ${new Date().toLocaleTimeString()}`; }
    } catch (err) {
      if (err.status === 401) return;
      if (live) { live.classList.add("stale"); live.textContent = `not updated: ${err.message}`; }
    }
    if (mine === generation && !document.hidden) timer = setTimeout(tick, every);
    else if (mine === generation) timer = setTimeout(tick, every * 3);
  };
  tick();
}

function liveBadge() { return h("span", { id: "live", class: "live", "aria-live": "polite", text: "live" }); }

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, search] = raw.split("?");
  const parts = path.split("/").map(decodeURIComponent);
  return { parts, params: new URLSearchParams(search || "") };
}

function go(hash) { location.hash = hash; }

const PAGES = {
  overview: overviewPage,
  jobs: jobsPage,
  job: jobPage,
  workers: workersPage,
  documents: documentsPage,
  document: documentPage,
  search: searchPage,
};

function route() {
  if (!who) return;
  stopPolling();
  generation += 1;
  const { parts, params } = parseHash();
  const name = PAGES[parts[0]] ? parts[0] : "overview";
  const section = { job: "jobs", document: "documents" }[name] || name;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.page === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${section[0].toUpperCase()}${section.slice(1)} · trioindex console`;
  PAGES[name](parts.slice(1), params);
  main().focus({ preventScroll: true });
}

// A confirmation in a modal <dialog>: resolves true on Confirm.
function confirmAction(title, text, button) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = button;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "cancel";
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

// --- charts (inline SVG) ---------------------------------------------------------------------

const COLORS = ["#2f80ed", "#d64545", "#f2994a", "#9b51e0", "#56ccf2", "#6d4c41", "#333333"];

// Bars of `series` (each {name, values}) stacked per bucket; `starts` are the bucket times.
function barChart(title, starts, series, bucketSeconds) {
  const W = 560, H = 150, L = 34, B = 18, T = 8;
  const n = starts.length;
  const totals = starts.map((_, i) => series.reduce((sum, one) => sum + one.values[i], 0));
  const max = Math.max(1, ...totals);
  const bw = (W - L - 4) / Math.max(1, n);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const chart = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title}: ${totals.reduce((a, b) => a + b, 0)} in all, at most ${max} per bucket` });
  chart.append(s("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B }));
  chart.append(s("line", { class: "axis", x1: L, y1: y(max), x2: W, y2: y(max), "stroke-dasharray": "3 3" }));
  chart.append(s("text", { x: L - 4, y: y(max) + 3, "text-anchor": "end" }, String(max)));
  chart.append(s("text", { x: L - 4, y: H - B + 3, "text-anchor": "end" }, "0"));
  starts.forEach((start, i) => {
    let base = 0;
    series.forEach((one, k) => {
      const v = one.values[i];
      if (!v) return;
      const rect = s("rect", { x: L + i * bw + 0.5, y: y(base + v), width: Math.max(1, bw - 1), height: y(base) - y(base + v), fill: COLORS[k % COLORS.length] });
      rect.append(s("title", {}, `${when(start)}: ${v} ${one.name}`));
      chart.append(rect);
      base += v;
    });
  });
  const label = (i, anchor) => s("text", { x: L + i * bw + (anchor === "end" ? bw : 0), y: H - 4, "text-anchor": anchor },
    new Date(starts[Math.min(i, n - 1)]).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" }));
  if (n) { chart.append(label(0, "start")); chart.append(label(n - 1, "end")); }
  const per = bucketSeconds >= 3600 ? `${bucketSeconds / 3600} h` : `${bucketSeconds / 60} min`;
  return h("div", { class: "panel" },
    h("h2", {}, title, h("span", { class: "muted small", text: ` · per ${per}` })),
    chart,
    series.length > 1 || series[0].legend
      ? h("div", { class: "legend" }, series.map((one, k) => h("span", {}, h("i", { class: `swatch-${k % COLORS.length}` }), one.name)))
      : null);
}

function meter(used, max) {
  const w = 80, fill = max ? Math.min(w, (used / max) * w) : 0;
  return h("span", { class: "meter", title: `${used} of ${max}` },
    s("svg", { width: w, height: 8, viewBox: `0 0 ${w} 8` }, s("rect", { x: 0, y: 0, width: fill, height: 8, rx: 4, fill: "#2f80ed" })));
}

// --- Overview ------------------------------------------------------------------------------

function overviewPage(_, params) {
  const windowName = params.get("window") === "day" ? "day" : "hour";
  const cards = h("div", { class: "cards", id: "status-cards" });
  const health = h("div", { class: "cards", id: "health-cards" });
  const charts = h("div", { class: "grid charts", id: "charts" });
  const failures = h("div", { class: "panel", id: "failures" });
  const models = h("div", { class: "panel", id: "models" });
  const toggle = h("div", { class: "actions" },
    h("span", { class: "muted small", text: "Charts over the last" }),
    ["hour", "day"].map((w) => h("a", { href: `#/overview?window=${w}`, "aria-current": w === windowName ? "true" : null, class: w === windowName ? "current" : null }, w)));
  render(h("div", { class: "heading" }, h("h1", { text: "Overview" }), liveBadge()), cards, health, toggle, charts,
    h("div", { class: "grid" }, failures, models));
  const actionNotice = h("div", { id: "retry-notice" });
  poll(
    () => Promise.all([api("/v1/status"), api(`/v1/activity?window=${windowName}`)]),
    ([status, activity]) => {
      fill(cards, ...STATUSES.map((st) => h("a", { class: `card ${st}`, href: `#/jobs?status=${st}`, id: `count-${st}` },
        h("div", { class: "label", text: st.toLowerCase() }), h("div", { class: "n", text: status.jobs_by_status[st] }))));
      const live = status.workers.filter((w) => w.state === "RUNNING").length;
      const lost = status.workers.filter((w) => w.state === "LOST").length;
      const recoveries = activity.buckets.reduce((sum, b) => sum + b.lease_recoveries, 0);
      fill(health, 
        h("div", { class: "card" }, h("div", { class: "label", text: "oldest pending" }), h("div", { class: "n", id: "oldest-pending", text: age(status.oldest_pending_age_seconds) })),
        h("div", { class: "card" }, h("div", { class: "label", text: "retries scheduled" }), h("div", { class: "n", text: status.retries_scheduled })),
        h("div", { class: "card" }, h("div", { class: "label", text: `lease recoveries (${windowName})` }), h("div", { class: "n", text: recoveries })),
        h("a", { class: "card", href: "#/workers" }, h("div", { class: "label", text: "workers running" }), h("div", { class: "n", text: lost ? `${live} (${lost} lost)` : live })));
      const starts = activity.buckets.map((b) => b.start);
      const types = [...new Set(activity.buckets.flatMap((b) => Object.keys(b.failures)))].sort();
      fill(charts, 
        barChart("Documents indexed", starts, [{ name: "documents", values: activity.buckets.map((b) => b.documents) }], activity.bucket_seconds),
        barChart("Chunks indexed", starts, [{ name: "chunks", values: activity.buckets.map((b) => b.chunks) }], activity.bucket_seconds),
        barChart("Failed attempts by type", starts,
          types.length ? types.map((t) => ({ name: t, legend: true, values: activity.buckets.map((b) => b.failures[t] || 0) }))
            : [{ name: "none", values: activity.buckets.map(() => 0) }], activity.bucket_seconds),
        barChart("Lease recoveries", starts, [{ name: "expired leases", values: activity.buckets.map((b) => b.lease_recoveries) }], activity.bucket_seconds));
      renderFailures(failures, status.failures_by_type, actionNotice);
      renderModels(models, status);
    });
}

function renderFailures(panel, byType, actionNotice) {
  const entries = Object.entries(byType);
  fill(panel, h("h2", { text: "Failed jobs by type" }), actionNotice,
    entries.length === 0 ? h("p", { class: "muted", text: "No failed jobs." }) :
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, h("th", { text: "failure type" }), h("th", { class: "num", text: "jobs" }), h("th", { text: "" }))),
        h("tbody", {}, entries.map(([type, n]) => h("tr", {},
          h("td", {}, h("a", { href: `#/jobs?status=FAILED&failure_type=${type}`, class: "mono", text: type })),
          h("td", { class: "num", text: n }),
          h("td", {}, h("button", { type: "button", class: "secondary", "data-retry-type": type, onclick: () => retryType(type, actionNotice) }, `Retry all ${n}`))))))));
}

async function retryType(type, where) {
  // the count shown in the confirmation is read now, not the one the table last polled
  let count;
  try {
    count = (await api(`/v1/jobs${query({ status: "FAILED", failure_type: type, limit: 1 })}`)).total;
  } catch (err) { fill(where, notice(err.message, "error")); return; }
  if (!count) { fill(where, notice(`No FAILED ${type} jobs left.`)); return; }
  const ok = await confirmAction("Retry failed jobs", `Send ${plural(count, "FAILED job")} of type ${type} back to the queue with a fresh attempt budget?`, `Retry ${count}`);
  if (!ok) return;
  try {
    const done = await api("/v1/jobs/retry-failed", { method: "POST", body: { failure_type: type } });
    fill(where, notice(`${plural(done.retried, "job")} of type ${type} back in the queue.`, "ok"));
  } catch (err) {
    fill(where, notice(err.message, "error"));
  }
}

function renderModels(panel, status) {
  fill(panel, h("h2", { text: "Models" }),
    h("div", { class: "scroll" }, h("table", {},
      h("thead", {}, h("tr", {}, ["model", "state", "covered", "pending", "failed"].map((t, i) => h("th", { class: i > 1 ? "num" : null, text: t })))),
      h("tbody", {}, status.models.map((m) => h("tr", {},
        h("td", { class: "mono key", text: m.name }),
        h("td", {}, m.serving ? h("span", { class: "badge SUCCEEDED", text: "serving" }) : m.activating ? h("span", { class: "badge PROCESSING", text: "switching to" }) : h("span", { class: "badge", text: "registered" })),
        h("td", { class: "num" }, `${m.covered} / ${m.documents}`, m.activating ? h("div", {}, meter(m.covered, m.documents)) : null),
        h("td", { class: "num", text: m.pending_jobs }),
        h("td", { class: "num", text: m.failed_jobs })))))));
}

// --- Jobs ----------------------------------------------------------------------------------

function select(name, label, options, value) {
  return h("label", {}, label, h("select", { name, id: `filter-${name}` },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text))));
}

function jobsPage(_, params) {
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  const filters = {
    status: params.get("status") || "",
    failure_type: params.get("failure_type") || "",
    model: params.get("model") || "",
    prefix: params.get("prefix") || "",
    since: params.get("since") || "",
  };
  const sinceChoices = [["", "any time"], ["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]];
  const form = h("form", {
    class: "filters panel", id: "job-filters", role: "search",
    onsubmit: (event) => {
      event.preventDefault();
      const data = Object.fromEntries(new FormData(form));
      go(`#/jobs${query(data)}`);
    },
    onchange: (event) => { if (event.target.tagName === "SELECT") form.requestSubmit(); },
  },
    select("status", "status", [["", "any"], ...STATUSES.map((st) => [st, st])], filters.status),
    select("failure_type", "failure type", [["", "any"], ...FAILURE_TYPES.map((t) => [t, t])], filters.failure_type),
    h("label", {}, "model", h("input", { type: "text", name: "model", id: "filter-model", value: filters.model, placeholder: "any" })),
    h("label", {}, "key prefix", h("input", { type: "search", name: "prefix", id: "filter-prefix", value: filters.prefix, placeholder: "docs/…" })),
    select("since", "created", sinceChoices, filters.since),
    h("button", { type: "submit", id: "apply-filters" }, "Filter"));
  const table = h("div", { class: "panel", id: "jobs-table" }, h("p", { class: "muted", text: "Loading…" }));
  render(h("div", { class: "heading" }, h("h1", { text: "Jobs" }), liveBadge()), form, table);
  const since = filters.since ? new Date(Date.now() - Number(filters.since) * 1000).toISOString() : "";
  poll(() => api(`/v1/jobs${query({ ...filters, since, limit: PAGE, offset })}`), (page) => {
    const first = page.total ? offset + 1 : 0;
    const last = offset + page.jobs.length;
    const link = (to) => `#/jobs${query({ ...filters, offset: to || "" })}`;
    fill(table, 
      h("p", { class: "muted small", id: "jobs-count", text: `${first}–${last} of ${page.total} job${page.total === 1 ? "" : "s"}` }),
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, ["job", "document", "status", "attempts", "model", "failure", "created"].map((t) =>
          h("th", { class: ["model", "created"].includes(t) ? "hide-narrow" : t === "attempts" ? "num hide-narrow" : null, text: t })))),
        h("tbody", {}, page.jobs.map((job) => h("tr", { "data-job": job.id },
          h("td", { class: "mono" }, h("a", { href: `#/job/${job.id}`, text: shortId(job.id), "aria-label": `job ${job.id}` })),
          h("td", { class: "key" }, job.document_key, h("span", { class: "muted nowrap", text: ` v${job.version_no}` })),
          h("td", {}, badge(job.status)),
          h("td", { class: "num hide-narrow", text: `${job.attempt_count}/${job.max_attempts}` }),
          h("td", { class: "mono hide-narrow", text: job.model }),
          h("td", { class: "mono small", text: job.last_failure_type || "" }),
          h("td", { class: "hide-narrow", text: when(job.created_at) })))))),
      page.jobs.length === 0 ? h("p", { class: "muted", text: "No job matches these filters." }) : null,
      h("div", { class: "pager" },
        offset > 0 ? h("a", { href: link(Math.max(0, offset - PAGE)), id: "prev-page" }, "← newer") : null,
        last < page.total ? h("a", { href: link(offset + PAGE), id: "next-page" }, "older →") : null));
  });
}

function jobPage([id]) {
  const body = h("div", { id: "job-detail" }, h("p", { class: "muted", text: "Loading…" }));
  const actions = h("div", { id: "job-actions" });
  render(h("div", { class: "heading" }, h("h1", {}, "Job ", h("span", { class: "mono", text: id })), liveBadge()), actions, body);
  poll(() => api(`/v1/jobs/${encodeURIComponent(id)}`), (job) => {
    const message = job.last_failure_message || "";
    fill(body, 
      h("div", { class: "grid" },
        h("section", { class: "panel" }, h("h2", { text: "Job" }), h("dl", { class: "facts" },
          h("dt", { text: "status" }), h("dd", { id: "job-status" }, badge(job.status)),
          h("dt", { text: "document" }), h("dd", { class: "key" }, h("a", { href: `#/document/${encodeURIComponent(job.document_key)}`, text: job.document_key }), ` v${job.version_no}`, job.version_served ? h("span", { class: "muted", text: " (served)" }) : null),
          h("dt", { text: "model" }), h("dd", { class: "mono", text: job.model }),
          h("dt", { text: "attempts" }), h("dd", { text: `${job.attempt_count} of ${job.max_attempts}` }),
          h("dt", { text: "progress" }), h("dd", { text: `${job.progress}%` }),
          h("dt", { text: "chunks" }), h("dd", { text: job.chunk_count ?? "—" }),
          h("dt", { text: "priority" }), h("dd", { text: job.priority }),
          h("dt", { text: "created" }), h("dd", { text: when(job.created_at) }),
          h("dt", { text: "finished" }), h("dd", { text: when(job.finished_at) }),
          h("dt", { text: "available" }), h("dd", { text: when(job.available_at) }),
          job.worker_id ? [h("dt", { text: "worker" }), h("dd", { class: "mono", text: job.worker_id })] : null)),
        h("section", { class: "panel" }, h("h2", { text: "Last failure" }),
          job.last_failure_type ? [h("div", { class: "mono", id: "failure-type", text: job.last_failure_type }),
            h("pre", { class: "message", id: "failure-message", text: message.length > MESSAGE_CHARS ? message.slice(0, MESSAGE_CHARS) + "…" : message })]
            : h("p", { class: "muted", text: "None." }))),
      h("section", { class: "panel" }, h("h2", { text: "Attempts" }),
        job.attempts.length === 0 ? h("p", { class: "muted", text: "No attempt yet." }) :
          h("div", { class: "scroll" }, h("table", { id: "attempts" },
            h("thead", {}, h("tr", {}, ["#", "outcome", "started", "took", "worker", "failure"].map((t) => h("th", { text: t })))),
            h("tbody", {}, job.attempts.map((a) => h("tr", {},
              h("td", { text: a.attempt_no }), h("td", {}, badge(a.status)), h("td", { text: when(a.started_at) }),
              h("td", { text: took(a.started_at, a.finished_at) }), h("td", { class: "mono", text: shortId(a.worker_id) }),
              h("td", { class: "small" }, a.failure_type ? h("span", { class: "mono", text: a.failure_type }) : "",
                a.failure_message ? h("div", { class: "muted", text: a.failure_message.slice(0, 300) }) : null))))))),
      h("section", { class: "panel" }, h("h2", { text: "Events" }),
        h("ol", { class: "timeline", id: "events" }, job.events.map((e) => h("li", {},
          h("span", { class: "muted", text: when(e.created_at) }),
          h("span", {}, h("span", { class: "mono", text: e.event_type }),
            Object.keys(e.detail).length ? h("span", { class: "muted small", text: " " + Object.entries(e.detail).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ") }) : null))))));
    fill(actions, ...(job.status === "FAILED" ? [h("div", { class: "actions" },
      h("button", { type: "button", id: "retry-job", onclick: () => retryOne(job, actions) }, "Retry this job"),
      allows("admin") ? null : h("span", { class: "muted small", text: "needs an admin key" }))] : []), ...[...actions.querySelectorAll(".notice")]);
  });
}

async function retryOne(job, where) {
  const ok = await confirmAction("Retry job", `Send job ${shortId(job.id)} (${job.document_key} v${job.version_no}) back to the queue with a fresh attempt budget?`, "Retry");
  if (!ok) return;
  try {
    await api(`/v1/jobs/${job.id}/retry`, { method: "POST" });
    where.append(notice("Back in the queue: the page follows it.", "ok"));
  } catch (err) {
    where.append(notice(`Refused: ${err.message}`, "error"));
  }
}

// --- Workers -------------------------------------------------------------------------------

function workersPage() {
  const table = h("div", { class: "panel", id: "workers-table" }, h("p", { class: "muted", text: "Loading…" }));
  render(h("div", { class: "heading" }, h("h1", { text: "Workers" }), liveBadge()), table);
  poll(() => api("/v1/workers"), ({ workers }) => {
    fill(table, workers.length === 0 ? h("p", { class: "muted", text: "No worker is running or stopped within the last hour." }) :
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, ["worker", "host · pid", "state", "heartbeat", "slots", "running now"].map((t) => h("th", { text: t })))),
        h("tbody", {}, workers.map((w) => h("tr", { "data-worker": w.id },
          h("td", { class: "mono", text: shortId(w.id) }),
          h("td", { class: "key", text: `${w.hostname} · ${w.pid}` }),
          h("td", {}, badge(w.state)),
          h("td", { text: `${age(w.heartbeat_age_seconds)} ago` }),
          h("td", {}, `${w.running_jobs} / ${w.max_concurrency} `, meter(w.running_jobs, w.max_concurrency)),
          h("td", {}, w.jobs.length === 0 ? h("span", { class: "muted", text: "idle" }) :
            h("ul", { class: "runs" }, w.jobs.map((j) => h("li", {},
              h("a", { class: "mono", href: `#/job/${j.job_id}`, text: shortId(j.job_id) }), " ",
              h("span", { class: "key" }, `${j.document_key} v${j.version_no} · ${j.progress}%`)))))))))));
  });
}

// --- Documents -----------------------------------------------------------------------------

function modelStates(models) {
  return h("div", {}, models.map((m) => h("div", { class: "small" },
    h("span", { class: "mono", text: m.model }), " ", badge(m.job_status),
    m.chunk_count !== null ? ` ${plural(m.chunk_count, "chunk")}` : "",
    m.served_version_no !== null ? h("span", { class: "muted", text: ` · serves v${m.served_version_no}` }) : h("span", { class: "muted", text: " · not served" }),
    m.failure_type ? h("span", { class: "mono", text: ` · ${m.failure_type}` }) : null)));
}

function documentsPage(_, params) {
  const prefix = params.get("prefix") || "";
  const after = params.get("after") || "";
  const input = h("input", { type: "search", name: "prefix", id: "document-prefix", value: prefix, placeholder: "key prefix, e.g. docs/" });
  const form = h("form", { class: "filters panel", role: "search", onsubmit: (e) => { e.preventDefault(); go(`#/documents${query({ prefix: input.value })}`); } },
    h("label", { for: "document-prefix" }, "key prefix", input), h("button", { type: "submit" }, "Search"));
  const list = h("div", { class: "panel", id: "documents-table" }, h("p", { class: "muted", text: "Loading…" }));
  render(h("div", { class: "heading" }, h("h1", { text: "Documents" }), liveBadge()), form, list);
  poll(() => api(`/v1/documents${query({ prefix, after, limit: PAGE })}`), (page) => {
    fill(list, page.documents.length === 0 ? h("p", { class: "muted", text: "No document has a key with this prefix." }) :
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, ["document", "versions", "newest", "models"].map((t) => h("th", { class: t === "newest" ? "hide-narrow" : null, text: t })))),
        h("tbody", {}, page.documents.map((d) => h("tr", {},
          h("td", { class: "key" }, h("a", { href: `#/document/${encodeURIComponent(d.key)}`, text: d.key })),
          h("td", { class: "num", text: d.version_count }),
          h("td", { class: "hide-narrow small" }, `v${d.latest.version_no} · ${bytes(d.latest.byte_size)} · ${d.latest.content_type || "?"}`),
          h("td", {}, modelStates(d.latest.models))))))),
      h("div", { class: "pager" },
        after ? h("a", { href: `#/documents${query({ prefix })}` }, "← first page") : null,
        page.next_after ? h("a", { href: `#/documents${query({ prefix, after: page.next_after })}`, id: "next-page" }, "next →") : null));
  }, POLL_MS * 2);
}

function documentPage(parts) {
  const key = parts.join("/");
  const body = h("div", { id: "document-detail" }, h("p", { class: "muted", text: "Loading…" }));
  const actions = h("div", { class: "actions", id: "document-actions" },
    h("button", { type: "button", class: "danger", id: "delete-document", onclick: () => deleteDocument(key, actions) }, "Delete document"),
    allows("write") ? null : h("span", { class: "muted small", text: "needs a write or admin key" }));
  render(h("div", { class: "heading" }, h("h1", { class: "key", text: key }), liveBadge()), actions, body);
  poll(() => api(`/v1/documents/${key.split("/").map(encodeURIComponent).join("/")}`), (doc) => {
    fill(body, h("section", { class: "panel" }, h("h2", { text: `${plural(doc.version_count, "version")}` }),
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, ["version", "name", "type", "size", "sha256", "created", "models"].map((t) => h("th", { class: ["name", "type", "sha256", "created"].includes(t) ? "hide-narrow" : null, text: t })))),
        h("tbody", {}, doc.versions.slice().reverse().map((v) => h("tr", {},
          h("td", { text: `v${v.version_no}` }), h("td", { class: "key hide-narrow", text: v.original_name }), h("td", { class: "small hide-narrow", text: v.content_type || "?" }),
          h("td", { class: "num nowrap", text: bytes(v.byte_size) }), h("td", { class: "mono small hide-narrow", text: v.sha256.slice(0, 12) }),
          h("td", { class: "hide-narrow", text: when(v.created_at) }),
          h("td", {}, v.models.map((m) => h("div", {}, modelStates([m]), h("a", { class: "small", href: `#/job/${m.job_id}`, text: `job ${shortId(m.job_id)}` })))))))))));
  });
}

async function deleteDocument(key, where) {
  const ok = await confirmAction("Delete document", `Delete ${key}, every version and its chunks? It leaves search at once.`, "Delete");
  if (!ok) return;
  try {
    await api(`/v1/documents/${key.split("/").map(encodeURIComponent).join("/")}`, { method: "DELETE" });
    go(`#/documents${query({ prefix: key.includes("/") ? key.slice(0, key.lastIndexOf("/") + 1) : "" })}`);
  } catch (err) {
    where.append(notice(`Refused: ${err.message}`, "error"));
  }
}

// --- Search playground ---------------------------------------------------------------------

// The passage with the query's words marked: the API's own highlight spans when it gives them
// (`highlights`: [start, end] pairs), else every occurrence of a query word (case-insensitive).
function highlighted(passage, queryText) {
  const text = passage.snippet || passage.text || "";
  let spans = Array.isArray(passage.highlights) ? passage.highlights.filter((p) => Array.isArray(p) && p.length === 2) : null;
  if (!spans) {
    const words = [...new Set(queryText.toLowerCase().split(/[^\p{L}\p{N}]+/u).filter((w) => w.length > 1))];
    const lower = text.toLowerCase();
    spans = [];
    for (const word of words) {
      for (let at = lower.indexOf(word); at !== -1; at = lower.indexOf(word, at + word.length)) spans.push([at, at + word.length]);
    }
  }
  spans.sort((a, b) => a[0] - b[0]);
  const out = [];
  let at = 0;
  for (const [start, end] of spans) {
    if (start < at) continue;
    if (start > at) out.push(text.slice(at, start));
    out.push(h("mark", { text: text.slice(start, end) }));
    at = end;
  }
  out.push(text.slice(at));
  return h("p", { class: "passage" }, out);
}

function searchPage(_, params) {
  const q = params.get("q") || "";
  const mode = params.get("mode") || "hybrid";
  const topK = params.get("top_k") || "5";
  const prefix = params.get("prefix") || "";
  const type = params.get("content_type") || "";
  const input = h("input", { type: "search", name: "q", id: "search-query", value: q, placeholder: "what are you looking for?", maxlength: 2000, required: true });
  const form = h("form", { class: "filters panel", role: "search", id: "search-form", onsubmit: (e) => { e.preventDefault(); go(`#/search${query(Object.fromEntries(new FormData(form)))}`); } },
    h("label", { for: "search-query" }, "query", input),
    select("mode", "mode", [["hybrid", "hybrid"], ["vector", "vector"], ["text", "text"]], mode),
    h("label", {}, "results", h("input", { type: "number", name: "top_k", id: "search-top-k", min: 1, max: 100, value: topK })),
    h("label", {}, "key prefix", h("input", { type: "text", name: "prefix", value: prefix, placeholder: "any" })),
    h("label", {}, "content type", h("input", { type: "text", name: "content_type", value: type, placeholder: "any, e.g. text" })),
    h("button", { type: "submit", id: "search-button" }, "Search"));
  const results = h("div", { class: "panel", id: "search-results" },
    h("p", { class: "muted", text: "Results per document, with their best passages and the query's words marked." }));
  render(h("h1", { text: "Search playground" }), form, results);
  if (!q) { input.focus(); return; }
  const mine = generation;
  const started = performance.now();
  api(`/v1/search${query({ q, mode, top_k: topK, prefix, content_type: type })}`).then((answer) => {
    if (mine !== generation) return;
    const ms = Math.round(performance.now() - started);
    fill(results, 
      h("p", { class: "muted small", id: "search-latency", text: `${plural(answer.results.length, "document")} · ${answer.mode} · ${ms} ms (request to answer, in this browser)` }),
      answer.results.length === 0 ? h("p", { class: "muted", text: "Nothing matched." }) : null,
      answer.results.map((r) => h("article", { class: "result" },
        h("div", { class: "heading" },
          h("a", { class: "key", href: `#/document/${encodeURIComponent(r.document_key)}`, text: r.document_key }),
          h("span", { class: "muted small", text: `v${r.version_no} · ${r.content_type || "?"} · score ${r.score.toFixed(3)}` })),
        r.chunks.map((c) => highlighted(c, q)))));
  }).catch((err) => { if (mine === generation) fill(results, notice(err.message, "error")); });
}

// --- start ---------------------------------------------------------------------------------

window.addEventListener("hashchange", route);
document.addEventListener("visibilitychange", () => { if (!document.hidden && who) route(); });
document.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("sign-out").addEventListener("click", signOut);
  try {
    who = await api("/console/session", { signIn: false });
    signedIn();
  } catch (err) {
    showSignIn(err.status === 401 ? "" : err.message);
  }
});
