// comfy_memx memory panel: the Timeline section, from GET /memx/timeline: loaded bytes per model since the server
// started, a lane per model, with loads (▲), unloads (▽), leaks (✕), releases (◆: a pack's cache entry cut; a model
// it freed has a line that ends there) and frees (dashed, across every lane) marked; hover a mark for when, why and
// who.  Exports only.

import { el, svg } from "./memx_dom.js";
import { TRIGGERS, clock, formatBytes, who } from "./memx_words.js";

const TIMELINE_MIN = 170;   // px: the timeline's least height; it grows by a lane per model past that
const LANE_MIN = 26;        // px: the least height of one model's lane
const LANE_GAP = 3;         // px: the space at the top and bottom of each lane that no line enters
const LINE_COLOURS = ["#4e9af1", "#e8a33d", "#59b368", "#b57be0", "#e0607e", "#3fb8b0", "#c9b43a", "#8d8d8d"];
const RELEASE_COLOUR = "#2e9e4f";

function releaseDetail(entry) {
  if (entry.kind !== "release") return "";
  return ` (by ${TRIGGERS[entry.trigger] || entry.trigger || "?"}: cut ${entry.cut || "?"} of ${entry.package || "?"}; ` +
    (entry.died ? `${formatBytes(entry.bytes)} given back, the model is gone)` : "the model is still held)");
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
  if (kind === "release") {   // a diamond: a pack's cache entry was cut (the lane ends here when the model died)
    return svg("path", { d: `M${cx},${cy - 5} L${cx + 5},${cy} L${cx},${cy + 5} L${cx - 5},${cy} Z`,
                         fill: RELEASE_COLOUR, stroke: "var(--comfy-menu-bg, #202020)" });
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
export function drawTimeline(part, { entries, models, started, now, dropped }) {
  const start = started, end = now;
  if (!start || !end) { part.replaceChildren(); return; }
  const width = Math.max(240, Math.round(part.clientWidth || 600));
  const left = 44, right = 8, top = 8, bottom = 18;
  const lines = modelLines(entries, models, start, end);
  const lanes = new Map([...lines.keys()].map((modelId, index) => [modelId, index]));
  for (const entry of entries) {   // a model with marks but no line yet (a leak of a model loaded before)
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
  for (const entry of entries) {
    const lane = lanes.get(entry.model_id);
    const colour = colours.get(entry.model_id) || "currentColor";
    const cx = x(entry.time), cy = lane === undefined ? y(0, 0) : y(lane, entry.loaded_bytes || 0);
    const label = `${clock(entry.time)} ${entry.kind} ${entry.model_id || ""}` + releaseDetail(entry) +
      (entry.reason ? ` (${entry.reason}${entry.requested_by ? ` by ${who(entry.requested_by)}` : ""})` : "") +
      (entry.holder_package ? ` held by ${entry.holder_package}` : "");
    const mark = markOf(entry.kind, cx, cy, colour, top, height - bottom);
    mark.setAttribute("class", `memx-mark memx-mark-${entry.kind}`);
    mark.append(svg("title", {}, label));
    chart.append(mark);
  }
  const freed = new Set(entries.filter((e) => e.kind === "release" && e.died).map((e) => e.model_id));
  const legend = el("div", { class: "memx-legend", "data-memx": "timeline-legend" }, ...[...lanes.keys()].map((modelId) =>
    el("span", { "data-model-id": modelId },
       el("span", { class: "memx-swatch", style: `background:${colours.get(modelId)}` }), modelId,
       freed.has(modelId) ? " ◆ released" : "")));
  const counts = ["load", "unload", "leak", "release", "free"].map((kind) =>
    `${entries.filter((e) => e.kind === kind).length} ${kind}`).join(" · ");
  part.replaceChildren(chart, legend,
    el("div", { class: "memx-muted", "data-memx": "timeline-key" },
       `a lane per model, top to bottom as listed, each 0 to ${formatBytes(peak)} · ▲ load ▽ unload ✕ leak `,
       el("span", { style: `color:${RELEASE_COLOUR}` }, "◆"), " release (the lane of a model it freed ends there) ",
       `┆ free — ${counts}` + (dropped ? ` (${dropped} older entries dropped)` : "")));
}

