// safety.parser.html's document classes, compiled on first use (prelude.js `load`).
(function (host, htmlHost) {
  "use strict";
  const call = (fn) => {
    try { return fn(); } catch (e) {
      const m = /^INVALID_INPUT: ([\s\S]*)$/.exec(e && e.message);
      if (!m) throw e;
      const err = new Error(m[1]);
      err.name = "InvalidInputError";
      throw err;
    }
  };
  // A jsoup-like view over a document held on the host (safety.parser.html).
  const H = Symbol("html handle");
  const wrapAll = (handles) => new HtmlElements(handles.map((h) => new HtmlElement(h)));
  class HtmlElement {
    constructor(h) { Object.defineProperty(this, H, { value: h }); }
    select(css) { return wrapAll(call(() => htmlHost.select(this[H], String(css)))); }
    text() { return htmlHost.text(this[H]); }
    attr(name) { return htmlHost.attr(this[H], String(name)); }
    hasAttr(name) { return htmlHost.hasAttr(this[H], String(name)); }
    tagName() { return htmlHost.tag(this[H]); }
    html() { return htmlHost.html(this[H], false); }
    outerHtml() { return htmlHost.html(this[H], true); }
    children() { return wrapAll(htmlHost.children(this[H])); }
    remove() { htmlHost.remove(this[H]); return this; }
    after(html) { call(() => htmlHost.insert(this[H], String(html), true)); return this; }
    append(html) { call(() => htmlHost.insert(this[H], String(html), false)); return this; }
    toString() { return this.outerHtml(); }
  }
  class HtmlDocument extends HtmlElement {
    title() { const t = this.select("title").first(); return t ? t.text() : ""; }
    body() { return this.select("body").first(); }
    head() { return this.select("head").first(); }
  }
  class HtmlElements {
    constructor(list) { Object.defineProperty(this, "_list", { value: list }); }
    size() { return this._list.length; }
    get length() { return this._list.length; }
    isEmpty() { return this._list.length === 0; }
    get(i) {
      if (!Number.isInteger(i) || i < 0 || i >= this._list.length) throw new RangeError(`Index ${i} out of bounds for length ${this._list.length}`);
      return this._list[i];
    }
    first() { return this._list.length ? this._list[0] : null; }
    last() { return this._list.length ? this._list[this._list.length - 1] : null; }
    text() { return this._list.map((e) => e.text()).filter((t) => t !== "").join(" "); }
    eachText() { return this._list.map((e) => e.text()).filter((t) => t !== ""); }
    attr(name) { const e = this._list.find((x) => x.hasAttr(String(name).replace(/^abs:/, ""))); return e ? e.attr(name) : ""; }
    select(css) { return new HtmlElements(this._list.flatMap((e) => e.select(css)._list)); }
    remove() { for (const e of this._list) e.remove(); return this; }
    forEach(cb) { this._list.forEach(cb); }
    map(cb) { return this._list.map(cb); }
    toArray() { return this._list.slice(); }
    [Symbol.iterator]() { return this._list[Symbol.iterator](); }
  }
  return (input) => new HtmlDocument(call(() => htmlHost.parse(String(input ?? ""))));
})
