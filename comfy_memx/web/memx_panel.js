// comfy_memx memory panel as a ComfyUI frontend extension: a sidebar tab ("Memory") that mounts memx_core.js.
// ComfyUI imports every .js of an extension folder; memx_core.js only exports, so importing it twice is harmless,
// and the window flag keeps a second copy of this file (two comfy_memx installs) from adding a second tab.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { mountPanel } from "./memx_core.js";

const TAB_ID = "comfy-memx-memory";

function register() {
  const manager = app.extensionManager;
  if (!manager || typeof manager.registerSidebarTab !== "function") {
    console.info("comfy_memx: this ComfyUI frontend has no sidebar tabs; the memory page is at /memx/");
    return;
  }
  manager.registerSidebarTab({
    id: TAB_ID,
    icon: "pi pi-chart-bar",
    title: "Memory",
    tooltip: "comfy_memx: model memory, leaks and Free",
    type: "custom",
    render: (element) => {
      element.style.height = "100%";
      mountPanel(element, { url: (path) => api.apiURL(path) });
    },
  });
}

if (!window.__comfyMemxPanel) {
  window.__comfyMemxPanel = true;
  app.registerExtension({ name: "comfy_memx.memory_panel", setup: register });
}
