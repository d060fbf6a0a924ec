// comfy_memx memory panel: its stylesheet, in ComfyUI's own CSS variables (so it follows ComfyUI's palette; the
// standalone page sets them from the browser's light or dark preference).  Long names and holder paths wrap inside
// their card (overflow-wrap: anywhere) instead of running off the sidebar's edge.  Exports only.

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
.memx-panel .memx-fill.memx-fill-leaked { background: var(--error-text, #ff4444); }
.memx-panel .memx-card { border: 1px solid var(--border-color, #4e4e4e); border-radius: 6px; padding: 6px 8px;
  margin: 6px 0; background: var(--comfy-input-bg, #2a2a2a); min-width: 0; overflow-wrap: anywhere; }
.memx-panel .memx-card.memx-released { border-color: #3d9a50; }
.memx-panel .memx-off { border: 1px solid var(--error-text, #ff4444); border-radius: 6px; padding: 6px 8px;
  margin: 6px 0; overflow-wrap: anywhere; }
.memx-panel .memx-card.memx-leaked { border-color: var(--error-text, #ff4444); }
.memx-panel .memx-name { font-weight: 600; word-break: break-all; }
.memx-panel .memx-badge { display: inline-block; font-size: 11px; padding: 0 6px; border-radius: 8px; margin-left: 6px;
  border: 1px solid currentColor; }
.memx-panel .memx-state-loaded { color: #3d9a50; }
.memx-panel .memx-state-offloaded { color: var(--descrip-text, #999); }
.memx-panel .memx-state-leaked { color: var(--error-text, #ff4444); }
.memx-panel .memx-kv { display: grid; grid-template-columns: 7.5em minmax(0, 1fr); gap: 0 6px; font-size: 12px; }
.memx-panel .memx-kv > * { min-width: 0; overflow-wrap: anywhere; }
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

export function installStyle() {
  if (!document.getElementById("memx-panel-style")) {
    const style = document.createElement("style");
    style.id = "memx-panel-style";
    style.textContent = STYLE;
    document.head.append(style);
  }
}
