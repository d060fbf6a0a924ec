// comfy_memx memory panel: building DOM and SVG nodes.  Every text goes in as a text node (textContent), never
// through innerHTML, so nothing the server says can become markup.  Exports only (ComfyUI imports every .js of the
// extension folder).

const SVG_NS = "http://www.w3.org/2000/svg";

function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// el("div", { class: "memx-card", "data-memx": "leak", onclick: f }, child, "text", ...)
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return append(node, children);
}

export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return append(node, children);
}

// A two-column list of facts ([label, value] pairs) as the cards show them.
export function facts(pairs) {
  return el("div", { class: "memx-kv" }, ...pairs.flatMap(([key, value]) => [el("span", {}, key), el("span", {}, value)]));
}
