// comfy_memx memory panel: the Leaks section.  One card per leaked model: holder chains with their pattern and
// fix, who built and who loaded it, how it was found; the Release button (POST /memx/models/{id}/release) where the
// holder is a pack's cache comfy_memx may cut, else why not; the receipt of the last click.  With no leak left it
// says how many were released, so that an automatic release is never silent.  Exports only.

import { el } from "./memx_dom.js";
import { FOUND_BY, createdBy, formatBytes, holderOf, who } from "./memx_words.js";

function chainList(leak) {
  const chains = (leak.referrers && leak.referrers.length ? leak.referrers : [holderOf(leak)]).filter(Boolean);
  return chains.map((chain) => el("div", { "data-memx": "chain" },
    el("div", { class: "memx-chain" }, chain.path),
    el("div", { class: "memx-muted" }, `package ${chain.holder_package || chain.package || "?"} · pattern `,
       el("code", {}, chain.pattern || "?")),
    chain.suggestion ? el("div", { class: "memx-fix", "data-memx": "fix" }, `Fix: ${chain.suggestion}`) : null));
}

// What the answer of a release (or of "Search again") says: [kind, first line, more lines...].
export function releaseLines({ status, body, searched }) {
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

// client: memx_client's; changed(): read the server again (the row may have gone).
export function makeLeaks(part, client, changed) {
  let releasing = null, released = null, models = [], releases = null;

  async function releaseModel(row) {
    releasing = row.model_id; draw();
    const answer = await client.post(`/memx/models/${encodeURIComponent(row.model_id)}/release`,
                                     row.release.path ? { path: row.release.path } : {});
    releasing = null;
    released = { model_id: row.model_id, ...answer };
    draw();
    changed();
  }

  async function searchAgain(modelId) {   // after "changed": a new search finds the cache as it is now
    releasing = modelId; draw();
    const answer = await client.post(`/memx/models/${encodeURIComponent(modelId)}/search`, {});
    releasing = null;
    released = { model_id: modelId, searched: true, ...answer };
    draw();
    changed();
  }

  function receiptCard() {
    const [kind, first, ...more] = releaseLines(released);
    const memory = ((released.body || {}).release || {}).memory;
    return el("div", { class: "memx-card", "data-memx": "release-receipt", "data-model-id": released.model_id },
      el("div", { class: "memx-name" }, `Release of ${released.model_id}`),
      el("div", { class: { ok: "memx-ok", error: "memx-error" }[kind], role: "status" }, first),
      ...more.filter(Boolean).map((line) => el("div", { class: line.startsWith("Fix:") ? "memx-fix" : "memx-muted" }, line)),
      (released.body || {}).error === "changed" && !released.searched ? el("div", { class: "memx-row" },
        el("button", { type: "button", "data-memx": "search-again", disabled: releasing !== null,
                       onclick: () => searchAgain(released.model_id) }, "Search again")) : null,
      memory && memory.before && memory.after ? el("div", { class: "memx-muted" },
        `Process memory: ${formatBytes(memory.before.rss)} before, ${formatBytes(memory.after.rss)} after`) : null);
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
    return el("div", { class: "memx-row" },
      el("button", { type: "button", "data-memx": "release-button", disabled: releasing !== null,
                     onclick: () => releaseModel(row) }, releasing === row.model_id ? "Releasing…" : "Release"),
      el("span", { class: "memx-muted" },
         `drops the model from ${row.leak.holder_package || "the pack"}'s cache so its memory can be freed`));
  }

  function leakCard(row) {
    const search = row.leak.search || {};
    const chains = chainList(row.leak);
    const made = createdBy(row);
    return el("div", { class: "memx-card memx-leaked", "data-memx": "leak", "data-model-id": row.model_id },
      el("div", { class: "memx-name" }, row.model_id),
      el("div", { class: "memx-muted" },
         `${row.leak.stage || "leaked"} · held by ${row.leak.holder_package || "?"}` +
         (made ? ` · created by ${made}` : "") + ` · loaded by ${who(row.owner)}` +
         (FOUND_BY[row.leak.found_by] ? ` · ${FOUND_BY[row.leak.found_by]}` : "")),
      chains.length ? chains : el("div", { class: "memx-muted" },
        `holder not found yet (search: ${search.result || search.note || "pending"})`),
      releaseControl(row));
  }

  function noLeak() {   // nothing leaked now; say what releases gave back, if any
    const cut = releases ? releases.cut : 0;
    const text = cut
      ? `no leaked model now · ${cut} released (${formatBytes(releases.released_bytes)} given back): see Released`
      : "no leaked model";
    return el("div", { class: "memx-muted", "data-memx": "no-leak" }, text);
  }

  function draw() {
    const leaked = models.filter((row) => row.leak);
    const receipt = released ? [receiptCard()] : [];
    part.replaceChildren(...receipt, ...(leaked.length ? leaked.map(leakCard) : [noLeak()]));
  }

  return {
    draw(rows, releaseList) { models = rows; releases = releaseList; draw(); },
  };
}
