// URL and URLSearchParams, compiled on first use (prelude.js `load`).
(function (host) {
  "use strict";
  // ---- URL and URLSearchParams (WHATWG; parsing and serialisation by the url crate) ----
  const PARTS = Symbol("url parts"), LIST = Symbol("params list"), OWNER = Symbol("params owner");
  class URLSearchParams {
    constructor(init = "") {
      this[LIST] = [];
      this[OWNER] = null;
      if (init instanceof URLSearchParams) this[LIST] = init[LIST].map(([k, v]) => [k, v]);
      else if (init !== null && typeof init === "object") {
        if (typeof init[Symbol.iterator] === "function") {
          for (const pair of init) {
            const p = Array.from(pair);
            if (p.length !== 2) throw new TypeError("Each query pair must be an iterable [name, value] tuple");
            this[LIST].push([String(p[0]), String(p[1])]);
          }
        } else {
          for (const k of Object.keys(init)) this[LIST].push([k, String(init[k])]);
        }
      } else {
        const s = String(init);
        this[LIST] = host.formParse(s.startsWith("?") ? s.slice(1) : s);
      }
    }
    _update() { if (this[OWNER]) this[OWNER]._setSearch(this.toString()); }
    get size() { return this[LIST].length; }
    append(name, value) { this[LIST].push([String(name), String(value)]); this._update(); }
    delete(name, value) {
      const n = String(name);
      this[LIST] = this[LIST].filter(([k, v]) => !(k === n && (value === undefined || v === String(value))));
      this._update();
    }
    get(name) { const e = this[LIST].find(([k]) => k === String(name)); return e ? e[1] : null; }
    getAll(name) { return this[LIST].filter(([k]) => k === String(name)).map(([, v]) => v); }
    has(name, value) { return this[LIST].some(([k, v]) => k === String(name) && (value === undefined || v === String(value))); }
    set(name, value) {
      const n = String(name), v = String(value);
      const i = this[LIST].findIndex(([k]) => k === n);
      if (i < 0) this[LIST].push([n, v]);
      else { this[LIST][i][1] = v; this[LIST] = this[LIST].filter(([k], j) => k !== n || j === i); }
      this._update();
    }
    sort() {
      // Stable, by UTF-16 code units of the name.
      this[LIST] = this[LIST].map((e, i) => [e, i]).sort((a, b) => (a[0][0] < b[0][0] ? -1 : a[0][0] > b[0][0] ? 1 : a[1] - b[1])).map(([e]) => e);
      this._update();
    }
    forEach(cb, thisArg) { for (const [k, v] of this[LIST]) cb.call(thisArg, v, k, this); }
    *entries() { for (const [k, v] of this[LIST]) yield [k, v]; }
    *keys() { for (const [k] of this[LIST]) yield k; }
    *values() { for (const [, v] of this[LIST]) yield v; }
    [Symbol.iterator]() { return this.entries(); }
    toString() { return host.formSerialize(this[LIST]); }
  }
  Object.defineProperty(URLSearchParams.prototype, Symbol.toStringTag, { value: "URLSearchParams" });

  class URL {
    constructor(url, base) {
      const parts = host.urlParse(String(url), base === undefined ? undefined : String(base));
      if (!parts) throw new TypeError(`Invalid URL: ${url}`);
      this[PARTS] = parts;
      const sp = new URLSearchParams(parts.search);
      sp[OWNER] = this;
      Object.defineProperty(this, "searchParams", { value: sp, enumerable: false });
    }
    static canParse(url, base) { return host.urlParse(String(url), base === undefined ? undefined : String(base)) != null; }
    static parse(url, base) { try { return new URL(url, base); } catch (e) { return null; } }
    _set(field, value) {
      this[PARTS] = host.urlSet(this[PARTS].href, field, String(value));
      if (field !== "search" && field !== "hash") this.searchParams[LIST] = host.formParse(this[PARTS].search.slice(1));
      if (field === "search") this.searchParams[LIST] = host.formParse(this[PARTS].search.slice(1));
    }
    _setSearch(s) { this[PARTS] = host.urlSet(this[PARTS].href, "search", s); }
    toString() { return this[PARTS].href; }
    toJSON() { return this[PARTS].href; }
  }
  for (const f of ["href", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"]) {
    Object.defineProperty(URL.prototype, f, {
      get() { return this[PARTS][f]; },
      set(v) { this._set(f, v); },
      enumerable: true, configurable: true,
    });
  }
  Object.defineProperty(URL.prototype, "origin", { get() { return this[PARTS].origin; }, enumerable: true, configurable: true });
  Object.defineProperty(URL.prototype, Symbol.toStringTag, { value: "URL" });

  return { URL, URLSearchParams };
})
