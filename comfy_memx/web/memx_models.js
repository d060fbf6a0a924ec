// comfy_memx memory panel: the Models section, one card per model of /memx/models: state, size per device, who
// built it (when a pack built what another node loaded), who loaded it, who holds it, the last unload and why,
// loads and reloads.  Exports only.

import { el, facts } from "./memx_dom.js";
import { clock, createdBy, formatBytes, heldBy, who } from "./memx_words.js";

function modelCard(row) {
  const devices = Object.entries(row.bytes_by_device || {}).map(([d, n]) => `${formatBytes(n)} on ${d}`);
  const last = row.last_unload;
  const made = createdBy(row);
  const pairs = [["size", `${formatBytes(row.bytes)}${devices.length ? ` (${devices.join(", ")})` : ""}`]];
  if (made) pairs.push(["created by", made]);
  pairs.push(["loaded by", who(row.owner)], ["held by", heldBy(row)]);
  if (row.pinned_bytes) pairs.push(["pinned", formatBytes(row.pinned_bytes)]);
  if (last) pairs.push(["last unload", `${last.reason || "?"} by ${who(last.requested_by)} at ${clock(last.time)}`]);
  pairs.push(["loads", `${row.loads}, reloads ${row.reloads || 0}` +
    (row.reloads ? ` (${(row.reload_seconds || 0).toFixed(2)} s, ${formatBytes(row.reload_bytes)})` : "")]);
  return el("div", { class: `memx-card${row.state === "leaked" ? " memx-leaked" : ""}`, "data-memx": "model",
                     "data-model-id": row.model_id },
    el("div", {}, el("span", { class: "memx-name" }, row.model_id),
       el("span", { class: `memx-badge memx-state-${row.state}` }, row.state)),
    facts(pairs));
}

export function drawModels(part, models) {
  if (!models.length) {
    part.replaceChildren(el("div", { class: "memx-muted" }, "no model loaded yet"));
    return;
  }
  part.replaceChildren(...models.map(modelCard));
}
