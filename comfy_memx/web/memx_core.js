// comfy_memx memory panel: what the ComfyUI sidebar tab (memx_panel.js) and the standalone page /memx/ show.
// No ComfyUI import here, nothing loaded from the internet: plain DOM and SVG, data from comfy_memx's routes
// (/memx/models, /memx/status, /memx/timeline, POST /memx/free, POST /memx/models/{id}/release) and ComfyUI's
// /system_stats.  Polls every
// POLL_MS only while the panel is in the page and the page is visible.  Every text from the server goes through
// textContent, never through innerHTML.

export const POLL_MS = 2000;
const TOKEN_KEY = "comfy_memx.token";
const TOKEN_HEADER = "X-Memx-Token";
const MAX_ENTRIES = 4096;
const SVG = "http://www.w3.org/2000/svg";
const TIMELINE_MIN = 170;   // px: the timeline's least height; it grows by a lane per model past that
const LANE_MIN = 26;        // px: the least height of one model's lane
const LANE_GAP = 3;         // px: the space at the top and bottom of each lane that no line enters
const LINE_COLOURS = ["#4e9af1", "#e8a33d", "#59b368", "#b57be0", "#e0607e", "#3fb8b0", "#c9b43a", "#8d8d8d"];

const STYLE = `
.memx-panel { color: var(--fg-color, #ddd); background: var(--comfy-menu-bg, #202020); font: 13px/1.4 sans-serif;
  padding: 8px 10px; box-sizing: border-box; height: 100%; overflow-y: auto; }
.memx-panel h3 { font-size: 13px; margin: 12px 0 4px; color: var(--descrip-text, #999); text-transform: uppercase;
  letter-spacing: .04em; font-weight: 600; }
.memx-panel .memx-head { display: flex; justify-content: space-between; gap: 8px; align-items: baseline; }
.memx-panel .memx-title { font-weight: 600; font-size: 14px; }
.memx-panel .memx-muted { color: var(--descrip-text, #999); font-size: 12px; }
.memx-panel .memx-error { color: var(--error-text, #ff4444); font-weight: 600; }
.memx-panel .memx-bar { display: grid; grid-template-columns: 8em 1fr auto; gap: 6px; align-items: center;
  margin: 3px 0; }
.memx-panel .memx-track { height: 8px; border-radius: 4px; background: var(--comfy-input-bg, #333);
  border: 1px solid var(--border-color, #4e4e4e); overflow: hidden; }
.memx-panel .memx-fill { height: 100%; background: var(--p-primary-color, #4e9af1); }
.memx-panel .memx-card { border: 1px solid var(--border-color, #4e4e4e); border-radius: 6px; padding: 6px 8px;
  margin: 6px 0; background: var(--comfy-input-bg, #2a2a2a); }
.memx-panel .memx-card.memx-leaked { border-color: var(--error-text, #ff4444); }
.memx-panel .memx-name { font-weight: 600; word-break: break-all; }
.memx-panel .memx-badge { display: inline-block; font-size: 11px; padding: 0 6px; border-radius: 8px; margin-left: 6px;
  border: 1px solid currentColor; }
.memx-panel .memx-state-loaded { color: #3d9a50; }
.memx-panel .memx-state-offloaded { color: var(--descrip-text, #999); }
.memx-panel .memx-state-leaked { color: var(--error-text, #ff4444); }
.memx-panel .memx-kv { display: grid; grid-template-columns: 7.5em 1fr; gap: 0 6px; font-size: 12px; }
.memx-panel .memx-kv > :nth-child(odd) { color: var(--descrip-text, #999); }
.memx-panel code, .memx-panel .memx-chain { font-family: ui-monospace, monospace; font-size: 11.5px;
  word-break: break-all; }
.memx-panel .memx-ok { color: #3d9a50; font-weight: 600; }
.memx-panel .memx-fix { border-left: 3px solid var(--p-primary-color, #4e9af1); padding-left: 6px; margin-top: 3px; }
.memx-panel button, .memx-panel input { font: inherit; color: var(--input-text, #ddd);
  background: var(--comfy-input-bg, #333); border: 1px solid var(--border-color, #4e4e4e); border-radius: 4px;
  padding: 3px 10px; }
.memx-panel button { cursor: pointer; }
.memx-panel input { flex: 1 1 14em; min-width: 0; }
.memx-panel button:disabled { opacity: .6; cursor: wait; }
.memx-panel .memx-row { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; margin: 4px 0; }
.memx-panel svg.memx-timeline { width: 100%; height: auto; display: block; background: var(--comfy-input-bg, #2a2a2a);
  border: 1px solid var(--border-color, #4e4e4e); border-radius: 4px; }
.memx-panel svg .memx-axis { stroke: var(--border-color, #4e4e4e); }
.memx-panel svg text { fill: var(--descrip-text, #999); font-size: 10px; }
.memx-panel .memx-legend { display: flex; flex-wrap: wrap; gap: 2px 10px; font-size: 11px; margin-top: 3px; }
.memx-panel .memx-swatch { display: inline-block; width: 10px; height: 3px; margin-right: 4px; vertical-align: middle; }
.memx-panel ul { margin: 2px 0; padding-left: 18px; }
`;

