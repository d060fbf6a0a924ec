// comfy_memx memory panel: what the ComfyUI sidebar tab (memx_panel.js) and the standalone page /memx/ mount.
// This module polls the server and hands each section its part of the answers; each section is a module of its own
// (memx_head, memx_memory, memx_models, memx_leaks, memx_released, memx_timeline, memx_free; memx_words says how
// things read, memx_dom builds nodes, memx_client talks to the server, memx_style holds the stylesheet).  No ComfyUI
// import here, nothing loaded from the internet: plain DOM and SVG, data from comfy_memx's routes (/memx/models,
// /memx/status, /memx/timeline, /memx/releases, POST /memx/free, POST /memx/models/{id}/release) and ComfyUI's
// /system_stats.  Polls every POLL_MS only while the panel is in the page and the page is visible.  Every text from
// the server goes through textContent, never through innerHTML.  Exports only (ComfyUI imports every .js of the
// extension folder; importing these modules twice is harmless).

import { makeClient } from "./memx_client.js";
import { el } from "./memx_dom.js";
import { mountFree } from "./memx_free.js";
import { drawHead, drawOff } from "./memx_head.js";
import { makeLeaks } from "./memx_leaks.js";
import { drawMemory } from "./memx_memory.js";
import { drawModels } from "./memx_models.js";
import { drawReleased } from "./memx_released.js";
import { installStyle } from "./memx_style.js";
import { drawTimeline } from "./memx_timeline.js";

export { formatBytes } from "./memx_words.js";
export { readToken } from "./memx_client.js";

export const POLL_MS = 2000;
const MAX_ENTRIES = 4096;

export function mountPanel(root, options = {}) {
  const client = makeClient(options.url || ((path) => path));
  installStyle();
  const state = { models: [], status: null, stats: null, releases: null, entries: [], started: null, next: 0,
                  now: null, dropped: 0, error: null, updated: null, timer: null, busy: false };
  const parts = {
    head: el("div", { class: "memx-head" }),
    error: el("div", { class: "memx-error", role: "alert", "data-memx": "error" }),
    off: el("div", {}),
    memory: el("div", { "data-memx": "memory" }),
    models: el("div", { "data-memx": "models" }),
    leaks: el("div", { "data-memx": "leaks" }),
    released: el("div", { "data-memx": "released-list" }),
    timeline: el("div", { "data-memx": "timeline" }),
    free: el("div", { "data-memx": "free" }),
  };
  const sections = el("div", {},
    el("h3", {}, "Memory"), parts.memory,
    el("h3", {}, "Models"), parts.models,
    el("h3", {}, "Leaks"), parts.leaks,
    el("h3", {}, "Released"), parts.released,
    el("h3", {}, "Timeline"), parts.timeline,
    el("h3", {}, "Free"), parts.free);
  root.replaceChildren(el("div", { class: "memx-panel", "data-memx": "panel" }, parts.head, parts.error, parts.off,
                          sections));
  const leaks = makeLeaks(parts.leaks, client, () => refresh());
  mountFree(parts.free, client, () => refresh());

  async function readTimeline() {
    let timeline = await client.getJson(`/memx/timeline?since=${state.next}`);
    if (state.started !== timeline.started) {     // first read, or the server restarted: read it all
      if (state.next > 0) timeline = await client.getJson("/memx/timeline?since=0");
      state.entries = [];
      state.started = timeline.started;
    }
    state.entries.push(...timeline.entries);
    if (state.entries.length > MAX_ENTRIES) state.entries.splice(0, state.entries.length - MAX_ENTRIES);
    Object.assign(state, { next: timeline.next, now: timeline.now, dropped: timeline.dropped });
  }

  async function refresh() {
    if (state.busy) return;
    state.busy = true;
    try {
      const status = await client.getStatus();
      state.status = status;
      if (status.active !== false) {
        const [models, stats, releases] = await Promise.all([
          client.getJson("/memx/models"), client.getJson("/system_stats").catch(() => null),
          client.getJson("/memx/releases").catch(() => null), readTimeline()]);
        Object.assign(state, { models, stats, releases });
      }
      Object.assign(state, { error: null, updated: Date.now() });
    } catch (error) {
      state.error = `comfy_memx is not answering (${error.message}); is comfy_memx active in this ComfyUI? ` +
        "Its start-up line in ComfyUI's log says so (comfy_memx ... active).";
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
    drawHead(parts.head, state.status, state.updated);
    parts.error.textContent = state.error || "";
    const off = state.status && state.status.active === false;
    parts.off.replaceChildren(...(off ? [drawOff(state.status)] : []));
    sections.hidden = off;
    if (off) return;
    drawMemory(parts.memory, state);
    drawModels(parts.models, state.models);
    leaks.draw(state.models, state.releases);
    drawReleased(parts.released, state.releases);
    drawTimeline(parts.timeline, state);
  }

  const onVisible = () => { if (visible()) refresh(); };
  document.addEventListener("visibilitychange", onVisible);
  draw();
  refresh().then(schedule);
  return { refresh, stop: () => { clearTimeout(state.timer); document.removeEventListener("visibilitychange", onVisible); } };
}
