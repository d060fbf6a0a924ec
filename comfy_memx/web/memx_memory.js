// comfy_memx memory panel: the Memory section.  The machine's RAM in use (ComfyUI's /system_stats), then this
// ComfyUI process's own resident memory (/memx/status's process.rss_bytes) and what its leaked models hold (the
// /memx/models rows in state "leaked", as the comfy_memx_leaked_bytes metric counts them), each against the
// machine's RAM; VRAM per GPU; pinned host memory against the cap in force.  Exports only.

import { el } from "./memx_dom.js";
import { formatBytes } from "./memx_words.js";

function bar(label, used, total, testId, fill = "") {
  const share = total > 0 ? Math.min(1, Math.max(0, used / total)) : 0;
  return el("div", { class: "memx-bar", "data-memx": testId },
    el("span", {}, label),
    el("div", { class: "memx-track" },
       el("div", { class: `memx-fill${fill}`, style: `width:${(share * 100).toFixed(1)}%` })),
    el("span", { class: "memx-muted" }, total ? `${formatBytes(used)} / ${formatBytes(total)}` : formatBytes(used)));
}

export function leakedBytes(models) {
  return models.filter((row) => row.state === "leaked").reduce((sum, row) => sum + (row.bytes || 0), 0);
}

export function drawMemory(part, { stats, status, models }) {
  const rows = [];
  const system = stats && stats.system;
  const total = system && system.ram_total;
  if (total) rows.push(bar("RAM (machine)", total - system.ram_free, total, "ram"));
  const rss = status && status.process && status.process.rss_bytes;
  if (rss !== undefined && rss !== null) rows.push(bar("ComfyUI (RSS)", rss, total || 0, "rss"));
  const leaked = leakedBytes(models);
  const count = models.filter((row) => row.state === "leaked").length;
  rows.push(bar(`Leaked (${count})`, leaked, total || 0, "leaked", leaked ? " memx-fill-leaked" : ""));
  for (const device of (stats && stats.devices) || []) {
    if (!device.vram_total || device.type === "cpu") continue;
    rows.push(bar(`VRAM ${device.type}:${device.index ?? 0}`, device.vram_total - device.vram_free,
                  device.vram_total, "vram"));
  }
  if (stats && !rows.some((row) => row.dataset.memx === "vram")) {
    rows.push(el("div", { class: "memx-muted", "data-memx": "vram" }, "VRAM: no GPU (ComfyUI runs on the CPU)"));
  }
  const pins = status && status.pins;
  if (pins) {
    const cap = pins.cap_bytes ?? pins.comfyui_cap_bytes;
    const capped = cap !== null && cap !== undefined && cap >= 0;
    rows.push(bar("Pinned", pins.pinned_bytes, capped ? cap : 0, "pinned"));
    if (!capped) rows.push(el("div", { class: "memx-muted" }, cap < 0 ? "pinned memory is off in ComfyUI" : "no pinned-memory cap"));
  }
  part.replaceChildren(...rows);
}