// -- small helpers --------------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function formatBytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Math.abs(n), unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${n < 0 ? "-" : ""}${unit === 0 ? value : value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
}

// Who loaded a model (an owner: package, node, via) or asked for an unload (a requester of any kind the ledger
// writes: "node", "load" (the loading node), "http" (a route, never an address), "comfyui", "comfy_memx").
function who(owner) {
  if (!owner) return "?";
  const via = owner.via ? ` via ${owner.via}` : "";
  if (owner.kind === "http") {
    return `${owner.route ? `POST ${owner.route}` : "an HTTP request"}` +
      (owner.clients > 1 ? ` (${owner.clients} clients)` : "");
  }
  if (owner.kind === "comfy_memx") return `comfy_memx${via}`;
  if (owner.kind === "load") {   // /memx/models keeps the loading node under "node", the timeline flattens it
    const loading = (owner.models || []).map((m) => m.model).filter(Boolean).join(", ");
    return `${who(owner.node || { ...owner, kind: "node" })} loading ${loading || "another model"}`;
  }
  const node = owner.class_type ? `${owner.class_type}${owner.node_id ? ` (node ${owner.node_id})` : ""}` : null;
  const pkg = owner.package || (owner.kind === "comfyui" ? "ComfyUI" : "?");
  return [pkg, node].filter(Boolean).join(" · ") + via;
}

// Who keeps a model alive, as its card says: the leak's holder, else (a model ComfyUI never warned about, say a
// survivor of a free) what the last holder search of it found, else ComfyUI while a ModelPatcher of it lives.
function heldBy(row, holder) {
  if (row.leak) return row.leak.holder_package || (holder && holder.package) || "searching…";
  const searched = row.searched;
  if (searched && searched.holder) {
    return `${searched.holder.package || "?"} (${searched.holder.path || "?"}, searched ${clock(searched.time)})`;
  }
  if (row.state === "leaked") {
    return searched ? `not found (search: ${searched.result || "?"})` : "not searched yet (no ModelPatcher refers to it)";
  }
  return row.in_comfyui_loaded_list ? "ComfyUI (loaded list)" : "ComfyUI";
}

// Only models whose memory is gone count as freed; one unloaded from its device but still in RAM (every unload on
// --cpu, or a survivor) is unloaded, never freed (as `python -m comfy_memx free` says).
function freedHeadline(receipt) {
  const unloaded = receipt.freed || [];
  const gone = unloaded.filter((row) => row.released).length;
  return `Freed ${formatBytes(receipt.released_bytes)} (${gone} model(s) gone from memory); ` +
    `unloaded ${formatBytes(receipt.freed_bytes)} from ${unloaded.length} model(s)` +
    (unloaded.length > gone ? `, ${unloaded.length - gone} of them still in RAM` : "");
}

function clock(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "?";
}

// how a leak ComfyUI never warned about was found (a ComfyUI warning, the usual way, says nothing more)
const FOUND_BY = { after_free: "found after a free", after_unload: "found after an unload" };

function holderOf(leak) {
  if (!leak) return null;
  return leak.holder || (leak.referrers && leak.referrers[0]) || null;
}

export function readToken() {
  try { return window.localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
}

function saveToken(value) {
  try {
    if (value) window.localStorage.setItem(TOKEN_KEY, value); else window.localStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* private mode: the token lasts for this page only */ }
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.message) return `${response.status}: ${body.message}`;
  } catch (e) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

