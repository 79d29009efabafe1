// intentstream console: live figures without a reload (polling JSON every 2 s). No inline
// script anywhere (the pages' Content-Security-Policy forbids it); text is set with
// textContent, never innerHTML, so no value from Redis becomes markup.
"use strict";

const POLL_MS = 2000;

function rate(value) {
  return value === null || value === undefined ? "…" : value.toFixed(1);
}

function setText(id, text) {
  const el = document.getElementById(id);
  if (el) el.textContent = String(text);
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = String(cell);
    tr.appendChild(td);
  }
  return tr;
}

function items(id, texts) {
  const ul = document.getElementById(id);
  if (!ul) return;
  ul.replaceChildren(...texts.map((t) => {
    const li = document.createElement("li");
    li.textContent = t;
    return li;
  }));
}

async function getJSON(url) {
  const response = await fetch(url, {credentials: "same-origin", headers: {accept: "application/json"}});
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function showOverview(f) {
  for (const kind of ["events", "scores", "actions"]) setText(`rate-${kind}`, rate(f.rates[kind]));
  setText("total-scores", f.totals.scores);
  setText("total-actions", f.totals.actions);
  setText("model-current", f.model.current || "none");
  setText("model-shadow", f.model.shadow || "none");
  setText("rules-version", f.rules_version);
  const body = document.getElementById("partitions");
  body.replaceChildren(...f.partitions.map((p) => row([
    p.partition, p.lag === null ? "?" : p.lag, p.holder || "(free)", p.dead_letters])));
  const workers = f.workers.map((w) => `${w.name}: ${w.partitions} partition(s)`);
  items("workers", workers.length ? workers : ["none live"]);
  const dead = Object.entries(f.dead_letters).map(([reason, n]) => `${reason}: ${n}`);
  items("dead-letters", dead.length ? dead : ["none"]);
  setText("updated", `updated ${new Date(f.sampled_at * 1000).toISOString()}`);
}

function actionRow(a) {
  const link = document.createElement("a");
  link.href = `/users?user_id=${encodeURIComponent(a.user_id)}`;
  link.textContent = a.user_id;
  const reasons = a.reasons.map((r) => `${r.type} ${r.delta >= 0 ? "+" : ""}${r.delta.toFixed(3)}`);
  const delivery = a.delivery.map((d) => `${d.endpoint}: ${d.status}`);
  const tr = row([a.id, a.rule, link, a.score, a.model, reasons.join(", "), delivery.join(", ")]);
  tr.dataset.id = a.id;
  return tr;
}

async function pollActions() {
  const body = document.getElementById("actions");
  const newest = body.querySelector("tr");
  const after = newest ? newest.dataset.id : "";
  const data = await getJSON(`/api/actions${after ? `?after=${encodeURIComponent(after)}` : ""}`);
  if (!data.actions.length) return;
  const none = document.getElementById("no-actions");
  if (none) none.remove();
  body.prepend(...data.actions.map(actionRow));
  while (body.rows.length > 200) body.deleteRow(-1);
}

function every(task) {
  const tick = async () => {
    try {
      await task();
    } catch (err) {
      // a failed poll (a restart, a lost network) is said on the page, then tried again
      setText("updated", `refresh failed: ${err.message}`);
    }
    setTimeout(tick, POLL_MS);
  };
  setTimeout(tick, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "overview") every(async () => showOverview(await getJSON("/api/overview")));
  if (page === "actions") every(pollActions);
});
