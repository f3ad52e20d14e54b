// The page of `tessera serve`: talks only to the JSON API (docs/API.md).
// Every text from the repository is put in the page with textContent
// (file names are data, never markup).
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const PAGE = 100;         // backups per page
const TREE_PAGE = 1000;   // directory entries per page
const $ = (id) => document.getElementById(id);
const state = { backupsOffset: 0, backupsTotal: 0, selected: new Set(), browse: { id: null, path: "/", hex: null, offset: 0 }, picked: new Set(), diffOffset: 0, readOnly: true };

// A path whose bytes are not UTF-8 is shown with U+FFFD and named to the
// API by its bytes in hex (`path_hex`), as the listing gives them.
const notText = (path) => path.includes("\uFFFD");
const where = (path, hex) => (hex ? { path_hex: hex } : { path });
function hexBytes(hex) {
  const b = new Uint8Array(hex.length / 2);
  for (let i = 0; i < b.length; i++) b[i] = parseInt(hex.substr(2 * i, 2), 16);
  return b;
}
const bytesHex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

async function api(path, params) {
  const q = new URLSearchParams(params || {});
  const res = await fetch(`/api/${path}${q.toString() ? "?" + q : ""}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
  const body = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
  if (!res.ok) { const e = new Error(body.error || res.statusText); e.status = res.status; throw e; }
  return body;
}

// POST `body` (JSON) to the API; the answer's JSON.
async function post(path, body, params) {
  const q = new URLSearchParams(params || {});
  const res = await fetch(`/api/${path}${q.toString() ? "?" + q : ""}`, {
    method: "POST", headers: { Authorization: `Bearer ${TOKEN}`, "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
  });
  const answer = await res.json().catch(() => ({ error: `${res.status} ${res.statusText}` }));
  if (!res.ok) { const e = new Error(answer.error || res.statusText); e.status = res.status; throw e; }
  return answer;
}

function fileUrl(id, path, format, hex) {
  const q = { ...where(path, hex), token: TOKEN };
  if (format) q.format = format;
  return `/api/backups/${id}/file?` + new URLSearchParams(q);
}

function human(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0, v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${n} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}
const ratio = (r) => (r == null ? "–" : `${r.toFixed(2)}×`);
const when = (secs) => new Date(secs * 1000).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function showError(e) {
  const p = $("error");
  if (!e) { p.hidden = true; return; }
  p.textContent = e.message || String(e);
  p.hidden = false;
}

function show(view) {
  for (const s of document.querySelectorAll("main > section")) s.hidden = s.id !== `view-${view}`;
  for (const b of document.querySelectorAll("header nav button")) {
    if (b.dataset.view === view) b.setAttribute("aria-current", "page"); else b.removeAttribute("aria-current");
  }
  showError(null);
  for (const t of Object.values(tables)) t.schedule();
  if (view === "stats") loadStats().catch(showError);
  if (view === "health") loadHealth().catch(showError);
  if (view === "reports") loadReports().catch(showError);
  if (view === "browse" && state.browse.id == null) openLatest().catch(showError);
}

// ---- Rows in view ----------------------------------------------------------

// A page of rows (100 backups, 1000 entries of a directory or changes of a
// diff) is drawn only where it is seen: the rows in the window and MARGIN
// more on each side; two spacer rows stand for the others, at the rows'
// measured height, so the scroll bar is that of the whole page. A row is
// made when it comes into range and kept while it stays there (a focused
// checkbox or button stays the same element). Keyboard: Tab reaches every
// row (a focused row is scrolled into view, and the rows past it drawn);
// Up/Down (and Page Up/Down, Ctrl+Home/End) move the focus to the same
// column of another row, drawing it first.
const MARGIN = 20;          // rows drawn beyond the window on each side
const VIRTUAL_FROM = 60;    // a page of fewer rows is drawn whole

class VirtualRows {
  constructor(table) {
    this.body = table.tBodies[0];
    this.columns = table.tHead.rows[0].cells.length;
    this.items = [];
    this.make = null;
    this.rows = new Map();      // index -> row element, those in the document
    this.range = [0, 0];
    this.rowHeight = 0;         // measured: the drawn rows' mean height
    this.pending = false;
    this.top = this.spacer();
    this.bottom = this.spacer();
    const later = () => this.schedule();
    window.addEventListener("scroll", later, { passive: true });
    window.addEventListener("resize", later);
    this.body.addEventListener("keydown", (ev) => this.key(ev));
  }

  spacer() {
    return el("tr", { class: "spacer", "aria-hidden": "true" }, el("td", { colspan: this.columns }));
  }

  // Shows `items`, each row made by `make(item)`.
  show(items, make) {
    this.items = items;
    this.make = make;
    this.rows.clear();
    this.range = [0, 0];
    if (items.length < VIRTUAL_FROM) {
      this.body.replaceChildren(...items.map((_, i) => this.row(i)));
      this.range = [0, items.length];
      return;
    }
    this.body.replaceChildren(this.top, this.bottom);
    // Twice: the first draw measures the rows, the second fills the window.
    this.draw();
    this.draw();
  }

  clear() { this.show([], null); }

  // The number of rows in the document (spacers left out).
  get drawn() { return this.rows.size; }

  row(i) {
    let r = this.rows.get(i);
    if (!r) {
      r = this.make(this.items[i]);
      r.dataset.index = i;
      this.rows.set(i, r);
    }
    return r;
  }

  schedule() {
    if (this.pending || this.items.length < VIRTUAL_FROM) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  // The rows from the window's top and bottom, MARGIN more on each side.
  wanted() {
    const n = this.items.length, h = this.rowHeight || 32;
    // Where the rows start, in the window's coordinates (the top spacer's top).
    const start = this.body.getBoundingClientRect().top;
    let first = Math.floor(-start / h) - MARGIN, last = Math.ceil((window.innerHeight - start) / h) + MARGIN;
    first = Math.max(0, Math.min(first, n - 1));
    last = Math.max(first + Math.min(n - first, MARGIN), Math.min(last, n));
    return [first, last];
  }

  draw() {
    const n = this.items.length;
    if (n < VIRTUAL_FROM) return;
    const [first, last] = this.wanted();
    if (first === this.range[0] && last === this.range[1]) return;
    for (const [i, r] of this.rows) {
      if (i < first || i >= last) { r.remove(); this.rows.delete(i); }
    }
    // The rows kept stay where they are (a focused one keeps the focus);
    // new ones go before and after them.
    let prev = this.top;
    for (let i = first; i < last; i++) {
      const r = this.row(i);
      if (prev.nextSibling !== r) prev.after(r);
      prev = r;
    }
    this.range = [first, last];
    const a = this.rows.get(first).getBoundingClientRect(), b = this.rows.get(last - 1).getBoundingClientRect();
    if (b.bottom > a.top) this.rowHeight = (b.bottom - a.top) / (last - first);
    const h = this.rowHeight || 32;
    this.top.firstChild.style.height = `${first * h}px`;
    this.bottom.firstChild.style.height = `${(n - last) * h}px`;
    this.top.hidden = first === 0;
    this.bottom.hidden = last === n;
  }

  // Up/Down, Page Up/Down, Ctrl+Home/End in a row: the focus to the same
  // column of another row.
  key(ev) {
    const tr = ev.target.closest("tr");
    if (!tr || tr.dataset.index == null || ev.altKey || ev.metaKey) return;
    const i = Number(tr.dataset.index), n = this.items.length;
    const page = Math.max(1, Math.floor(window.innerHeight / (this.rowHeight || 32)) - 1);
    const to = { ArrowDown: i + 1, ArrowUp: i - 1, PageDown: i + page, PageUp: i - page }[ev.key]
      ?? (ev.ctrlKey && ev.key === "Home" ? 0 : ev.ctrlKey && ev.key === "End" ? n - 1 : null);
    if (to == null) return;
    ev.preventDefault();
    const cell = ev.target.closest("td");
    this.focusRow(Math.max(0, Math.min(n - 1, to)), cell ? cell.cellIndex : 0);
  }

  focusRow(i, column) {
    if (!this.rows.has(i)) {
      // Bring row i to the middle of the window, then draw.
      const h = this.rowHeight || 32;
      window.scrollTo(0, window.scrollY + this.body.getBoundingClientRect().top + i * h - window.innerHeight / 2);
      this.draw();
    }
    const r = this.rows.get(i);
    if (!r) return;
    const pick = (node) => node && node.querySelector("button, a[href], input");
    const target = pick(r.cells[column]) || pick(r);
    if (target) target.focus();
  }
}

const tables = {};

// ---- Backups -------------------------------------------------------------

async function loadBackups() {
  const page = await api("backups", { offset: state.backupsOffset, limit: PAGE, order: "desc" });
  state.backupsTotal = page.total;
  const first = page.total ? page.offset + 1 : 0;
  $("backups-range").textContent = `${first}–${page.offset + page.items.length} of ${page.total} (newest first)`;
  $("backups-prev").disabled = page.offset === 0;
  $("backups-next").disabled = page.offset + page.items.length >= page.total;
  tables.backups.show(page.items, backupRow);
  drawChart(page.items.filter((b) => !b.damaged).slice().reverse());
  if (page.items.length && !$("diff-from").value) {
    const ids = page.items.map((b) => b.id);
    $("diff-to").value = ids[0];
    $("diff-from").value = ids[1] ?? ids[0];
  }
}

function backupRow(b) {
  if (b.damaged) return el("tr", {}, el("td"), el("td", {}, b.id), el("td", { colspan: 7, class: "error" }, `damaged: ${b.damaged}`));
  const box = el("input", { type: "checkbox", "aria-label": `select backup ${b.id}` });
  box.checked = state.selected.has(b.id);
  const row = el("tr", { class: box.checked ? "selected" : "" });
  box.addEventListener("change", () => {
    if (box.checked) state.selected.add(b.id); else state.selected.delete(b.id);
    row.className = box.checked ? "selected" : "";
    $("space-selected").disabled = state.selected.size === 0;
    $("forget-selected").disabled = state.selected.size === 0;
    $("forget-confirm").hidden = true;
  });
  const where = b.paths ? b.paths.join(", ") : `(${b.source})`;
  // The measure of the chart, of New data and of Dedup: the backup's bytes
  // (a tree backup's files and its catalog); the files' alone in the title.
  const size = b.logical_bytes;
  const sizeTitle = b.file_bytes != null ? `files ${human(b.file_bytes)} + catalog ${human(b.logical_bytes - b.file_bytes)}` : "the stream's bytes";
  const browse = b.paths
    ? el("button", { type: "button", class: "browse", onclick: () => openBackup(b.id, "/") }, "Browse")
    : el("a", { href: fileUrl(b.id, "/"), download: "" }, "Download");
  row.append(el("td", {}, box), el("td", {}, b.id), el("td", {}, when(b.time)), el("td", {}, b.host || "–"),
    el("td", { class: "paths" }, where), el("td", { class: "num", title: sizeTitle }, human(size)),
    el("td", { class: "num" }, human(b.new_bytes)), el("td", { class: "num" }, ratio(b.dedup_ratio)), el("td", {}, browse));
  return row;
}

// A bar chart of each backup's size, its new data drawn over it (SVG).
function drawChart(items) {
  const svg = $("chart");
  const NS = "http://www.w3.org/2000/svg";
  const W = svg.clientWidth || 800, H = svg.clientHeight || 180, pad = 18;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  // The table's measure: the backup's bytes (files and catalog).
  const size = (b) => b.logical_bytes;
  const max = Math.max(1, ...items.map(size));
  const step = items.length ? (W - 2 * pad) / items.length : 0;
  const bw = Math.max(1, step * 0.8);
  const shapes = [];
  const y = (v) => H - pad - (v / max) * (H - 2 * pad);
  items.forEach((b, i) => {
    const x = pad + i * step;
    for (const [cls, v] of [["size", size(b)], ["new", b.new_bytes]]) {
      const r = document.createElementNS(NS, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", x.toFixed(1)); r.setAttribute("width", bw.toFixed(1));
      r.setAttribute("y", y(v).toFixed(1)); r.setAttribute("height", Math.max(0, H - pad - y(v)).toFixed(1));
      const t = document.createElementNS(NS, "title");
      t.textContent = `backup ${b.id}: ${cls === "size" ? "size" : "new data"} ${human(v)}`;
      r.append(t);
      shapes.push(r);
    }
  });
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", pad); label.setAttribute("y", 12);
  label.textContent = `max ${human(max)}`;
  shapes.push(label);
  svg.replaceChildren(...shapes);
}

// Deleting the selected backups: what it frees first, then a confirmation.
async function askForget() {
  const ids = [...state.selected].sort((a, b) => a - b);
  $("forget-result").textContent = "";
  try {
    const r = await post("forget", { ids, dry_run: true });
    const frees = r.bytes_freed == null
      ? "In this repository's container layout the space is freed by a later `tessera gc` (what it frees depends on what the kept backups share)."
      : `This frees ${human(r.bytes_freed)} at once.`;
    $("forget-text").textContent = `Delete backup${ids.length > 1 ? "s" : ""} ${ids.join(", ")}? ${frees} This cannot be undone.`;
    $("forget-confirm").hidden = false;
    $("forget-yes").focus();
  } catch (e) {
    $("forget-result").textContent = `Error: ${e.message}`;
  }
}

async function doForget() {
  const ids = [...state.selected].sort((a, b) => a - b);
  $("forget-confirm").hidden = true;
  $("forget-result").textContent = "deleting…";
  try {
    const r = await post("forget", { ids });
    const freed = r.bytes_freed == null ? (r.note || "") : `freed ${human(r.bytes_freed)}`;
    $("forget-result").textContent = `Deleted backup${r.deleted.length > 1 ? "s" : ""} ${r.deleted.join(", ")}; ${freed}`;
    state.selected.clear();
    $("space-selected").disabled = true;
    $("forget-selected").disabled = true;
    await loadBackups();
  } catch (e) {
    $("forget-result").textContent = `Error: ${e.message}`;
  }
}

async function estimate(ids, out) {
  out.textContent = "…";
  try {
    const r = await api("space", { ids: ids.join(",") });
    out.textContent = `Deleting backups ${r.ids.join(", ")} would free ${human(r.freed_bytes)}.`;
  } catch (e) {
    out.textContent = e.status === 501 ? `Not available for this repository: ${e.message}` : `Error: ${e.message}`;
  }
}

// ---- Browse --------------------------------------------------------------

async function openLatest() {
  const page = await api("backups", { limit: 50, order: "desc" });
  const tree = page.items.find((b) => b.paths);
  if (tree) await openBackup(tree.id, "/");
  else $("tree-range").textContent = "no tree backup in the repository";
}

async function openBackup(id, path, offset = 0, hex = null) {
  if (state.browse.id !== id) state.picked.clear();
  state.browse = { id, path, hex, offset };
  pickedChanged();
  show("browse");
  $("browse-id").textContent = id;
  $("browse-backup").value = id;
  $("path-input").value = path;
  $("tar-link").href = fileUrl(id, path, null, hex);
  $("zip-link").href = fileUrl(id, path, "zip", hex);
  drawCrumbs(id, path, hex);
  const params = { limit: TREE_PAGE, offset };
  if (hex) params.path_hex = hex;
  else if (path !== "/") params.path = path;
  try {
    const page = await api(`backups/${id}/tree`, params);
    $("tree-range").textContent = page.total ? `${page.offset + 1}–${page.offset + page.items.length} of ${page.total} entries` : "empty";
    $("tree-prev").disabled = page.offset === 0;
    $("tree-next").disabled = page.offset + page.items.length >= page.total;
    tables.browse.show(page.items, (e) => entryRow(id, e));
  } catch (e) {
    tables.browse.clear();
    showError(e);
  }
}

function entryRow(id, e) {
  const name = e.path.split("/").pop() || e.path;
  // At the top, the paths given to the backup are shown whole.
  const shown = state.browse.path === "/" ? e.path : name;
  const hex = notText(e.path) ? e.path_hex : null;
  const nameCell = e.kind === "dir"
    ? el("button", { type: "button", class: "link dir", onclick: () => openBackup(id, e.path, 0, hex) }, `${shown}/`)
    : el("span", {}, shown);
  let down = "";
  if (e.kind === "file" || e.kind === "hardlink") down = el("a", { href: fileUrl(id, e.path, null, hex), download: name, class: "download" }, "Download");
  else if (e.kind === "dir") down = el("span", {}, el("a", { href: fileUrl(id, e.path, null, hex), download: `${name}.tar` }, "tar"), " ",
    el("a", { href: fileUrl(id, e.path, "zip", hex), download: `${name}.zip`, class: "zip" }, "zip"));
  else if (e.target) down = el("span", { class: "muted" }, `→ ${e.target}`);
  const box = el("input", { type: "checkbox", class: "pick", "aria-label": `select ${e.path} for restore` });
  // Picked paths: as text, or `hex:` and their bytes.
  const key = hex ? `hex:${hex}` : e.path;
  box.checked = state.picked.has(key);
  box.addEventListener("change", () => {
    if (box.checked) state.picked.add(key); else state.picked.delete(key);
    pickedChanged();
  });
  return el("tr", {}, el("td", {}, box), el("td", {}, nameCell), el("td", {}, e.kind), el("td", { class: "num" }, e.kind === "dir" ? "" : human(e.size)),
    el("td", {}, when(e.mtime)), el("td", {}, down));
}

function pickedChanged() {
  const n = state.picked.size;
  $("restore-selected").disabled = n === 0;
  $("restore-selected").textContent = n ? `Restore the selected (${n})` : "Restore the selected";
}

// Restores `paths` of the backup being browsed (none: all of it) into the
// directory typed, on the server's machine; shows what could not be restored.
async function runRestore(paths) {
  const out = $("restore-result");
  const target = $("restore-target").value.trim();
  if (!target) { out.textContent = "Type the directory to restore into (an absolute path on the server's machine)."; return; }
  out.textContent = "restoring…";
  try {
    const text = paths.filter((p) => !p.startsWith("hex:"));
    const paths_hex = paths.filter((p) => p.startsWith("hex:")).map((p) => p.slice(4));
    const r = await post("restore", { backup: Number(state.browse.id), target, paths: text, paths_hex, overwrite: $("restore-overwrite").value });
    const head = el("p", { class: r.complete ? "ok" : "error" }, r.complete
      ? `Restored backup ${r.id} into ${r.target}: ${r.files} files (${human(r.bytes_restored)}), ${r.dirs} directories, ${r.symlinks} symbolic links${r.kept ? `, ${r.kept} kept as they were` : ""}.`
      : `Restore of backup ${r.id} into ${r.target} is incomplete: ${(r.failed || []).length} entries could not be restored, ${(r.lost_files || []).length} files were lost; everything else was restored.`);
    const items = [...(r.failed || []).map((f) => el("li", {}, `${f.path}: ${f.reason}${f.below ? ` (${f.below} entries below it not restored)` : ""}`)),
      ...(r.lost_files || []).map((l) => el("li", {}, `lost: ${l.path} (${l.reason})`))];
    out.replaceChildren(head, ...(items.length ? [el("ul", { id: "restore-failed" }, ...items)] : []));
  } catch (e) {
    out.replaceChildren(el("p", { class: "error" }, `Error: ${e.message}`));
  }
}

function drawCrumbs(id, path, hex) {
  const crumbs = [el("button", { type: "button", class: "link", onclick: () => openBackup(id, "/") }, `backup ${id}`)];
  if (hex) {
    // Cut the bytes at each "/": every ancestor named by its own bytes.
    const bytes = hexBytes(hex), dec = new TextDecoder();
    let start = 0;
    for (let i = 0; i <= bytes.length; i++) {
      if (i < bytes.length && bytes[i] !== 0x2f) continue;
      if (i > start) {
        const upto = bytes.subarray(0, i), to = "/" + dec.decode(upto);
        const toHex = notText(to) ? bytesHex(upto) : null;
        crumbs.push(" / ", el("button", { type: "button", class: "link", onclick: () => openBackup(id, to, 0, toHex) }, dec.decode(bytes.subarray(start, i))));
      }
      start = i + 1;
    }
    $("crumbs").replaceChildren(...crumbs);
    return;
  }
  const parts = path.split("/").filter(Boolean);
  parts.forEach((p, i) => {
    const to = "/" + parts.slice(0, i + 1).join("/");
    crumbs.push(" / ", el("button", { type: "button", class: "link", onclick: () => openBackup(id, to) }, p));
  });
  $("crumbs").replaceChildren(...crumbs);
}

// ---- Diff ----------------------------------------------------------------

async function runDiff() {
  const from = $("diff-from").value.trim(), to = $("diff-to").value.trim();
  $("diff-summary").textContent = "…";
  try {
    const r = await api("diff", { from, to, offset: state.diffOffset, limit: TREE_PAGE });
    const s = r.stats;
    $("diff-summary").textContent = `From ${r.from} to ${r.to}: ${s.added} added (${human(s.bytes_added)}), ${s.removed} removed (${human(s.bytes_removed)}), ${s.changed} changed, ${s.metadata} metadata only, ${s.unchanged} unchanged.`;
    $("diff-range").textContent = r.total ? `${r.offset + 1}–${r.offset + r.items.length} of ${r.total}` : "no differences";
    $("diff-prev").disabled = r.offset === 0;
    $("diff-next").disabled = r.offset + r.items.length >= r.total;
    tables.diff.show(r.items, (c) => el("tr", { class: `change-${c.change}` },
      el("td", {}, c.change), el("td", { class: "paths" }, c.path),
      el("td", { class: "num" }, c.old ? human(c.old.size) : ""), el("td", { class: "num" }, c.new ? human(c.new.size) : "")));
  } catch (e) {
    $("diff-summary").textContent = `Error: ${e.message}`;
    tables.diff.clear();
  }
}

// ---- Stats ---------------------------------------------------------------

async function loadStats() {
  const s = await api("stats");
  $("location").textContent = s.location;
  const c = s.config || {};
  const cards = [
    ["Backups", s.backups], ["Logical data", human(s.logical_bytes)], ["Stored (physical)", human(s.physical_bytes)],
    ["Containers", s.containers], ["Dedup ratio", ratio(s.dedup_ratio)], ["Compression ratio", ratio(s.compression_ratio)],
    ["Total ratio", ratio(s.total_ratio)], ["Layout", c.layout], ["Index", c.index], ["Encryption", s.encrypted ? "yes" : "no"],
  ];
  $("stats-list").replaceChildren(...cards.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v ?? "–"))));
}

// ---- Health --------------------------------------------------------------

// Runs a check and shows its progress as the server streams it (one JSON
// object a line), then its report.
async function runCheck() {
  const phase = $("check-phase"), bar = $("check-progress"), result = $("check-result");
  $("check-run").disabled = true;
  result.replaceChildren();
  $("check-problems").replaceChildren();
  phase.textContent = "starting…";
  try {
    const q = new URLSearchParams({ read_data: $("check-read-data").checked });
    const res = await fetch(`/api/check?${q}`, { method: "POST", headers: { Authorization: `Bearer ${TOKEN}` } });
    if (!res.ok) { const b = await res.json().catch(() => ({})); throw new Error(b.error || res.statusText); }
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "", current = "", total = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl); buf = buf.slice(nl + 1);
        if (!line) continue;
        const ev = JSON.parse(line);
        if (ev.event === "phase") {
          current = `${ev.phase} (${ev.unit})`; total = ev.total;
          bar.hidden = false;
          if (total == null) bar.removeAttribute("value"); else { bar.max = Math.max(1, total); bar.value = 0; }
          phase.textContent = current;
        } else if (ev.event === "progress" || ev.event === "end") {
          if (total != null) bar.value = ev.done;
          phase.textContent = `${current}: ${ev.done}${total != null ? ` of ${total}` : ""}`;
        } else if (ev.event === "report") {
          showReport(ev.report);
        } else if (ev.event === "error") {
          result.replaceChildren(el("p", { class: "error" }, `The check failed: ${ev.error}`));
        }
      }
    }
    bar.hidden = true;
    phase.textContent = "check finished";
    loadHealth().catch(() => {});
  } catch (e) {
    result.replaceChildren(el("p", { class: "error" }, `Error: ${e.message}`));
  } finally {
    $("check-run").disabled = false;
  }
}

// The last check (kept between runs, from `tessera check` or this page) and
// the quarantined chunks: damage a check or repair found, kept out of new backups.
async function loadHealth() {
  const h = await api("health");
  const c = h.last_check, out = $("last-check");
  if (!c) {
    out.replaceChildren(el("p", { class: "muted" }, h.kept
      ? "No check of this repository is on record for this user: run one (here, or `tessera check`)."
      : "The last check's result is not kept (the server runs with --no-cache)."));
  } else if (c.error) {
    out.replaceChildren(el("p", { class: "error" }, `The last check's record cannot be read: ${c.error}`));
  } else {
    const how = `${c.read_data ? "with --read-data" : "metadata only"}, by ${c.by === "serve" ? "this page" : "tessera check"}`;
    const verdict = c.ok ? "no problems found" : `${c.problems} problem(s): ${c.damaged} damaged or missing, ${c.derived} in derived data${c.affected_backups.length ? `; backups affected: ${c.affected_backups.join(", ")}` : ""}`;
    out.replaceChildren(el("p", { class: c.ok ? "ok" : "error", id: "last-check-verdict" }, `${when(c.time)} (${how}): ${verdict}.`),
      el("p", { class: "muted" }, `Checked ${c.report.containers} containers and ${c.report.backups} backups.`));
  }
  const q = h.quarantine;
  $("quarantine-summary").textContent = q.length
    ? `${q.length} object(s) hold quarantined chunks (found damaged by a check or repair; no new backup uses them; see \`tessera repair\`):`
    : "No quarantined chunks.";
  $("quarantine-list").replaceChildren(...q.map((o) => el("li", {},
    `${o.object || `lineage ${o.lineage}`}: ${o.chunks === "all" ? "every chunk" : `${o.chunks} chunk(s)`}`)));
}

