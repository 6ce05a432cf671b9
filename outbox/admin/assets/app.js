"use strict";
// The outboxkit console: plain DOM and inline SVG, no dependencies. Every
// URL is relative to the page, so the handler can be mounted under any
// prefix. The view's state (state, filters, open message) lives in the
// URL's fragment, so a message or a filtered list has a link, and an
// auto-refresh keeps it.
(function () {
  const statuses = ["PENDING", "PROCESSING", "SENT", "DELIVERED", "FAILED", "CANCELLED"];
  const filterKeys = ["topic", "tenant", "group", "error_code", "created_after", "created_before"];
  const $ = (id) => document.getElementById(id);

  // state is what the URL fragment holds.
  let state = readHash();
  let nextAfterSeq = 0;
  // shown is how many messages the list shows: a refresh reloads as many,
  // so paging survives it.
  let shown = 0;
  let refreshes = 0;
  const selected = new Map(); // id -> message
  let totals = {};
  let pauses = [];
  let pendingBulk = null;
  // fleetOn: the host runs a fleet (api/stats says so); its section shows.
  let fleetOn = false;

  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    const s = { status: p.has("status") ? p.get("status") : "FAILED", blocks: p.get("blocks") === "1", m: p.get("m") || "", mt: p.get("mt") || "" };
    for (const k of filterKeys) s[k] = p.get(k) || "";
    return s;
  }

  function writeHash() {
    const p = new URLSearchParams();
    if (state.status !== "FAILED") p.set("status", state.status);
    for (const k of filterKeys) if (state[k]) p.set(k, state[k]);
    if (state.blocks) p.set("blocks", "1");
    if (state.m) { p.set("m", state.m); p.set("mt", state.mt); }
    const h = p.toString();
    history.replaceState(null, "", h ? "#" + h : location.pathname + location.search);
  }

  // messageLink is the URL of a message, with the list's state kept.
  function messageLink(m) {
    const p = new URLSearchParams(location.hash.slice(1));
    p.set("m", m.id);
    p.set("mt", m.tenant);
    return "#" + p.toString();
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-") || k.startsWith("aria-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return e;
  }

  function button(label, cls, attrs, onClick) {
    const b = el("button", Object.assign({ type: "button", class: cls }, attrs || {}), label);
    b.addEventListener("click", onClick);
    return b;
  }

  async function api(method, path, body) {
    const opts = { method, headers: { "Accept": "application/json" } };
    if (method !== "GET") {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body || {});
    }
    const res = await fetch("api/" + path, opts);
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(data.error || res.status + " " + res.statusText);
    return data;
  }

  function age(seconds) {
    if (!seconds) return "";
    if (seconds < 60) return Math.round(seconds) + " s";
    if (seconds < 3600) return Math.round(seconds / 60) + " min";
    if (seconds < 86400) return (seconds / 3600).toFixed(1) + " h";
    return (seconds / 86400).toFixed(1) + " d";
  }

  function when(t) { return t ? new Date(t).toLocaleString() : ""; }

  function notice(text, isError) {
    const n = $("notice");
    n.textContent = text;
    n.className = isError ? "error" : "";
  }

  // ---- Overview: warnings, pictures, topics, storage ----

  async function loadStats() {
    const s = await api("GET", "stats");
    totals = s.totals;
    pauses = s.pauses;
    $("warnings").replaceChildren(...s.warnings.map((w) => el("li", { class: "warning", "data-kind": w.kind, "data-topic": w.topic || "" }, w.message)));
    const paused = new Map();
    for (const p of s.pauses) {
      paused.set(p.topic, (paused.get(p.topic) || []).concat([p.group ? "group " + p.group : "all", p.tenant ? "(" + p.tenant + ")" : ""].join(" ").trim()));
    }
    const tenant = $("pause-tenant").value.trim();
    $("stats").tBodies[0].replaceChildren(...s.topics.map((t) => {
      const mine = s.pauses.find((p) => p.topic === t.topic && !p.group && p.tenant === tenant);
      const act = mine ?
        button("Resume", "resume", { "data-topic": t.topic }, () => resume({ topic: t.topic, group: "", tenant })) :
        button("Pause", "pause", { "data-topic": t.topic }, () => pause({ topic: t.topic, group: "", tenant: $("pause-tenant").value.trim() }));
      return el("tr", { "data-topic": t.topic },
        el("td", {}, t.topic),
        ...statuses.map((st) => el("td", { class: "n", "data-status": st }, t.counts[st] || 0)),
        el("td", { class: "n", "data-age": t.oldest_pending_age_seconds }, age(t.oldest_pending_age_seconds)),
        el("td", { class: "paused" }, (paused.get(t.topic) || []).join(", ")),
        el("td", {}, act));
    }));
    $("chart-depth").replaceChildren(depthChart(s.topics));
    $("updated").textContent = "updated " + when(s.now);
    loadStorage(s.storage);
    fleetOn = !!s.fleet;
    $("fleet").hidden = $("nav-fleet").hidden = !fleetOn;
    renderStates();
  }

  // loadStorage shows the store's storage report, when it has one: dead
  // row versions that keep growing, or a cleanup horizon held by a
  // transaction left open, slow every claim.
  function loadStorage(st) {
    $("storage").hidden = !st;
    if (!st) return;
    $("storage-tables").tBodies[0].replaceChildren(...st.tables.map((t) => el("tr", { "data-table": t.name },
      el("td", {}, el("code", {}, t.name)), el("td", { class: "n", "data-live": t.live_rows }, t.live_rows),
      el("td", { class: "n", "data-dead": t.dead_rows }, t.dead_rows), el("td", {}, t.last_cleanup ? when(t.last_cleanup) : "never"))));
    const h = st.horizon;
    $("horizon").textContent = h.holder ?
      "Cleanup horizon: " + h.age_transactions + " transactions old, held by " + h.holder + "." :
      "Cleanup horizon: nothing holds it back.";
  }

  const svgNS = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }

  // lineChart draws series (arrays of numbers, one per minute) as lines on
  // a 60-minute axis, with the largest value labelled.
  function lineChart(series, unit, label) {
    const W = 420, H = 120, L = 44, B = 16;
    const top = Math.max(1, ...series.flatMap((s) => s.values));
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, class: "line" });
    root.append(svg("line", { x1: L, y1: H - B, x2: W, y2: H - B, class: "axis" }));
    root.append(svg("text", { x: L - 4, y: 10, "text-anchor": "end", class: "tick" }, fmt(top) + unit));
    root.append(svg("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, "0"));
    root.append(svg("text", { x: L, y: H - 2, class: "tick" }, "-60 min"));
    root.append(svg("text", { x: W, y: H - 2, "text-anchor": "end", class: "tick" }, "now"));
    for (const s of series) {
      const pts = s.values.map((v, i) => `${(L + i * (W - L) / (s.values.length - 1)).toFixed(1)},${(H - B - v / top * (H - B - 12)).toFixed(1)}`);
      const title = svg("title", {});
      title.textContent = s.name + ": " + s.values.reduce((a, b) => a + b, 0) + (unit ? "" : " in the hour");
      root.append(svg("polyline", { points: pts.join(" "), class: "series " + s.cls, "data-series": s.name, "data-total": s.values.reduce((a, b) => a + b, 0) }, title));
    }
    return root;
  }

  function fmt(v) { return v >= 1000 ? (v / 1000).toFixed(1) + "k" : String(Math.round(v * 10) / 10); }

  // depthChart draws one bar per topic: its pending and processing messages.
  function depthChart(topics) {
    const W = 420, row = 18, L = 110;
    const depth = topics.map((t) => ({ topic: t.topic, n: (t.counts.PENDING || 0) + (t.counts.PROCESSING || 0) }));
    const top = Math.max(1, ...depth.map((d) => d.n));
    const H = Math.max(row, depth.length * row);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "queue depth per topic", class: "bars" });
    depth.forEach((d, i) => {
      const t = svg("text", { x: L - 6, y: i * row + 13, "text-anchor": "end", class: "tick" });
      t.textContent = d.topic;
      const w = Math.max(d.n ? 2 : 0, d.n / top * (W - L - 50));
      const n = svg("text", { x: L + w + 4, y: i * row + 13, class: "tick" });
      n.textContent = d.n;
      root.append(t, svg("rect", { x: L, y: i * row + 3, width: w.toFixed(1), height: row - 6, class: "bar", "data-topic": d.topic, "data-depth": d.n }), n);
    });
    return root;
  }

  async function loadActivity() {
    const a = await api("GET", "activity");
    const m = a.minutes;
    $("activity-note").textContent = a.complete ? "" : "From the hour's first " + a.scanned + " messages only (Config.ScanLimit).";
    $("chart-throughput").replaceChildren(lineChart([
      { name: "enqueued", cls: "s-enq", values: m.map((x) => x.enqueued) },
      { name: "published", cls: "s-pub", values: m.map((x) => x.published) },
      { name: "failed", cls: "s-fail", values: m.map((x) => x.failed) }], "", "throughput per minute"));
    $("chart-latency").replaceChildren(lineChart([
      { name: "median", cls: "s-p50", values: m.map((x) => x.latency_p50_ms) },
      { name: "max", cls: "s-max", values: m.map((x) => x.latency_max_ms) }], " ms", "commit-to-publish latency"));
  }

  async function pause(p) {
    try {
      await api("POST", "pauses", p);
      notice("Paused " + describePause(p) + ".");
      await refresh();
    } catch (e) { notice("Pause failed: " + e.message, true); }
  }

  async function resume(p) {
    try {
      await api("DELETE", "pauses?" + new URLSearchParams(p).toString());
      notice("Resumed " + describePause(p) + ".");
      await refresh();
    } catch (e) { notice("Resume failed: " + e.message, true); }
  }

  function describePause(p) {
    return "topic " + p.topic + (p.group ? ", group " + p.group : "") + (p.tenant ? " for tenant " + p.tenant : " for every tenant");
  }

  // ---- Messages: states, filters, selection, bulk actions ----

  function renderStates() {
    const all = statuses.reduce((a, s) => a + (totals[s] || 0), 0);
    $("states").replaceChildren(...[["", "All", all]].concat(statuses.map((s) => [s, s === "FAILED" ? "Dead letters" : s.charAt(0) + s.slice(1).toLowerCase(), totals[s] || 0])).map(([s, label, n]) =>
      button(label + " " + n, "state" + (state.status === s ? " current" : ""), { "data-status": s, "aria-pressed": String(state.status === s) }, () => {
        state.status = s;
        if (s !== "FAILED") state.blocks = false;
        changed();
      })));
  }

  function listQuery(limit, after) {
    const p = new URLSearchParams();
    if (state.status) p.set("status", state.status);
    for (const k of filterKeys) {
      if (!state[k]) continue;
      p.set(k, k.startsWith("created_") ? new Date(state[k]).toISOString() : state[k]);
    }
    if (state.blocks) p.set("blocks_group", "true");
    p.set("limit", limit);
    if (after) p.set("after_seq", after);
    return p;
  }

  // loadMessages loads the list: the first page again, as many as shown,
  // or (append) the next page. Loads run one after another, so an
  // auto-refresh never overwrites a page the operator just added.
  let listQueue = Promise.resolve();
  function loadMessages(append) {
    const run = listQueue.then(() => loadMessagesNow(append));
    listQueue = run.catch(() => {});
    return run;
  }

  async function loadMessagesNow(append) {
    const limit = append ? 50 : Math.min(1000, Math.max(50, shown));
    const page = await api("GET", "messages?" + listQuery(limit, append ? nextAfterSeq : 0).toString());
    const body = $("dead").tBodies[0];
    const rows = page.messages.map(messageRow);
    if (append) body.append(...rows); else body.replaceChildren(...rows);
    shown = body.rows.length;
    nextAfterSeq = page.next_after_seq;
    $("more").hidden = !nextAfterSeq;
    $("shown-count").textContent = shown + " shown" + (nextAfterSeq ? ", more match" : "");
    // A selection keeps only what is still listed.
    const listed = new Set([...body.rows].map((r) => r.dataset.id));
    for (const id of [...selected.keys()]) if (!listed.has(id)) selected.delete(id);
    renderSelection();
  }

  function messageRow(m) {
    const box = el("input", { type: "checkbox", class: "select", "data-id": m.id, checked: selected.has(m.id), "aria-label": "Select " + m.id });
    box.addEventListener("change", () => { if (box.checked) selected.set(m.id, m); else selected.delete(m.id); renderSelection(); });
    const actions = [];
    if (m.status === "FAILED") actions.push(button("Requeue", "requeue", { "data-id": m.id }, (e) => doOne("requeue", m, e.target)));
    if (m.status === "FAILED" || m.status === "PENDING") actions.push(" ", button("Cancel", "cancel", { "data-id": m.id }, (e) => doOne("cancel", m, e.target)));
    actions.push(" ", button("Open", "show", { "data-id": m.id }, () => openMessage(m)));
    return el("tr", { "data-id": m.id, "data-status": m.status },
      el("td", {}, box),
      el("td", {}, el("a", { href: messageLink(m), class: "id" }, el("code", {}, m.id))), el("td", {}, m.tenant), el("td", {}, m.topic), el("td", {}, m.group || ""),
      el("td", {}, m.status),
      el("td", { class: m.blocks_group ? "blocking" : "" }, m.blocks_group ? "holds " + m.group : ""),
      el("td", { class: "n" }, m.attempts),
      el("td", { class: "err" }, m.error_code ? m.error_code + ": " + (m.error_message || "") : ""),
      el("td", {}, when(m.updated_at)), el("td", { class: "actions" }, ...actions));
  }

  function renderSelection() {
    const n = selected.size;
    $("selected-count").textContent = n ? n + " selected" : "";
    $("bulk-requeue-selected").disabled = ![...selected.values()].some((m) => m.status === "FAILED");
    $("bulk-cancel-selected").disabled = ![...selected.values()].some((m) => m.status === "FAILED" || m.status === "PENDING");
    const boxes = [...document.querySelectorAll("#dead input.select")];
    $("select-all").checked = boxes.length > 0 && boxes.every((b) => b.checked);
  }

  async function doOne(action, m, btn) {
    if (action === "cancel") {
      const what = m.blocks_group ? " It will not be sent, and group " + m.group + " moves on to its next message." : " It will not be sent.";
      if (!window.confirm("Cancel " + m.id + "?" + what)) return;
    }
    if (btn) btn.disabled = true;
    try {
      await api("POST", "messages/" + encodeURIComponent(m.id) + "/" + action + "?tenant=" + encodeURIComponent(m.tenant));
      notice(action === "requeue" ? "Requeued " + m.id + ": it is PENDING again." :
        "Cancelled " + m.id + (m.blocks_group ? ": group " + m.group + " is released." : "."));
      await refresh();
    } catch (e) {
      notice((action === "requeue" ? "Requeue" : "Cancel") + " of " + m.id + " failed: " + e.message, true);
      if (btn) btn.disabled = false;
    }
  }

  async function doSelected(action) {
    const ms = [...selected.values()].filter((m) => action === "requeue" ? m.status === "FAILED" : m.status === "FAILED" || m.status === "PENDING");
    if (!ms.length || !window.confirm((action === "requeue" ? "Requeue " : "Cancel ") + ms.length + " selected messages?")) return;
    let done = 0;
    const failed = [];
    for (const m of ms) {
      try {
        await api("POST", "messages/" + encodeURIComponent(m.id) + "/" + action + "?tenant=" + encodeURIComponent(m.tenant));
        done++;
        selected.delete(m.id);
      } catch (e) { failed.push(m.id + ": " + e.message); }
    }
    notice((action === "requeue" ? "Requeued " : "Cancelled ") + done + " of " + ms.length + " selected" + (failed.length ? "; failed: " + failed.join("; ") : "."), failed.length > 0);
    await refresh();
  }

  function bulkFilter() {
    const f = {};
    if (state.status) f.status = state.status;
    for (const k of filterKeys) {
      if (!state[k]) continue;
      if (k === "tenant") f.tenants = [state.tenant];
      else f[k] = k.startsWith("created_") ? new Date(state[k]).toISOString() : state[k];
    }
    if (state.blocks) f.blocks_group = true;
    return f;
  }

  // bulk runs a requeue or cancel over the filter: a dry run first, whose
  // count the operator confirms.
  async function bulk(action) {
    const filter = bulkFilter();
    try {
      const res = await api("POST", action, { filter, dry_run: true });
      const n = res.matched + (res.next_after_seq ? "+" : "");
      pendingBulk = { action, filter };
      $("bulk-preview-text").textContent = (action === "requeue" ? "Requeue " : "Cancel ") + n + " matching messages?";
      $("bulk-preview").hidden = false;
      $("bulk-confirm").disabled = res.matched === 0;
      $("bulk-confirm").focus();
    } catch (e) { notice((action === "requeue" ? "Requeue" : "Cancel") + " dry run failed: " + e.message, true); }
  }

  async function bulkConfirm() {
    const b = pendingBulk;
    $("bulk-preview").hidden = true;
    pendingBulk = null;
    if (!b) return;
    try {
      let after = 0, done = 0;
      do {
        const res = await api("POST", b.action, { filter: b.filter, after_seq: after });
        done += b.action === "requeue" ? res.requeued : res.cancelled;
        after = res.next_after_seq;
        notice((b.action === "requeue" ? "Requeued " : "Cancelled ") + done + (after ? "… (continuing)" : "."));
      } while (after);
      await refresh();
    } catch (e) { notice("Bulk " + b.action + " stopped: " + e.message, true); }
  }

  async function blockingCount() {
    const page = await api("GET", "messages?status=FAILED&blocks_group=true&limit=1000");
    const n = page.messages.length;
    $("blocking-count").textContent = n === 0 ? "no group is held" :
      (n + (page.next_after_seq ? "+" : "") + (n === 1 ? " dead letter holds its group" : " dead letters hold their group"));
  }

  // ---- One message ----

  function traceID(headers) {
    const tp = (headers || {}).traceparent || "";
    const parts = tp.split("-");
    return parts.length >= 4 && /^[0-9a-f]{32}$/.test(parts[1]) ? parts[1] : "";
  }

  function payloadText(m) {
    if (m.payload_base64 === undefined && m.payload !== null) return JSON.stringify(m.payload, null, 2);
    const b64 = m.payload_base64 || "";
    return m.payload_bytes + " bytes, base64: " + (b64.length > 4096 ? b64.slice(0, 4096) + "…" : b64);
  }

  function openMessage(m) {
    state.m = m.id;
    state.mt = m.tenant;
    writeHash();
    return loadDetail(false).catch((e) => notice(e.message, true));
  }

  // loadDetail shows the open message in a panel beside the lists, in view
  // wherever the page is scrolled, and moves the focus to it.
  async function loadDetail(keepFocus) {
    if (!state.m) return;
    const d = await api("GET", "messages/" + encodeURIComponent(state.m) + "?tenant=" + encodeURIComponent(state.mt));
    const m = d.message;
    const panel = $("detail");
    panel.hidden = false;
    document.body.classList.add("detail-open");
    $("detail-id").textContent = m.id;
    $("detail-link").href = messageLink(m);
    const acts = [];
    if (m.status === "FAILED") acts.push(button("Requeue", "requeue", { "data-id": m.id }, (e) => doOne("requeue", m, e.target)), " ");
    if (m.status === "FAILED" || m.status === "PENDING") acts.push(button("Cancel", "cancel", { "data-id": m.id }, (e) => doOne("cancel", m, e.target)));
    $("detail-actions").replaceChildren(...acts);
    const trace = traceID(m.headers);
    const fields = [["Status", m.status], ["Tenant", m.tenant], ["Topic", m.topic], ["Group", m.group || ""],
      ["Idempotency key", m.idempotency_key], ["Attempts", m.attempts + (m.max_attempts ? " of " + m.max_attempts : "")],
      ["Next attempt", m.status === "PENDING" ? when(m.next_attempt_at) : ""],
      ["Provider message ID", m.provider_message_id || ""], ["Trace ID", trace],
      ["Last error", m.error_code ? m.error_code + ": " + (m.error_message || "") : ""],
      ["Holds its group", m.blocks_group ? "yes: group " + m.group + " waits for it" : ""],
      ["Content type", m.content_type || "application/json"]].filter(([, v]) => v !== "");
    $("detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
    // The history: creation, each attempt, the receipts, the end.
    const events = [[m.created_at, "created (committed)"]];
    for (const a of d.attempts) {
      events.push([a.started_at, "attempt " + a.number + " started"]);
      events.push([a.finished_at, "attempt " + a.number + ": " + a.outcome + (a.error_code ? " (" + a.error_code + ")" : "")]);
    }
    if (m.sent_at) events.push([m.sent_at, "sent" + (m.provider_message_id ? " as " + m.provider_message_id : "")]);
    if (m.delivered_at) events.push([m.delivered_at, "delivery receipt"]);
    if (m.read_at) events.push([m.read_at, "read receipt"]);
    if (m.status === "FAILED" || m.status === "CANCELLED") events.push([m.updated_at, m.status === "FAILED" ? "dead-lettered" : "cancelled"]);
    events.sort((a, b) => new Date(a[0]) - new Date(b[0]));
    $("history").replaceChildren(...events.map(([t, what]) => el("li", {}, el("time", { dateTime: t }, when(t)), " ", what)));
    $("attempts").tBodies[0].replaceChildren(...d.attempts.map((a) => el("tr", {},
      el("td", { class: "n" }, a.number), el("td", {}, a.outcome),
      el("td", { class: "err" }, (a.error_code ? a.error_code + ": " + (a.error_message || "") : "") + (a.provider_response ? " " + JSON.stringify(a.provider_response) : "")),
      el("td", {}, when(a.started_at)), el("td", {}, when(a.finished_at)), el("td", {}, when(a.next_attempt_at)))));
    $("detail-payload").textContent = payloadText(m);
    $("detail-headers").replaceChildren(...Object.entries(m.headers || {}).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    if (!keepFocus) {
      panel.scrollIntoView({ block: "nearest" });
      panel.focus({ preventScroll: true });
    }
  }

  function closeDetail() {
    state.m = state.mt = "";
    writeHash();
    $("detail").hidden = true;
    document.body.classList.remove("detail-open");
  }

  // ---- Search ----

  async function search(q) {
    q = q.trim();
    if (!q) return;
    try {
      const r = await api("GET", "search?q=" + encodeURIComponent(q));
      $("search-results").hidden = false;
      $("search-summary").textContent = r.messages.length + " found for \u201c" + q + "\u201d" +
        (r.complete ? " (" + r.scanned + " messages searched)" : " in the first " + r.scanned + " messages (search stopped there)");
      $("found").tBodies[0].replaceChildren(...r.messages.map((m) => el("tr", { "data-id": m.id },
        el("td", {}, el("a", { href: messageLink(m) }, el("code", {}, m.id))), el("td", {}, m.tenant), el("td", {}, m.topic), el("td", {}, m.status),
        el("td", {}, m.idempotency_key), el("td", {}, m.provider_message_id || ""),
        el("td", {}, button("Open", "show", { "data-id": m.id }, () => openMessage(m))))));
      if (r.messages.length === 1) await openMessage(r.messages[0]);
    } catch (e) { notice("Search failed: " + e.message, true); }
  }

  // ---- Groups and processors ----

  async function loadGroups() {
    const r = await api("GET", "groups" + ($("groups-blocked").checked ? "?blocked=true" : ""));
    $("groups-summary").textContent = r.groups.filter((g) => g.blocked).length + " blocked" + (r.complete ? "" : " (in the first " + r.scanned + " messages)");
    const heldBy = (g) => g.held_by === "dead_letter" ? "dead letter " + g.dead_letter.id :
      g.held_by === "pause" ? "pause" : g.held_by === "retry" ? "retry at " + when(g.retry_at) :
        g.held_by === "in_flight" ? "head being published" : "";
    $("groups-table").tBodies[0].replaceChildren(...r.groups.map((g) => {
      const paused = pauses.find((p) => p.topic === g.topic && p.group === g.group && (p.tenant === g.tenant || p.tenant === ""));
      const acts = [];
      if (paused) acts.push(button("Resume", "resume", {}, () => resume({ topic: g.topic, group: g.group, tenant: paused.tenant })));
      else acts.push(button("Pause", "pause", { title: "for tenant " + JSON.stringify(g.tenant) }, () => pause({ topic: g.topic, group: g.group, tenant: g.tenant })),
        " ", button("Pause for all tenants", "pause-all", {}, () => pause({ topic: g.topic, group: g.group, tenant: "" })));
      const lead = g.dead_letter || g.head;
      if (lead) acts.push(" ", button(g.dead_letter ? "Open dead letter" : "Open head", "show", { "data-id": lead.id }, () => openMessage(lead)));
      return el("tr", { "data-group": g.group, "data-topic": g.topic, "data-tenant": g.tenant, class: g.blocked ? "blocked" : "" },
        el("td", {}, g.tenant), el("td", {}, g.topic), el("td", {}, g.group), el("td", { class: "n" }, g.waiting),
        el("td", {}, g.head ? el("a", { href: messageLink(g.head) }, el("code", {}, g.head.id)) : ""),
        el("td", { class: "held", "data-held-by": g.held_by }, heldBy(g)), el("td", { class: "actions" }, ...acts));
    }));
  }

  async function loadProcessors() {
    const r = await api("GET", "processors");
    $("processors-table").tBodies[0].replaceChildren(...(r.processors.length ? r.processors.map((p) => el("tr", { "data-processor": p.id },
      el("td", {}, el("code", {}, p.id)),
      el("td", { class: p.local && !p.healthy ? "bad" : "" }, p.local ? (p.healthy ? "healthy" : p.running ? "unhealthy: " + (p.error || "") : "stopped") : "another process (seen by its leases)"),
      el("td", { class: "n", "data-leases": p.leases }, p.leases), el("td", {}, when(p.oldest_lease_at)),
      el("td", { class: "n" }, p.local ? p.in_flight : ""), el("td", { class: "n" }, p.local ? p.claimed : ""),
      el("td", { class: "n" }, p.local ? p.sent : ""), el("td", { class: "n" }, p.local ? p.retried : ""),
      el("td", { class: "n" }, p.local ? p.dead_lettered : ""), el("td", {}, (p.unrouted || []).join(", ")))) :
      [el("tr", {}, el("td", { colSpan: 10 }, "No processor holds a lease, and none is registered with this console."))]));
  }

  // ---- Fleet ----

  // loadFleet shows the fleet's databases: who holds each lease, and for
  // the databases this instance serves, their processor and backlog.
  async function loadFleet() {
    if (!fleetOn) return;
    const f = await api("GET", "fleet?backlog=true");
    const members = f.members.length ? " of " + f.members.length + " (" + f.members.join(", ") + ")" : "";
    $("fleet-summary").textContent = "Instance " + f.instance + members + ": serving " + f.serving + " of its share of " + f.target +
      "; " + f.databases + " databases listed, " + f.unserved + " unserved. Lease period " + f.lease_ttl_seconds + " s.";
    $("fleet-errors").replaceChildren(...[f.list_error, f.lease_error].filter((e) => e).map((e) => el("li", {}, e)));
    const bad = new Set(["failing", "unhealthy", "unserved", "unknown"]);
    const expires = (s) => {
      if (!s.lease_expires_at) return "";
      const secs = (new Date(s.lease_expires_at) - new Date(f.now)) / 1000;
      return secs >= 0 ? "in " + secs.toFixed(1) + " s" : "expired";
    };
    $("fleet-table").tBodies[0].replaceChildren(...(f.shards.length ? f.shards.map((s) => {
      const b = s.backlog;
      return el("tr", { "data-database": s.database, "data-state": s.state, class: s.local ? "local" : "elsewhere" },
        el("td", {}, el("code", {}, s.database)),
        el("td", { class: bad.has(s.state) ? "bad" : "", "data-state": s.state }, s.state.replace("_", " ")),
        el("td", { "data-owner": s.owner || "" }, s.owner ? s.owner + (s.local ? " (this instance)" : "") : (s.last_owner ? "none (last " + s.last_owner + ")" : "none")),
        el("td", { class: "n" }, s.epoch || ""), el("td", {}, expires(s)),
        el("td", { class: "n", "data-pending": b && !b.error ? b.pending : "" }, b ? (b.error ? "?" : b.pending) : ""),
        el("td", { class: "n" }, b && !b.error ? age(b.oldest_due_age_seconds) : ""),
        el("td", { class: "n" }, s.local ? s.in_flight : ""), el("td", { class: "n", "data-sent": s.local ? s.sent : "" }, s.local ? s.sent : ""),
        el("td", { class: "n" }, s.local ? s.retried : ""), el("td", { class: "n" }, s.local ? s.dead_lettered : ""),
        el("td", { class: "n" }, s.local ? s.store_calls : ""),
        el("td", { class: "err" }, [s.error, b && b.error].filter((e) => e).join("; ")));
    }) : [el("tr", {}, el("td", { colSpan: 13 }, "No database is listed or leased yet."))]));
  }

  // ---- Refresh and wiring ----

  function syncForm() {
    $("f-topic").value = state.topic; $("f-tenant").value = state.tenant; $("f-group").value = state.group;
    $("f-error").value = state.error_code; $("f-after").value = state.created_after; $("f-before").value = state.created_before;
    $("only-blocking").checked = state.blocks;
  }

  function changed() {
    shown = 0;
    selected.clear();
    writeHash();
    renderStates();
    loadMessages(false).catch((e) => notice(e.message, true));
  }

  // refresh reloads every view. One runs at a time; a refresh asked for
  // while one runs (after an operator's action) runs once it ends, so what
  // the page shows is never older than the action.
  let running = null, queued = null;
  function refresh() {
    if (!running) {
      running = refreshNow().finally(() => { running = null; });
      return running;
    }
    if (!queued) queued = running.then(() => { queued = null; return refresh(); });
    return queued;
  }

  async function refreshNow() {
    try {
      await loadStats();
      await Promise.all([loadMessages(false), blockingCount(), loadActivity(), loadGroups(), loadProcessors(), loadFleet(),
        state.m ? loadDetail(true) : null]);
      document.body.dataset.loaded = "true";
      document.body.dataset.refreshes = String(++refreshes);
    } catch (e) {
      notice("Loading failed: " + e.message, true);
    }
  }

  $("refresh").addEventListener("click", refresh);
  $("detail-close").addEventListener("click", closeDetail);
  $("search-close").addEventListener("click", () => { $("search-results").hidden = true; });
  $("search-form").addEventListener("submit", (e) => { e.preventDefault(); search($("search").value); });
  $("filters").addEventListener("submit", (e) => {
    e.preventDefault();
    state.topic = $("f-topic").value.trim(); state.tenant = $("f-tenant").value.trim(); state.group = $("f-group").value.trim();
    state.error_code = $("f-error").value.trim(); state.created_after = $("f-after").value; state.created_before = $("f-before").value;
    changed();
  });
  $("f-clear").addEventListener("click", () => {
    for (const k of filterKeys) state[k] = "";
    state.blocks = false;
    syncForm();
    changed();
  });
  $("only-blocking").addEventListener("change", () => {
    state.blocks = $("only-blocking").checked;
    if (state.blocks) state.status = "FAILED";
    changed();
  });
  $("select-all").addEventListener("change", () => {
    for (const b of document.querySelectorAll("#dead input.select")) {
      b.checked = $("select-all").checked;
      b.dispatchEvent(new Event("change"));
    }
  });
  $("bulk-requeue-selected").addEventListener("click", () => doSelected("requeue"));
  $("bulk-cancel-selected").addEventListener("click", () => doSelected("cancel"));
  $("bulk-requeue").addEventListener("click", () => bulk("requeue"));
  $("bulk-cancel").addEventListener("click", () => bulk("cancel"));
  $("bulk-confirm").addEventListener("click", bulkConfirm);
  $("bulk-back").addEventListener("click", () => { pendingBulk = null; $("bulk-preview").hidden = true; });
  $("more").addEventListener("click", () => loadMessages(true).catch((e) => notice(e.message, true)));
  $("groups-blocked").addEventListener("change", () => loadGroups().catch((e) => notice(e.message, true)));
  $("pause-tenant").addEventListener("change", () => loadStats().catch((e) => notice(e.message, true)));
  for (const b of document.querySelectorAll("nav button[data-goto]")) {
    b.addEventListener("click", () => { const s = $(b.dataset.goto); s.scrollIntoView(); s.querySelector("h2").focus(); });
  }
  for (const h of document.querySelectorAll("section > h2")) h.tabIndex = -1;
  document.addEventListener("keydown", (e) => {
    const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName);
    if (e.key === "Escape" && state.m) closeDetail();
    else if (e.key === "/" && !typing) { e.preventDefault(); $("search").focus(); }
  });
  window.addEventListener("hashchange", () => {
    state = readHash();
    syncForm();
    changed();
    if (state.m) loadDetail(false).catch((e) => notice(e.message, true));
    else { $("detail").hidden = true; document.body.classList.remove("detail-open"); }
  });
  syncForm();
  refresh();
  setInterval(refresh, 15000);
})();
