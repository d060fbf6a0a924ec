// comfy_memx memory panel: the header (version, how comfy_memx was activated, leak mode, the release setting) and,
// when a bad setting keeps comfy_memx off, why (the node pack's inactive /memx/status).  Exports only.

import { el } from "./memx_dom.js";
import { releaseWords } from "./memx_words.js";

export function drawHead(part, status, updated) {
  const said = status && status.active !== false
    ? `v${status.version} · ${status.source || "?"} · leak mode ${status.leak_mode} · ${releaseWords(status)}`
    : status ? `v${status.version} · off` : "";
  part.replaceChildren(
    el("span", { class: "memx-title" }, "comfy_memx"),
    el("span", { class: "memx-muted", "data-memx": "head-status" }, said,
       updated ? ` · ${new Date(updated).toLocaleTimeString()}` : ""));
}

// comfy_memx is off in this ComfyUI (a bad COMFY_MEMX_* setting at start-up): the error, the setting and what it
// accepts, and what to do.  Nothing else of the panel is drawn then: there is nothing to show.
export function drawOff(status) {
  return el("div", { class: "memx-off", role: "alert", "data-memx": "off" },
    el("div", { class: "memx-error" }, "comfy_memx is off in this ComfyUI"),
    el("div", {}, status.message || "start-up failed"),
    status.setting ? el("div", { class: "memx-kv" },
      el("span", {}, "setting"), el("span", {}, el("code", {}, status.setting)),
      el("span", {}, "accepted"), el("span", {}, status.accepted || "?")) : null,
    el("div", { class: "memx-fix" }, `Fix: ${status.fix || "see the comfy_memx line in ComfyUI's log"}`));
}