function showReport(r) {
  const ok = r.problems.length === 0;
  $("check-result").replaceChildren(
    el("p", { class: ok ? "ok" : "error", id: "check-verdict" }, ok ? "No problems found." : `${r.problems.length} problem(s) found.`),
    el("p", { class: "muted" }, `Checked ${r.containers} containers (${r.stored_chunks} chunks${r.chunks_verified ? `, ${r.chunks_verified} re-hashed` : ""}) and ${r.backups} backups (${r.references} references); ${r.unreferenced_containers} unreferenced containers and ${r.uncommitted_recipes} uncommitted recipes left by interrupted backups.`),
    ...r.warnings.map((w) => el("p", { class: "muted" }, `warning: ${w}`)));
  $("check-problems").replaceChildren(...r.problems.map((p) => el("li", {},
    `${p.object}: ${p.detail} (${p.kind}; affects backups: ${p.affected_backups.length ? p.affected_backups.join(", ") : "none"})`)));
}

// ---- Wiring --------------------------------------------------------------

// ---- Reports -------------------------------------------------------------

// A served report's URL (opened in a tab of its own, where it runs nothing).
const reportUrl = (name) => `/api/reports/${encodeURIComponent(name)}?` + new URLSearchParams({ token: TOKEN });

// The lab's experiment reports: the files, then report.html's tables and
// SVG plots brought into the page (as data: no script, no link, no style).
async function loadReports() {
  const r = await api("reports");
  $("reports-dir").textContent = `In ${r.dir}:`;
  $("reports-list").replaceChildren(...r.reports.map((f) => el("li", {},
    el("a", { href: reportUrl(f.name), target: "_blank", rel: "noopener" }, f.name), ` (${human(f.bytes)}, ${when(f.mtime)})`)));
  const html = r.reports.find((f) => f.name === "report.html");
  if (!html) { $("report-body").replaceChildren(); return; }
  const res = await fetch(reportUrl("report.html"));
  if (!res.ok) throw new Error(`report.html: ${res.status} ${res.statusText}`);
  const doc = new DOMParser().parseFromString(await res.text(), "text/html");
  const keep = [...doc.body.children].filter((n) => ["H1", "H2", "H3", "TABLE", "FIGURE", "P"].includes(n.tagName));
  $("report-body").replaceChildren(...keep.map((n) => inert(document.importNode(n, true))));
}