// -- the panel --------------------------------------------------------------------------------------------------

export function mountPanel(root, options = {}) {
  const url = options.url || ((path) => path);
  if (!document.getElementById("memx-panel-style")) {
    document.head.append(el("style", { id: "memx-panel-style" }, STYLE));
  }
  const state = { models: [], status: null, stats: null, entries: [], started: null, next: 0, now: null,
                  error: null, updated: null, receipt: null, freeing: false, freeError: null, timer: null,
                  busy: false, token: readToken(), releasing: null, released: null };
  const parts = {
    head: el("div", { class: "memx-head" }),
    error: el("div", { class: "memx-error", role: "alert", "data-memx": "error" }),
    memory: el("div", { "data-memx": "memory" }),
    models: el("div", { "data-memx": "models" }),
    leaks: el("div", { "data-memx": "leaks" }),
    timeline: el("div", { "data-memx": "timeline" }),
    free: el("div", { "data-memx": "free" }),
  };
  const panel = el("div", { class: "memx-panel", "data-memx": "panel" },
    parts.head, parts.error,
    el("h3", {}, "Memory"), parts.memory,
    el("h3", {}, "Models"), parts.models,
    el("h3", {}, "Leaks"), parts.leaks,
    el("h3", {}, "Timeline"), parts.timeline,
    el("h3", {}, "Free"), parts.free);
  root.replaceChildren(panel);

  async function getJson(path) {
    const response = await fetch(url(path), { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: ${await errorText(response)}`);
    return response.json();
  }

  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    try {
      let [models, status, stats, timeline] = await Promise.all([
        getJson("/memx/models"), getJson("/memx/status"),
        getJson("/system_stats").catch(() => null), getJson(`/memx/timeline?since=${state.next}`)]);
      if (state.started !== timeline.started) {     // first read, or the server restarted: read it all
        if (state.next > 0) timeline = await getJson("/memx/timeline?since=0");
        state.entries = [];
        state.started = timeline.started;
      }
      state.entries.push(...timeline.entries);
      if (state.entries.length > MAX_ENTRIES) state.entries.splice(0, state.entries.length - MAX_ENTRIES);
      Object.assign(state, { models, status, stats, next: timeline.next, now: timeline.now,
                             dropped: timeline.dropped, error: null, updated: Date.now() });
    } catch (error) {
      state.error = `comfy_memx is not answering (${error.message}); is comfy_memx active in this ComfyUI?`;
    } finally {
      state.busy = false;
    }
    draw();
  }

  function visible() {   // in the page, laid out (not a hidden tab) and the browser tab in front
    return root.isConnected && root.getClientRects().length > 0 && document.visibilityState === "visible";
  }

  function schedule() {
    clearTimeout(state.timer);
    if (!root.isConnected) {                    // the tab was closed: stop for good
      document.removeEventListener("visibilitychange", onVisible);
      return;
    }
    state.timer = setTimeout(async () => {
      if (visible()) await refresh();
      schedule();
    }, POLL_MS);
  }

  function draw() {
    drawHead();
    parts.error.textContent = state.error || "";
    drawMemory();
    drawModels();
    drawLeaks();
    drawTimeline();
    drawFree();
  }

  function drawHead() {
    const status = state.status;
    parts.head.replaceChildren(
      el("span", { class: "memx-title" }, "comfy_memx"),
      el("span", { class: "memx-muted" },
        status ? `v${status.version} · ${status.source || "?"} · leak mode ${status.leak_mode}` : "",
        state.updated ? ` · ${new Date(state.updated).toLocaleTimeString()}` : ""));
  }

  function bar(label, used, total, testId) {
    const share = total > 0 ? Math.min(1, Math.max(0, used / total)) : 0;
    return el("div", { class: "memx-bar", "data-memx": testId },
      el("span", {}, label),
      el("div", { class: "memx-track" }, el("div", { class: "memx-fill", style: `width:${(share * 100).toFixed(1)}%` })),
      el("span", { class: "memx-muted" }, total ? `${formatBytes(used)} / ${formatBytes(total)}` : formatBytes(used)));
  }

  function drawMemory() {
    const rows = [];
    const system = state.stats && state.stats.system;
    if (system && system.ram_total) rows.push(bar("RAM", system.ram_total - system.ram_free, system.ram_total, "ram"));
    for (const device of (state.stats && state.stats.devices) || []) {
      if (!device.vram_total || device.type === "cpu") continue;
      rows.push(bar(`VRAM ${device.type}:${device.index ?? 0}`, device.vram_total - device.vram_free,
                    device.vram_total, "vram"));
    }
    if (state.stats && !rows.some((row) => row.dataset.memx === "vram")) {
      rows.push(el("div", { class: "memx-muted", "data-memx": "vram" }, "VRAM: no GPU (ComfyUI runs on the CPU)"));
    }
    const pins = state.status && state.status.pins;
    if (pins) {
      const cap = pins.cap_bytes ?? pins.comfyui_cap_bytes;
      const capped = cap !== null && cap !== undefined && cap >= 0;
      rows.push(bar("Pinned", pins.pinned_bytes, capped ? cap : 0, "pinned"));
      if (!capped) rows.push(el("div", { class: "memx-muted" }, cap < 0 ? "pinned memory is off in ComfyUI" : "no pinned-memory cap"));
    }
    parts.memory.replaceChildren(...rows);
  }

  function drawModels() {
    if (!state.models.length) {
      parts.models.replaceChildren(el("div", { class: "memx-muted" }, "no model loaded yet"));
      return;
    }
    parts.models.replaceChildren(...state.models.map((row) => {
      const holder = holderOf(row.leak);
      const devices = Object.entries(row.bytes_by_device || {}).map(([d, n]) => `${formatBytes(n)} on ${d}`);
      const last = row.last_unload;
      const facts = [
        ["size", `${formatBytes(row.bytes)}${devices.length ? ` (${devices.join(", ")})` : ""}`],
        ["loaded by", who(row.owner)],
        ["held by", heldBy(row, holder)],
      ];
      if (row.pinned_bytes) facts.push(["pinned", formatBytes(row.pinned_bytes)]);
      if (last) facts.push(["last unload", `${last.reason || "?"} by ${who(last.requested_by)} at ${clock(last.time)}`]);
      facts.push(["loads", `${row.loads}, reloads ${row.reloads || 0}` +
        (row.reloads ? ` (${(row.reload_seconds || 0).toFixed(2)} s, ${formatBytes(row.reload_bytes)})` : "")]);
      return el("div", { class: `memx-card${row.state === "leaked" ? " memx-leaked" : ""}`, "data-memx": "model",
                         "data-model-id": row.model_id },
        el("div", {}, el("span", { class: "memx-name" }, row.model_id),
           el("span", { class: `memx-badge memx-state-${row.state}` }, row.state)),
        el("div", { class: "memx-kv" }, ...facts.flatMap(([k, v]) => [el("span", {}, k), el("span", {}, v)])));
    }));
  }

  function chainList(leak) {
    const chains = (leak.referrers && leak.referrers.length ? leak.referrers : [holderOf(leak)]).filter(Boolean);
    return chains.map((chain) => el("div", { "data-memx": "chain" },
      el("div", { class: "memx-chain" }, chain.path),
      el("div", { class: "memx-muted" }, `package ${chain.holder_package || chain.package || "?"} · pattern `,
         el("code", {}, chain.pattern || "?")),
      chain.suggestion ? el("div", { class: "memx-fix", "data-memx": "fix" }, `Fix: ${chain.suggestion}`) : null));
  }

  function releaseControl(row) {
    const release = row.release;
    if (!release) return null;
    if (release.policy === "off" || !release.possible) {
      const why = release.policy === "off"
        ? "Release is off (COMFY_MEMX_RELEASE); start ComfyUI with COMFY_MEMX_RELEASE=ask to release from here."
        : `Release is not possible: ${release.why || "the holder is not a cache comfy_memx can cut"}`;
      return el("div", { class: "memx-muted", "data-memx": "release-why" }, why);
    }
    const waiting = state.releasing === row.model_id;
    return el("div", { class: "memx-row" },
      el("button", { type: "button", "data-memx": "release-button", disabled: state.releasing !== null,
                     onclick: () => releaseModel(row) }, waiting ? "Releasing…" : "Release"),
      el("span", { class: "memx-muted" },
         `drops the model from ${row.leak.holder_package || "the pack"}'s cache so its memory can be freed`));
  }

  function drawLeaks() {
    const leaked = state.models.filter((row) => row.leak);
    const released = state.released ? [drawReleased(state.released)] : [];
    if (!leaked.length) {
      parts.leaks.replaceChildren(...released, el("div", { class: "memx-muted" }, "no leaked model"));
      return;
    }
    parts.leaks.replaceChildren(...released, ...leaked.map((row) => {
      const search = row.leak.search || {};
      const chains = chainList(row.leak);
      return el("div", { class: "memx-card memx-leaked", "data-memx": "leak", "data-model-id": row.model_id },
        el("div", { class: "memx-name" }, row.model_id),
        el("div", { class: "memx-muted" },
           `${row.leak.stage || "leaked"} · held by ${row.leak.holder_package || "?"} · loaded by ${who(row.owner)}` +
           (FOUND_BY[row.leak.found_by] ? ` · ${FOUND_BY[row.leak.found_by]}` : "")),
        chains.length ? chains : el("div", { class: "memx-muted" },
          `holder not found yet (search: ${search.result || search.note || "pending"})`),
        releaseControl(row));
    }));
  }

  async function postGuarded(path, body) {   // -> { status, body }; status 0 when the server did not answer
    try {
      const response = await fetch(url(path), { method: "POST", headers: guardedHeaders(), body: JSON.stringify(body) });
      return { status: response.status, body: await response.json().catch(() => null) };
    } catch (error) {
      return { status: 0, body: { message: error.message } };
    }
  }

  async function releaseModel(row) {
    state.releasing = row.model_id; drawLeaks();
    const answer = await postGuarded(`/memx/models/${encodeURIComponent(row.model_id)}/release`,
                                     row.release.path ? { path: row.release.path } : {});
    state.releasing = null;
    state.released = { model_id: row.model_id, ...answer };
    drawLeaks();
    refresh();
  }

  async function searchAgain(modelId) {   // after "changed": a new search finds the cache as it is now
    state.releasing = modelId; drawLeaks();
    const answer = await postGuarded(`/memx/models/${encodeURIComponent(modelId)}/search`, {});
    state.releasing = null;
    state.released = { model_id: modelId, searched: true, ...answer };
    drawLeaks();
    refresh();
  }

  function releaseLines({ status, body, searched }) {
    const receipt = (body && body.release) || {};
    const message = (body && body.message) || "", error = body && body.error;
    if (searched) {
      return status === 200 ? ["ok", "Searched again: the leak below shows its holder as it is now."]
                            : ["error", `Search failed${status ? ` (${status})` : ""}: ${message || "no answer"}`];
    }
    if (status === 200 && receipt.outcome === "survivor") {
      const next = receipt.next_holder;
      return ["note", `Cut ${receipt.cut || "?"}, but the model is still ` +
                      (next && next.path ? `held by ${next.path} (${next.package || "?"})`
                                         : `in memory (${(next && next.note) || "no other holder found yet"})`),
              next && next.suggestion ? `Fix: ${next.suggestion}` : null];
    }
    if (status === 200) {
      return ["ok", `Released ${formatBytes(receipt.bytes)} held by ${receipt.package || "?"} (${receipt.cut || "?"}); ` +
                    "the pack will rebuild it when it needs it again.",
              receipt.died ? "The model is gone from memory." : "The model is still in memory: something else refers to it."];
    }
    if (error === "changed") return ["error", "The cache changed since the search; nothing was cut. Search again."];
    if (error === "prompt_running") {
      return ["note", "A prompt is running; releases wait for it to end, and it did not end in time. Nothing was cut: " +
                      "release again when the queue is idle.", message];
    }
    if (error === "in_use") {
      return ["error", "In use by a running prompt or by ComfyUI; nothing was cut. Try after it finishes.", message];
    }
    if (status === 422) return ["error", message || "This holder is not a cache that is safe to cut.", receipt.fix ? `Fix: ${receipt.fix}` : null];
    if (status === 403) {
      return ["error", message, error === "forbidden" ? "From another machine, enter the server's COMFY_MEMX_TOKEN below (Free)." : null];
    }
    if (status === 404) return ["note", "The model is no longer in memory; there is nothing to release."];
    return ["error", `Release failed${status ? ` (${status})` : ""}: ${message || "no answer"}`];
  }

  function drawReleased(released) {
    const [kind, first, ...more] = releaseLines(released);
    const memory = ((released.body || {}).release || {}).memory;
    return el("div", { class: "memx-card", "data-memx": "release-receipt", "data-model-id": released.model_id },
      el("div", { class: "memx-name" }, `Release of ${released.model_id}`),
      el("div", { class: { ok: "memx-ok", error: "memx-error" }[kind], role: "status" }, first),
      ...more.filter(Boolean).map((line) => el("div", { class: line.startsWith("Fix:") ? "memx-fix" : "memx-muted" }, line)),
      (released.body || {}).error === "changed" && !released.searched ? el("div", { class: "memx-row" },
        el("button", { type: "button", "data-memx": "search-again", disabled: state.releasing !== null,
                       onclick: () => searchAgain(released.model_id) }, "Search again")) : null,
      memory && memory.before && memory.after ? el("div", { class: "memx-muted" },
        `Process memory: ${formatBytes(memory.before.rss)} before, ${formatBytes(memory.after.rss)} after`) : null);
  }

  function modelLines(entries, rows, start, end) {
    const lines = new Map();
    const live = new Map(rows.map((row) => [row.model_id, row]));
    for (const entry of entries) {
      if (!entry.model_id || entry.loaded_bytes === null || entry.loaded_bytes === undefined) continue;
      if (!lines.has(entry.model_id)) {
        const before = entry.kind === "load" ? Math.max(0, entry.loaded_bytes - (entry.bytes || 0))
                     : entry.kind === "unload" ? entry.loaded_bytes + (entry.bytes || 0) : entry.loaded_bytes;
        lines.set(entry.model_id, { name: entry.model_id, points: [[Math.max(start, entry.time), before]] });
      }
      const line = lines.get(entry.model_id);
      line.points.push([entry.time, line.points[line.points.length - 1][1]], [entry.time, entry.loaded_bytes]);
    }
    for (const [modelId, line] of lines) {
      const row = live.get(modelId);
      const last = line.points[line.points.length - 1];
      if (row) line.points.push([end, last[1]], [end, row.loaded_bytes]);
    }
    return lines;
  }

  function markOf(kind, cx, cy, colour, top, bottom) {
    if (kind === "load") {
      return svg("path", { d: `M${cx - 4},${cy + 3} L${cx + 4},${cy + 3} L${cx},${cy - 4} Z`, fill: colour });
    }
    if (kind === "unload") {
      return svg("path", { d: `M${cx - 4},${cy - 3} L${cx + 4},${cy - 3} L${cx},${cy + 4} Z`, fill: "none",
                           stroke: colour });
    }
    if (kind === "leak") {
      return svg("path", { d: `M${cx - 4},${cy - 4} L${cx + 4},${cy + 4} M${cx - 4},${cy + 4} L${cx + 4},${cy - 4}`,
                           stroke: "var(--error-text, #ff4444)", "stroke-width": 2 });
    }
    return svg("line", { x1: cx, y1: top, x2: cx, y2: bottom, stroke: "var(--descrip-text, #999)",
                         "stroke-dasharray": "3 3" });
  }

  // One lane per model, stacked top to bottom and never overlapping (two models of one size loaded and unloaded
  // together would otherwise draw one line over the other), each from 0 to the largest loaded size of any model.
  function drawTimeline() {
    const start = state.started, end = state.now;
    if (!start || !end) { parts.timeline.replaceChildren(); return; }
    const width = Math.max(240, Math.round(parts.timeline.clientWidth || 600));
    const left = 44, right = 8, top = 8, bottom = 18;
    const lines = modelLines(state.entries, state.models, start, end);
    const lanes = new Map([...lines.keys()].map((modelId, index) => [modelId, index]));
    for (const entry of state.entries) {   // a model with marks but no line yet (a leak of a model loaded before)
      if (entry.model_id && !lanes.has(entry.model_id)) lanes.set(entry.model_id, lanes.size);
    }
    const laneHeight = Math.max(LANE_MIN, Math.floor((TIMELINE_MIN - top - bottom) / Math.max(1, lanes.size)));
    const height = top + bottom + laneHeight * Math.max(1, lanes.size);
    let peak = 1;
    for (const line of lines.values()) for (const [, v] of line.points) peak = Math.max(peak, v);
    const span = Math.max(1, end - start);
    const x = (t) => left + ((t - start) / span) * (width - left - right);
    const laneTop = (lane) => top + lane * laneHeight;
    const y = (lane, v) => laneTop(lane) + LANE_GAP + (1 - Math.max(0, v) / peak) * (laneHeight - 2 * LANE_GAP);
    const chart = svg("svg", { class: "memx-timeline", viewBox: `0 0 ${width} ${height}`,
                               role: "img", "aria-label": "loaded bytes per model since the server started, a lane each" });
    chart.append(svg("line", { class: "memx-axis", x1: left, y1: top, x2: left, y2: height - bottom }),
                 svg("text", { x: 2, y: top + 8 }, formatBytes(peak)),
                 svg("text", { x: left, y: height - 4 }, clock(start)),
                 svg("text", { x: width - right, y: height - 4, "text-anchor": "end" }, clock(end)));
    for (const lane of lanes.values()) {
      const floor = laneTop(lane + 1) - LANE_GAP;
      chart.append(svg("line", { class: "memx-axis memx-lane", x1: left, y1: floor, x2: width - right, y2: floor }));
    }
    const colours = new Map([...lanes.keys()].map((modelId, index) =>
      [modelId, LINE_COLOURS[index % LINE_COLOURS.length]]));
    for (const [modelId, line] of lines) {
      const lane = lanes.get(modelId);
      chart.append(svg("polyline", { class: "memx-line", fill: "none", stroke: colours.get(modelId), "stroke-width": 1.6,
                                     points: line.points.map(([t, v]) => `${x(t).toFixed(1)},${y(lane, v).toFixed(1)}`).join(" "),
                                     "data-model-id": modelId }, svg("title", {}, line.name)));
    }
    for (const entry of state.entries) {
      const lane = lanes.get(entry.model_id);
      const colour = colours.get(entry.model_id) || "currentColor";
      const cx = x(entry.time), cy = lane === undefined ? y(0, 0) : y(lane, entry.loaded_bytes || 0);
      const label = `${clock(entry.time)} ${entry.kind} ${entry.model_id || ""}` +
        (entry.reason ? ` (${entry.reason}${entry.requested_by ? ` by ${who(entry.requested_by)}` : ""})` : "") +
        (entry.holder_package ? ` held by ${entry.holder_package}` : "");
      const mark = markOf(entry.kind, cx, cy, colour, top, height - bottom);
      mark.setAttribute("class", `memx-mark memx-mark-${entry.kind}`);
      mark.append(svg("title", {}, label));
      chart.append(mark);
    }
    const legend = el("div", { class: "memx-legend" }, ...[...lanes.keys()].map((modelId) =>
      el("span", {}, el("span", { class: "memx-swatch", style: `background:${colours.get(modelId)}` }), modelId)));
    const counts = ["load", "unload", "leak", "free"].map((kind) =>
      `${state.entries.filter((e) => e.kind === kind).length} ${kind}`).join(" · ");
    parts.timeline.replaceChildren(chart, legend,
      el("div", { class: "memx-muted" }, `a lane per model, top to bottom as listed, each 0 to ${formatBytes(peak)} · ` +
        `▲ load ▽ unload ✕ leak ┆ free — ${counts}` + (state.dropped ? ` (${state.dropped} older entries dropped)` : "")));
  }

  function guardedHeaders() {   // the token, when one was entered, for the routes that need loopback or it
    const headers = { "Content-Type": "application/json" };
    if (state.token) headers[TOKEN_HEADER] = state.token;
    return headers;
  }

  async function free() {
    state.freeing = true; state.freeError = null; drawFree();
    try {
      const response = await fetch(url("/memx/free"), { method: "POST", headers: guardedHeaders(),
        body: JSON.stringify({ unload_models: true, free_memory: true }) });
      if (response.status === 403) {
        state.freeError = `Refused (${await errorText(response)}). From another machine, enter the server's ` +
          "COMFY_MEMX_TOKEN below.";
      } else if (!response.ok && response.status !== 202) {
        state.freeError = `Free failed: ${await errorText(response)}`;
      } else {
        state.receipt = await response.json();
      }
    } catch (error) {
      state.freeError = `Free failed: ${error.message}`;
    } finally {
      state.freeing = false;
    }
    drawFree();
    refresh();
  }

  function drawReceipt(receipt) {
    const memory = receipt.memory || {};
    const trim = memory.trim || {};
    const survivors = receipt.survivors || [];
    const notSearched = survivors.map((s) => s.search && s.search.note).find((note) => note && note.startsWith("not searched: holder"));
    return el("div", { class: "memx-card", "data-memx": "receipt" },
      el("div", { class: "memx-name" }, `Receipt: ${receipt.status}` + (receipt.waited_s !== undefined ? ` after ${receipt.waited_s} s` : "")),
      receipt.note ? el("div", { class: "memx-muted" }, receipt.note) : null,
      el("div", { "data-memx": "freed-headline" }, freedHeadline(receipt)),
      (receipt.freed || []).length ? el("ul", { "data-memx": "freed" }, ...receipt.freed.map((row) =>
        el("li", {}, `${row.model_id}: ${formatBytes(row.unloaded_bytes)} unloaded from ${row.device}, ` +
                     (row.released ? "gone from memory" : "still in RAM")))) : null,
      el("div", {}, `Survivors: ${survivors.length} (${formatBytes(receipt.survivor_bytes)})`),
      survivors.length ? el("ul", { "data-memx": "survivors" }, ...survivors.map((row) => {
        const holders = row.holders || (row.leak && row.leak.referrers) || [];
        const first = holders[0] || holderOf(row.leak);
        return el("li", { "data-memx": "survivor" },
          `${row.model_id} (${row.reason}, ${formatBytes(row.bytes)}) held by ` +
          `${(first && (first.holder_package || first.package)) || (row.leak && row.leak.holder_package) || "?"}`,
          first ? el("div", { class: "memx-chain" }, first.path) : null,
          first && first.suggestion ? el("div", { class: "memx-fix" }, `Fix: ${first.suggestion}`) : null,
          row.search && row.search.note ? el("div", { class: "memx-muted" }, row.search.note) : null);
      })) : null,
      notSearched ? el("div", { class: "memx-error" }, "Holder searches need loopback or the server's token: enter COMFY_MEMX_TOKEN below.") : null,
      el("div", { class: "memx-muted", "data-memx": "retention" },
        `Process memory: ${formatBytes(memory.rss_before)} before, ${formatBytes(memory.rss_after)} after` +
        (trim.returned_bytes !== undefined && trim.returned_bytes !== null ? `; malloc_trim returned ${formatBytes(trim.returned_bytes)}` : "") +
        (trim.skipped ? `; trim skipped (${trim.skipped})` : "") +
        (memory.held_bytes !== undefined ? `; still held by models ${formatBytes(memory.held_bytes)}` : "")));
  }

  const freeButton = el("button", { type: "button", onclick: free, "data-memx": "free-button" }, "Free memory");
  const tokenInput = el("input", { type: "password", placeholder: "COMFY_MEMX_TOKEN (remote only)", value: state.token,
                                   "aria-label": "comfy_memx token", autocomplete: "off" });
  tokenInput.addEventListener("change", () => { state.token = tokenInput.value.trim(); saveToken(state.token); });
  const freeResult = el("div", {});
  parts.free.replaceChildren(
    el("div", { class: "memx-row" }, freeButton,
       el("span", { class: "memx-muted" }, "unloads every model and empties ComfyUI's caches")),
    el("div", { class: "memx-row" }, tokenInput, el("span", { class: "memx-muted" }, "kept in this browser only")),
    freeResult);

  function drawFree() {
    freeButton.disabled = state.freeing;
    freeButton.textContent = state.freeing ? "Freeing…" : "Free memory";
    freeResult.replaceChildren(...[
      state.freeError ? el("div", { class: "memx-error", role: "alert", "data-memx": "free-error" }, state.freeError) : null,
      state.receipt ? drawReceipt(state.receipt) : null].filter(Boolean));
  }

  const onVisible = () => { if (visible()) refresh(); };
  document.addEventListener("visibilitychange", onVisible);
  draw();
  refresh().then(schedule);
  return { refresh, stop: () => { clearTimeout(state.timer); document.removeEventListener("visibilitychange", onVisible); } };
}
