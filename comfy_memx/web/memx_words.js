// comfy_memx memory panel: how figures and names read (bytes, times, who loaded or asked, who holds, the release
// setting, the receipts' terms).  Pure functions of the routes' JSON, no DOM.  Exports only.

export function formatBytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Math.abs(n), unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${n < 0 ? "-" : ""}${unit === 0 ? value : value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
}

export function clock(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "?";
}

// Who loaded a model (an owner: package, node, via) or asked for an unload (a requester of any kind the ledger
// writes: "node", "load" (the loading node), "http" (a route, never an address), "comfyui", "comfy_memx").
export function who(owner) {
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

// The pack that built a model (the row's created_by), when it is not the package that loaded it (ComfyUI's
// KSampler loads the UNet a pack's loader node built): "mypack · MyLoader (node 2)"; else null.
export function createdBy(row) {
  const made = row && row.created_by;
  if (!made || !made.package) return null;
  if (row.owner && row.owner.package === made.package) return null;
  return who(made);
}

// how a leak ComfyUI never warned about was found (a ComfyUI warning, the usual way, says nothing more)
export const FOUND_BY = { after_free: "found after a free", after_unload: "found after an unload" };

export function holderOf(leak) {
  if (!leak) return null;
  return leak.holder || (leak.referrers && leak.referrers[0]) || null;
}

// Who keeps a model alive, as its card says: the leak's holder, else (a model ComfyUI never warned about, say a
// survivor of a free) what the last holder search of it found, else ComfyUI while a ModelPatcher of it lives.
export function heldBy(row) {
  if (row.leak) return row.leak.holder_package || (holderOf(row.leak) && holderOf(row.leak).package) || "searching…";
  const searched = row.searched;
  if (searched && searched.holder) {
    return `${searched.holder.package || "?"} (${searched.holder.path || "?"}, searched ${clock(searched.time)})`;
  }
  if (row.state === "leaked") {
    return searched ? `not found (search: ${searched.result || "?"})` : "not searched yet (no ModelPatcher refers to it)";
  }
  return row.in_comfyui_loaded_list ? "ComfyUI (loaded list)" : "ComfyUI";
}

// The release setting as the startup line says it (core.registry.release_words).
export function releaseWords(status) {
  if (!status || !status.release) return "release ?";
  if (status.release !== "auto") return `release ${status.release}`;
  const packages = status.release_packages || [];
  return "release auto for " + (packages.length === 1 && packages[0] === "*" ? "every pack" : packages.join(", ") || "no pack");
}

// What started a release, in the words a person used to start it.
export const TRIGGERS = { http: "the Release button", free: "free --release", auto: "auto (COMFY_MEMX_RELEASE=auto)" };

// Why a survivor of a free is still in memory (the receipt's reason), defined where a person reads it.
export const SURVIVOR_REASONS = {
  leaked: "leaked: ComfyUI warned about it, or a pack was found holding it after a free or an unload",
  orphaned: "orphaned: no ModelPatcher refers to it any more, yet something keeps its weights in memory",
  kept: "kept: a ModelPatcher of it outlived ComfyUI's emptied caches (a node's output or a pack holds the MODEL)",
};

// Only models whose memory is gone count as freed; one unloaded from its device but still in RAM (every unload on
// --cpu, or a survivor) is unloaded, never freed (as `python -m comfy_memx free` says).
export function freedHeadline(receipt) {
  const unloaded = receipt.freed || [];
  const gone = unloaded.filter((row) => row.released).length;
  return `Freed ${formatBytes(receipt.released_bytes)} (${gone} model(s) gone from memory); ` +
    `unloaded ${formatBytes(receipt.freed_bytes)} from ${unloaded.length} model(s)` +
    (unloaded.length > gone ? `, ${unloaded.length - gone} of them still in RAM` : "");
}
