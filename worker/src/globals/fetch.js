// fetch (helper safety.http/v1) with the reference runtime's response object
// (reference-runtime.md §4): installed only when the posture grants network. The request is
// made by the supervisor's broker; text(), json() and arrayBuffer() are synchronous (the
// catalog never awaits them), fetch itself returns a promise so `await`, `.then` and
// Promise.all work.
(function (h) {
  "use strict";
  const KIND = { SECURITY: "SecurityError", INVALID_INPUT: "InvalidInputError", HELPER_RUNTIME: "HelperRuntimeError" };
  const typed = (kind, msg) => { const e = new Error(msg); e.name = KIND[kind]; return e; };
  const { fetch: hostFetch, decode } = h;
  const isView = ArrayBuffer.isView, slice = Function.prototype.call.bind(ArrayBuffer.prototype.slice);

  function body(b) {
    if (b === undefined || b === null) return undefined;
    if (typeof b === "string") return b;
    if (b instanceof ArrayBuffer) return new Uint8Array(b);
    if (isView(b)) return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    if (Array.isArray(b)) return Uint8Array.from(b, (x) => x & 0xff);
    if (typeof b === "object" && typeof b.toString === "function" && b.constructor && b.constructor.name === "URLSearchParams") return String(b);
    throw typed("INVALID_INPUT", "[fetch] body must be a string, an ArrayBuffer, a typed array or an array of bytes");
  }

  function headerPairs(hs) {
    const out = [];
    if (hs === undefined || hs === null) return out;
    if (typeof hs !== "object") throw typed("INVALID_INPUT", "[fetch] headers must be an object");
    if (typeof hs.forEach === "function" && !Array.isArray(hs)) { hs.forEach((v, k) => out.push([String(k), String(v)])); return out; }
    if (Array.isArray(hs)) { for (const p of hs) out.push([String(p[0]), String(p[1])]); return out; }
    for (const k of Object.keys(hs)) if (hs[k] !== undefined) out.push([k, String(hs[k])]);
    return out;
  }

  function count(v, what) {
    if (v === undefined || v === null) return undefined;
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0) throw typed("INVALID_INPUT", `[fetch] ${what} must be a non-negative number`);
    return Math.floor(n);
  }

  class Headers {
    #pairs;
    constructor(pairs) { this.#pairs = pairs; }
    get(name) {
      const n = String(name).toLowerCase();
      const vs = this.#pairs.filter((p) => p[0] === n).map((p) => p[1]);
      return vs.length ? vs.join(", ") : null;
    }
    has(name) { return this.get(name) !== null; }
    forEach(fn, self) { for (const k of this.keys()) fn.call(self, this.get(k), k, this); }
    *keys() { const seen = []; for (const p of this.#pairs) if (!seen.includes(p[0])) { seen.push(p[0]); yield p[0]; } }
    *values() { for (const k of this.keys()) yield this.get(k); }
    *entries() { for (const k of this.keys()) yield [k, this.get(k)]; }
    [Symbol.iterator]() { return this.entries(); }
  }

  class Response {
    #body;
    constructor(r) {
      this.#body = r.body;
      this.status = r.status;
      this.ok = r.status >= 200 && r.status <= 299;
      this.statusText = r.statusText;
      this.url = r.url;
      this.headers = new Headers(r.headers);
      this.truncated = r.truncated;
      this.nextStartIndex = r.nextStartIndex === undefined ? null : r.nextStartIndex;
      this.contentType = this.headers.get("content-type") || "";
    }
    text() { return decode(new Uint8Array(this.#body)); }
    json() {
      const t = this.text();
      try { return JSON.parse(t); } catch (e) { throw typed("HELPER_RUNTIME", `[fetch] invalid json: ${e.message}`); }
    }
    arrayBuffer() { return slice(this.#body, 0); }
  }

  function fetch(input, init) {
    try {
      const o = init === undefined || init === null ? {} : init;
      const url = String(input && typeof input === "object" && "href" in input ? input.href : input);
      const r = hostFetch(url, o.method === undefined ? "GET" : String(o.method), headerPairs(o.headers),
        body(o.body), count(o.startIndex, "startIndex") || 0, count(o.maxLength, "maxLength"));
      return Promise.resolve(new Response(r));
    } catch (e) {
      return Promise.reject(e);
    }
  }
  Object.defineProperty(globalThis, "fetch", { value: fetch, writable: true, configurable: true, enumerable: false });
})
