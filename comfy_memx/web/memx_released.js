// comfy_memx memory panel: the Released section, from GET /memx/releases (the last 64 releases tried in this
// ComfyUI, whatever started them: the Release button, free --release, COMFY_MEMX_RELEASE=auto).  One card per
// release that cut a pack's cache entry, newest first: the models it freed, the bytes given back, what was cut and
// of which pack, by what, when, and the process's RSS before and after; one line for the tries that cut nothing.
// Exports only.

import { el, facts } from "./memx_dom.js";
import { TRIGGERS, clock, formatBytes } from "./memx_words.js";

const CUT = ["released", "survivor"];

function models(receipt) {
  return receipt.models && receipt.models.length ? receipt.models
    : [{ model: receipt.model, model_id: receipt.model_id, bytes: receipt.bytes, died: receipt.died }];
}

function releasedBytes(receipt) {
  if (typeof receipt.released_bytes === "number") return receipt.released_bytes;
  return models(receipt).filter((model) => model.died).reduce((sum, model) => sum + (model.bytes || 0), 0);
}

function memoryText(memory) {
  if (!memory || !memory.before || !memory.after) return "not read";
  const trim = memory.trim_returned_bytes;
  return `${formatBytes(memory.before.rss)} before, ${formatBytes(memory.after.rss)} after` +
    (trim !== undefined && trim !== null ? ` (malloc_trim returned ${formatBytes(trim)})` : "");
}

function releaseCard(receipt) {
  const all = models(receipt);
  const gone = all.filter((model) => model.died);
  const kept = all.filter((model) => !model.died);
  const pairs = [
    ["given back", `${formatBytes(releasedBytes(receipt))}` + (gone.length ? ` (${gone.map((m) => m.model_id).join(", ")} gone from memory)` : "")],
    ["cut", receipt.cut || receipt.path || "?"],
    ["pack", `${receipt.package || "?"}${receipt.pattern ? ` · ${receipt.pattern}` : ""}`],
    ["by", TRIGGERS[receipt.trigger] || receipt.trigger || "?"],
    ["when", clock(receipt.time)],
    ["RSS", memoryText(receipt.memory)],
  ];
  if (kept.length) {
    const next = receipt.next_holder;
    pairs.push(["still held", `${kept.map((m) => m.model_id).join(", ")}` +
      (next && next.path ? ` by ${next.path} (${next.package || "?"})`
                         : ` (${(next && next.note) || "no other holder found yet"})`)]);
  }
  return el("div", { class: "memx-card memx-released", "data-memx": "released", "data-model-id": receipt.model_id,
                     "data-trigger": receipt.trigger },
    el("div", { class: "memx-name" }, all.map((model) => model.model_id).join(", ")), facts(pairs));
}

export function drawReleased(part, answer) {
  if (!answer) { part.replaceChildren(); return; }
  const receipts = answer.releases || [];
  const cut = receipts.filter((receipt) => CUT.includes(receipt.outcome)).reverse();
  const others = receipts.filter((receipt) => !CUT.includes(receipt.outcome));
  const byTrigger = {};
  for (const receipt of cut) byTrigger[receipt.trigger] = (byTrigger[receipt.trigger] || 0) + 1;
  const summary = cut.length
    ? `${cut.length} release(s) gave back ${formatBytes(cut.reduce((sum, r) => sum + releasedBytes(r), 0))} (` +
      Object.entries(byTrigger).map(([trigger, n]) => `${n} by ${TRIGGERS[trigger] || trigger}`).join(", ") + ")"
    : "nothing released yet";
  const last = others[others.length - 1];
  const notCut = others.length ? [el("div", { class: "memx-muted", "data-memx": "released-not-cut" },
    `${others.length} release(s) cut nothing; the last: ${last.model_id} ${last.outcome}` +
    (last.reason ? ` (${last.reason})` : ""))] : [];
  part.replaceChildren(el("div", { class: "memx-muted", "data-memx": "released-summary" }, summary),
                       ...cut.map(releaseCard), ...notCut);
}
