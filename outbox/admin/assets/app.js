"use strict";
// The outboxkit dashboard: plain DOM, no dependencies. Every URL is
// relative to the page, so the handler can be mounted under any prefix.
(function () {
  const statuses = ["PENDING", "PROCESSING", "SENT", "DELIVERED", "FAILED", "CANCELLED"];
  let nextAfterSeq = 0;
  // shown is how many dead letters the list shows: a refresh reloads as
  // many, so paging survives it. openMessage is the message whose detail
  // is open: a refresh reloads it.
  let shown = 0;
  let openMessage = null;
  let refreshes = 0;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return e;
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

  // A JSON payload as JSON; any other as its length and the start of its
  // base64 (binary bytes are never put on the page as text).
  function payloadText(m) {
    if (m.payload_base64 === undefined && m.payload !== null) return JSON.stringify(m.payload);
    const b64 = m.payload_base64 || "";
    return m.payload_bytes + " bytes, base64: " + (b64.length > 512 ? b64.slice(0, 512) + "…" : b64);
  }

  function notice(text, isError) {
    const n = document.getElementById("notice");
    n.textContent = text;
    n.className = isError ? "error" : "";
  }

  async function loadStats() {
    const s = await api("GET", "stats");
    const paused = new Map();
    for (const p of s.pauses) {
      const k = p.topic;
      paused.set(k, (paused.get(k) || []).concat([p.group ? "group " + p.group : "all", p.tenant ? "(" + p.tenant + ")" : ""].join(" ").trim()));
    }
    const body = document.querySelector("#stats tbody");
    body.replaceChildren(...s.topics.map((t) => el("tr", { "data-topic": t.topic },
      el("td", {}, t.topic),
      ...statuses.map((st) => el("td", { class: "n", "data-status": st }, t.counts[st] || 0)),
      el("td", { class: "n", "data-age": t.oldest_pending_age_seconds }, age(t.oldest_pending_age_seconds)),
      el("td", { class: "paused" }, (paused.get(t.topic) || []).join(", ")))));
    document.getElementById("updated").textContent = "updated " + when(s.now);
    loadStorage(s.storage);
  }

  // loadStorage shows the store's storage report, when it has one: dead
  // row versions that keep growing, or a cleanup horizon held by a
  // transaction left open, slow every claim.
  function loadStorage(st) {
    document.getElementById("storage").hidden = !st;
    if (!st) return;
    document.querySelector("#storage-tables tbody").replaceChildren(...st.tables.map((t) => el("tr", { "data-table": t.name },
      el("td", {}, el("code", {}, t.name)), el("td", { class: "n", "data-live": t.live_rows }, t.live_rows),
      el("td", { class: "n", "data-dead": t.dead_rows }, t.dead_rows), el("td", {}, t.last_cleanup ? when(t.last_cleanup) : "never"))));
    const h = st.horizon;
    document.getElementById("horizon").textContent = h.holder ?
      "Cleanup horizon: " + h.age_transactions + " transactions old, held by " + h.holder + "." :
      "Cleanup horizon: nothing holds it back.";
  }

  // loadDead loads the dead letters: the first page again, as many as
  // shown, or (append) the next page. Loads run one after another, so an
  // auto-refresh never overwrites a page the operator just added.
  let deadQueue = Promise.resolve();
  function loadDead(append) {
    const run = deadQueue.then(() => loadDeadNow(append));
    deadQueue = run.catch(() => {});
    return run;
  }

  async function loadDeadNow(append) {
    const onlyBlocking = document.getElementById("only-blocking").checked;
    const limit = append ? 50 : Math.min(1000, Math.max(50, shown));
    const q = "messages?status=FAILED&limit=" + limit + (onlyBlocking ? "&blocks_group=true" : "") +
      (append && nextAfterSeq ? "&after_seq=" + nextAfterSeq : "");
    const page = await api("GET", q);
    const body = document.querySelector("#dead tbody");
    const rows = page.messages.map((m) => {
      const requeue = el("button", { type: "button", class: "requeue", "data-id": m.id }, "Requeue");
      requeue.addEventListener("click", () => doRequeue(m, requeue));
      const show = el("button", { type: "button", class: "show", "data-id": m.id }, "Attempts");
      show.addEventListener("click", () => loadDetail(m));
      // Cancelling a dead letter that holds its group releases the group
      // without sending the message again.
      const cancel = el("button", { type: "button", class: "cancel", "data-id": m.id }, "Cancel");
      cancel.addEventListener("click", () => doCancel(m, cancel));
      return el("tr", { "data-id": m.id },
        el("td", {}, el("code", {}, m.id)), el("td", {}, m.tenant), el("td", {}, m.topic), el("td", {}, m.group || ""),
        el("td", { class: m.blocks_group ? "blocking" : "" }, m.blocks_group ? "holds " + m.group : ""),
        el("td", { class: "n" }, m.attempts),
        el("td", { class: "err" }, m.error_code ? m.error_code + ": " + (m.error_message || "") : ""),
        el("td", {}, when(m.updated_at)), el("td", {}, requeue, " ", cancel, " ", show));
    });
    if (append) body.append(...rows); else body.replaceChildren(...rows);
    shown = body.rows.length;
    nextAfterSeq = page.next_after_seq;
    document.getElementById("more").hidden = !nextAfterSeq;
  }

  async function doRequeue(m, button) {
    button.disabled = true;
    try {
      await api("POST", "messages/" + encodeURIComponent(m.id) + "/requeue?tenant=" + encodeURIComponent(m.tenant));
      notice("Requeued " + m.id + ": it is PENDING again.");
      await refresh();
    } catch (e) {
      notice("Requeue of " + m.id + " failed: " + e.message, true);
      button.disabled = false;
    }
  }

  async function doCancel(m, button) {
    const what = m.blocks_group ? " It will not be sent, and group " + m.group + " moves on to its next message." : " It will not be sent.";
    if (!window.confirm("Cancel " + m.id + "?" + what)) return;
    button.disabled = true;
    try {
      await api("POST", "messages/" + encodeURIComponent(m.id) + "/cancel?tenant=" + encodeURIComponent(m.tenant));
      notice("Cancelled " + m.id + (m.blocks_group ? ": group " + m.group + " is released." : "."));
      await refresh();
    } catch (e) {
      notice("Cancel of " + m.id + " failed: " + e.message, true);
      button.disabled = false;
    }
  }

  // blockingCount shows how many dead letters hold their group, whatever
  // the filter.
  async function blockingCount() {
    const page = await api("GET", "messages?status=FAILED&blocks_group=true&limit=1000");
    const n = page.messages.length;
    document.getElementById("blocking-count").textContent = n === 0 ? "no group is held" :
      (n + (page.next_after_seq ? "+" : "") + (n === 1 ? " dead letter holds its group" : " dead letters hold their group"));
  }

  // loadDetail opens a message's detail in a panel beside the lists, in
  // view wherever the page is scrolled, and moves the focus to it.
  async function loadDetail(m, keepFocus) {
    const d = await api("GET", "messages/" + encodeURIComponent(m.id) + "?tenant=" + encodeURIComponent(m.tenant));
    openMessage = m;
    const panel = document.getElementById("detail");
    panel.hidden = false;
    document.body.classList.add("detail-open");
    if (!keepFocus) {
      panel.scrollIntoView({ block: "nearest" });
      panel.focus({ preventScroll: true });
    }
    document.getElementById("detail-id").textContent = d.message.id;
    const fields = [["Status", d.message.status], ["Tenant", d.message.tenant], ["Topic", d.message.topic],
      ["Group", d.message.group || ""], ["Attempts", d.message.attempts], ["Created", when(d.message.created_at)],
      ["Last error", d.message.error_code ? d.message.error_code + ": " + (d.message.error_message || "") : ""],
      ["Content type", d.message.content_type || "application/json"], ["Payload", payloadText(d.message)]];
    document.getElementById("detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    document.querySelector("#attempts tbody").replaceChildren(...d.attempts.map((a) => el("tr", {},
      el("td", { class: "n" }, a.number), el("td", {}, a.outcome),
      el("td", { class: "err" }, a.error_code ? a.error_code + ": " + (a.error_message || "") : ""),
      el("td", {}, when(a.started_at)), el("td", {}, when(a.finished_at)), el("td", {}, when(a.next_attempt_at)))));
  }

  function closeDetail() {
    openMessage = null;
    document.getElementById("detail").hidden = true;
    document.body.classList.remove("detail-open");
  }

  async function refresh() {
    try {
      await Promise.all([loadStats(), loadDead(false), blockingCount(),
        openMessage ? loadDetail(openMessage, true) : null]);
      document.body.dataset.loaded = "true";
      document.body.dataset.refreshes = String(++refreshes);
    } catch (e) {
      notice("Loading failed: " + e.message, true);
    }
  }

  document.getElementById("refresh").addEventListener("click", refresh);
  document.getElementById("detail-close").addEventListener("click", closeDetail);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && openMessage) closeDetail(); });
  document.getElementById("only-blocking").addEventListener("change", () => loadDead(false).catch((e) => notice(e.message, true)));
  document.getElementById("more").addEventListener("click", () => loadDead(true).catch((e) => notice(e.message, true)));
  refresh();
  setInterval(refresh, 15000);
})();
