// Tiny DOM helpers. Text is always set with textContent, never parsed as HTML, so nothing a
// person or a model wrote can run in the page.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "testid") el.dataset.testid = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "data") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = dv;
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// An image is shown only when inline (data:image/…) or from this server (a path): the page's
// policy loads no image from elsewhere, so such an avatar shows its letter instead.
export function safeImage(url) {
  if (typeof url !== "string") return null;
  return /^(data:image\/|\/(?![\/\\]))/i.test(url) ? url : null;
}

export function avatar(name, url, size = 16) {
  const src = safeImage(url);
  // Sizes are classes: the page's policy allows no inline style attributes.
  if (src) return h("img", { class: `avatar s${size}`, src, alt: "", width: size, height: size });
  const letter = (name || "?").trim().charAt(0).toUpperCase() || "?";
  return h("span", { class: `avatar letter s${size}`, "aria-hidden": "true" }, letter);
}

export function time(ms) {
  if (typeof ms !== "number" || !ms) return "";
  return new Date(ms).toLocaleString();
}

// Keys may be camelCase or snake_case while the API settles on one casing: accept both.
export function pick(obj, ...keys) {
  if (!obj) return undefined;
  for (const k of keys) {
    if (obj[k] !== undefined && obj[k] !== null) return obj[k];
    const snake = k.replace(/[A-Z]/g, (m) => "_" + m.toLowerCase());
    if (obj[snake] !== undefined && obj[snake] !== null) return obj[snake];
    const camel = k.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
    if (obj[camel] !== undefined && obj[camel] !== null) return obj[camel];
  }
  return undefined;
}