// `node` without what could act: scripts, embedded objects, handlers,
// links and inline style.
function inert(node) {
  for (const bad of node.querySelectorAll("script, style, foreignObject, iframe, object, embed, link, a, use")) bad.replaceWith(...(bad.tagName === "A" ? bad.childNodes : []));
  for (const n of [node, ...node.querySelectorAll("*")]) {
    for (const a of [...n.attributes]) {
      if (/^on/i.test(a.name) || /href$/i.test(a.name) || a.name === "style" || a.name === "src") n.removeAttribute(a.name);
    }
  }
  return node;
}

function init() {
  for (const name of ["backups", "browse", "diff"]) tables[name] = new VirtualRows($(`${name}-table`));
  for (const b of document.querySelectorAll("header nav button")) b.addEventListener("click", () => show(b.dataset.view));
  $("backups-prev").addEventListener("click", () => { state.backupsOffset = Math.max(0, state.backupsOffset - PAGE); loadBackups().catch(showError); });
  $("backups-next").addEventListener("click", () => { state.backupsOffset += PAGE; loadBackups().catch(showError); });
  $("space-selected").addEventListener("click", () => estimate([...state.selected].sort((a, b) => a - b), $("space-answer")));
  $("forget-selected").addEventListener("click", askForget);
  $("forget-yes").addEventListener("click", doForget);
  $("forget-no").addEventListener("click", () => { $("forget-confirm").hidden = true; });
  $("restore-form").addEventListener("submit", (ev) => { ev.preventDefault(); runRestore([...state.picked].sort()); });
  $("restore-all").addEventListener("click", () => runRestore([]));
  $("check-form").addEventListener("submit", (ev) => { ev.preventDefault(); runCheck(); });
  $("tree-prev").addEventListener("click", () => openBackup(state.browse.id, state.browse.path, Math.max(0, state.browse.offset - TREE_PAGE), state.browse.hex));
  $("tree-next").addEventListener("click", () => openBackup(state.browse.id, state.browse.path, state.browse.offset + TREE_PAGE, state.browse.hex));
  $("path-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    let p = $("path-input").value.trim() || "/";
    if (!p.startsWith("/")) p = "/" + p;
    openBackup($("browse-backup").value.trim(), p.length > 1 ? p.replace(/\/+$/, "") : p);
  });
  $("diff-form").addEventListener("submit", (ev) => { ev.preventDefault(); state.diffOffset = 0; runDiff(); });
  $("diff-prev").addEventListener("click", () => { state.diffOffset = Math.max(0, state.diffOffset - TREE_PAGE); runDiff(); });
  $("diff-next").addEventListener("click", () => { state.diffOffset += TREE_PAGE; runDiff(); });
  $("space-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    estimate($("space-ids").value.split(/[\s,]+/).filter(Boolean), $("space-result"));
  });
  show("backups");
  loadBackups().catch(showError);
  // The Reports view, when the server has experiment reports.
  api("reports").then(() => { $("nav-reports").hidden = false; }).catch(() => {});
  api("stats").then((s) => {
    $("location").textContent = s.location;
    state.readOnly = !!s.read_only;
    document.body.classList.toggle("read-only", state.readOnly);
    if (state.readOnly) $("check-phase").textContent = "The server runs with --read-only: checks, restores and deletions are refused.";
  }).catch(() => {});
}

document.addEventListener("DOMContentLoaded", init);
