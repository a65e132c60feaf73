// Intl.ListFormat on ICU4X (intl/text.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.ListFormat";
  const strings = (list) => {
    if (list === undefined) return [];
    const out = [];
    for (const x of list) {
      if (typeof x !== "string") throw new TypeError(`Iterable yielded ${String(x)} which is not a string`);
      out.push(x);
    }
    return out;
  };
  class ListFormat {
    constructor(locales, options) {
      const { locale } = u.resolve(locales);
      const o = u.options(options);
      this._r = {
        locale,
        type: u.pick(o, "type", ["conjunction", "disjunction", "unit"], "conjunction", NAME),
        style: u.pick(o, "style", ["long", "short", "narrow"], "long", NAME),
      };
      this._json = JSON.stringify(this._r);
    }
    formatToParts(list) {
      return I.list(this._r.locale, this._json, strings(list)).map(([type, value]) => ({ type, value }));
    }
    format(list) { return this.formatToParts(list).map((p) => p.value).join(""); }
    resolvedOptions() { return Object.assign({}, this._r); }
    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(ListFormat.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return ListFormat;
})
