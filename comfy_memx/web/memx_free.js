// comfy_memx memory panel: the Free section.  The Free button (POST /memx/free: unload every model and empty
// ComfyUI's caches) and its receipt: what was freed (only models whose memory is gone count), the survivors with
// their holders and fixes and what their reason means, the process memory before and after; the token field.
// Exports only.

import { el } from "./memx_dom.js";
import { answerText } from "./memx_client.js";
import { SURVIVOR_REASONS, formatBytes, freedHeadline, holderOf } from "./memx_words.js";

function survivorItem(row) {
  const holders = row.holders || (row.leak && row.leak.referrers) || [];
  const first = holders[0] || holderOf(row.leak);
  return el("li", { "data-memx": "survivor" },
    `${row.model_id} (${row.reason}, ${formatBytes(row.bytes)}) held by ` +
    `${(first && (first.holder_package || first.package)) || (row.leak && row.leak.holder_package) || "?"}`,
    first ? el("div", { class: "memx-chain" }, first.path) : null,
    first && first.suggestion ? el("div", { class: "memx-fix" }, `Fix: ${first.suggestion}`) : null,
    row.search && row.search.note ? el("div", { class: "memx-muted" }, row.search.note) : null);
}

function memoryLine(memory) {
  const trim = memory.trim || {};
  return `Process memory: ${formatBytes(memory.rss_before)} before, ${formatBytes(memory.rss_after)} after` +
    (trim.returned_bytes !== undefined && trim.returned_bytes !== null ? `; malloc_trim returned ${formatBytes(trim.returned_bytes)}` : "") +
    (trim.skipped ? `; trim skipped (${trim.skipped})` : "") +
    (memory.held_bytes !== undefined ? `; still held by models ${formatBytes(memory.held_bytes)}` : "");
}

export function receiptCard(receipt) {
  const survivors = receipt.survivors || [];
  const notSearched = survivors.map((s) => s.search && s.search.note).find((note) => note && note.startsWith("not searched: holder"));
  const reasons = [...new Set(survivors.map((row) => row.reason))].filter((reason) => SURVIVOR_REASONS[reason]);
  return el("div", { class: "memx-card", "data-memx": "receipt" },
    el("div", { class: "memx-name" }, `Receipt: ${receipt.status}` + (receipt.waited_s !== undefined ? ` after ${receipt.waited_s} s` : "")),
    receipt.note ? el("div", { class: "memx-muted" }, receipt.note) : null,
    el("div", { "data-memx": "freed-headline" }, freedHeadline(receipt)),
    (receipt.freed || []).length ? el("ul", { "data-memx": "freed" }, ...receipt.freed.map((row) =>
      el("li", {}, `${row.model_id}: ${formatBytes(row.unloaded_bytes)} unloaded from ${row.device}, ` +
                   (row.released ? "gone from memory" : "still in RAM")))) : null,
    el("div", {}, `Survivors: ${survivors.length} (${formatBytes(receipt.survivor_bytes)})`),
    survivors.length ? el("ul", { "data-memx": "survivors" }, ...survivors.map(survivorItem)) : null,
    reasons.length ? el("div", { class: "memx-muted", "data-memx": "survivor-terms" },
      ...reasons.map((reason) => el("div", {}, SURVIVOR_REASONS[reason]))) : null,
    notSearched ? el("div", { class: "memx-error" }, "Holder searches need loopback or the server's token: enter COMFY_MEMX_TOKEN below.") : null,
    el("div", { class: "memx-muted", "data-memx": "retention" }, memoryLine(receipt.memory || {})));
}

// client: memx_client's; changed(): read the server again after a free.
export function mountFree(part, client, changed) {
  let freeing = false, error = null, receipt = null;
  const button = el("button", { type: "button", onclick: free, "data-memx": "free-button" }, "Free memory");
  const token = el("input", { type: "password", placeholder: "COMFY_MEMX_TOKEN (remote only)", value: client.token,
                              "aria-label": "comfy_memx token", autocomplete: "off" });
  token.addEventListener("change", () => client.setToken(token.value.trim()));
  const result = el("div", {});
  part.replaceChildren(
    el("div", { class: "memx-row" }, button,
       el("span", { class: "memx-muted" }, "unloads every model and empties ComfyUI's caches")),
    el("div", { class: "memx-row" }, token, el("span", { class: "memx-muted" }, "kept in this browser only")),
    result);

  function draw() {
    button.disabled = freeing;
    button.textContent = freeing ? "Freeing…" : "Free memory";
    result.replaceChildren(...[
      error ? el("div", { class: "memx-error", role: "alert", "data-memx": "free-error" }, error) : null,
      receipt ? receiptCard(receipt) : null].filter(Boolean));
  }

  async function free() {
    freeing = true; error = null; draw();
    const answer = await client.post("/memx/free", { unload_models: true, free_memory: true });
    if (answer.status === 403) {
      error = `Refused (${answerText(answer, "Forbidden")}). From another machine, enter the server's COMFY_MEMX_TOKEN below.`;
    } else if (answer.status === 0) {
      error = `Free failed: ${(answer.body && answer.body.message) || "no answer"}`;
    } else if ((answer.status < 200 || answer.status >= 300) || !answer.body) {
      error = `Free failed: ${answerText(answer)}`;
    } else {
      receipt = answer.body;
    }
    freeing = false;
    draw();
    changed();
  }

  draw();
}
