// Intl.Collator on ICU4X (intl/text.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.Collator";
  class Collator {
    constructor(locales, options) {
      const { locale, ext } = u.resolve(locales);
      const o = u.options(options);
      const r = { locale };
      r.usage = u.pick(o, "usage", ["sort", "search"], "sort", NAME);
      r.sensitivity = u.pick(o, "sensitivity", ["base", "accent", "case", "variant"], "variant", NAME);
      r.ignorePunctuation = o.ignorePunctuation === undefined ? false : Boolean(o.ignorePunctuation);
      r.collation = "default";
      r.numeric = o.numeric !== undefined ? Boolean(o.numeric) : ext.kn === "true";
      r.caseFirst = u.pick(o, "caseFirst", ["upper", "lower", "false"], ["upper", "lower", "false"].includes(ext.kf) ? ext.kf : "false", NAME);
      this._r = r;
      this._json = JSON.stringify(r);
    }

    get compare() {
      const f = (a, b) => I.compare(this._r.locale, this._json, String(a), String(b));
      Object.defineProperty(this, "compare", { value: f, configurable: true });
      return f;
    }

    resolvedOptions() { return Object.assign({}, this._r); }

    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(Collator.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return Collator;
})
