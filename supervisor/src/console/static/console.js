// The stsd console's only script: the Approvals page follows the daemon (server-sent
// events), the preview's chip recomputes as you type. Text from the daemon is set with
// textContent, never parsed as HTML.
"use strict";

const LABELS = { L0: "Verified", L1: "Safe", L2: "Low", L3: "Moderate", L4: "High", L5: "Critical" };
const FLOORS = {
  non_loopback_no_auth_write_capability: "no-auth-write",
  non_loopback_no_auth_trust_unknown: "no-auth-unknown",
  privileged_oauth_scope: "privileged-scope",
};

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function chip(level, floor) {
  const text = level + " · " + (LABELS[level] || "Unknown") + (floor ? " (" + (FLOORS[floor] || floor) + ")" : "");
  return el("span", { class: "chip " + String(level).toLowerCase() }, text);
}

function renderPending(root, pending) {
  const csrf = root.dataset.csrf;
  const mayApprove = root.dataset.mayApprove === "true";
  root.replaceChildren();
  if (!pending.length) {
    root.append(el("p", { id: "none" }, "No call is waiting."));
    return;
  }
  for (const p of pending) {
    const id = String(p.id);
    const who = p.principal ? p.principal : (p.peerUid !== null && p.peerUid !== undefined ? "uid " + p.peerUid : "-");
    const card = el("section", { class: "card call", "aria-labelledby": "call-" + id },
      el("h2", { id: "call-" + id }, p.tool + " ", el("span", { class: "muted" }, "#" + id)),
      el("p", {}, "From " + who + ", waiting " + Math.round(p.ageMs / 1000) + " s"),
      el("p", { class: "prompt" }, p.prompt || ""),
      el("pre", { tabindex: "0" }, JSON.stringify(p.arguments, null, 2)));
    if (mayApprove) {
      const form = el("form", { method: "post", action: "/ui/approvals/" + id },
        el("input", { type: "hidden", name: "csrf", value: csrf }),
        el("label", { for: "reason-" + id }, "Reason (the model sees it)"),
        el("input", { id: "reason-" + id, name: "reason" }),
        el("button", { type: "submit", name: "decision", value: "approve" }, "Approve"),
        el("button", { type: "submit", name: "decision", value: "deny" }, "Deny"));
      card.append(form);
    }
    root.append(card);
  }
}

function followApprovals() {
  const root = document.getElementById("pending");
  if (!root || !window.EventSource) return;
  const events = new EventSource("/ui/events/approvals");
  events.addEventListener("approvals", (e) => {
    // A person typing a reason keeps the form they are typing in.
    if (root.contains(document.activeElement) && document.activeElement.name === "reason") return;
    const pending = JSON.parse(e.data);
    // Only a change in who waits redraws (a form being filled in stays as it is).
    const ids = pending.map((p) => String(p.id)).join(",");
    if (ids === root.dataset.ids) return;
    root.dataset.ids = ids;
    renderPending(root, pending);
  });
}

function livePreview() {
  const form = document.getElementById("preview");
  if (!form) return;
  const out = document.getElementById("chip");
  const axes = document.getElementById("axes");
  let seq = 0;
  const update = async () => {
    const mine = ++seq;
    const q = new URLSearchParams(new FormData(form));
    try {
      const r = await fetch("/ui/api/preview?" + q.toString(), { credentials: "same-origin" });
      const v = await r.json();
      if (mine !== seq) return;
      if (v.level) {
        out.replaceChildren(chip(v.level, v.floor));
        axes.textContent = "transport " + v.transport + ", auth " + v.auth + ", trust " + v.trust + ", doc " + v.doc;
      } else {
        out.replaceChildren(document.createTextNode(v.error || "-"));
        axes.textContent = "";
      }
    } catch (e) { /* the next keystroke tries again */ }
  };
  form.addEventListener("input", update);
  form.addEventListener("change", update);
}

function followAudit() {
  const table = document.getElementById("audit");
  if (!table || !window.EventSource) return;
  const body = table.tBodies[0];
  const q = table.dataset.query + "&after=" + encodeURIComponent(table.dataset.after);
  const events = new EventSource("/ui/events/audit?" + q);
  events.addEventListener("audit", (e) => {
    for (const r of JSON.parse(e.data)) {
      const error = r.error ? (r.error.code || r.error) : "";
      const row = el("tr", { class: "fresh" },
        el("td", {}, r.time || ""),
        el("td", {}, r.event || "call"),
        el("td", {}, r.name || r.tool || r.method || ""),
        el("td", {}, r.principal ? String(r.principal) : (r.peerUid !== null && r.peerUid !== undefined ? "uid " + r.peerUid : "")),
        el("td", {}, String(r.outcome || r.decision || ""), error ? " " : "", error ? el("span", { class: "muted" }, String(error)) : ""));
      body.prepend(row);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => { followApprovals(); livePreview(); followAudit(); });
