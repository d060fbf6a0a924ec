// comfy_memx memory panel: talking to the server.  Reads of comfy_memx's routes and ComfyUI's /system_stats, the
// POSTs with the token (X-Memx-Token) a person entered, which this browser keeps in localStorage only.  Exports only.

const TOKEN_KEY = "comfy_memx.token";
const TOKEN_HEADER = "X-Memx-Token";

export function readToken() {
  try { return window.localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
}

export function saveToken(value) {
  try {
    if (value) window.localStorage.setItem(TOKEN_KEY, value); else window.localStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* private mode: the token lasts for this page only */ }
}

// "403: the message" of an answer's error JSON, else "403" and the status text.
export function answerText({ status, body }, statusText = "") {
  return body && body.message ? `${status}: ${body.message}` : `${status} ${statusText}`.trim();
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.message) return `${response.status}: ${body.message}`;
  } catch (e) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

// url(path) -> the address of a server path (ComfyUI's api.apiURL in the sidebar, the page's base on /memx/).
export function makeClient(url) {
  let token = readToken();

  function headers() {   // the token, when one was entered, for the routes that need loopback or it
    const sent = { "Content-Type": "application/json" };
    if (token) sent[TOKEN_HEADER] = token;
    return sent;
  }

  async function getJson(path) {
    const response = await fetch(url(path), { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: ${await errorText(response)}`);
    return response.json();
  }

  // GET /memx/status; while a bad setting keeps comfy_memx off, the node pack answers 503 with "active": false and
  // why: that answer is returned, not thrown.
  async function getStatus() {
    const response = await fetch(url("/memx/status"), { cache: "no-store" });
    if (response.status === 503) {
      const body = await response.json().catch(() => null);
      if (body && body.active === false) return body;
    }
    if (!response.ok) throw new Error(`/memx/status: ${await errorText(response)}`);
    return response.json();
  }

  async function post(path, body) {   // -> { status, body }; status 0 when the server did not answer
    try {
      const response = await fetch(url(path), { method: "POST", headers: headers(), body: JSON.stringify(body) });
      return { status: response.status, body: await response.json().catch(() => null) };
    } catch (error) {
      return { status: 0, body: { message: error.message } };
    }
  }

  return {
    getJson, getStatus, post,
    get token() { return token; },
    setToken(value) { token = value; saveToken(value); },
  };
}
