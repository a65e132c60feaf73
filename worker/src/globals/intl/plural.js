// Intl.PluralRules on ICU4X (intl/text.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.PluralRules";
  class PluralRules {
    constructor(locales, options) {
      const { locale } = u.resolve(locales);
      const o = u.options(options);
      const r = { locale };
      r.type = u.pick(o, "type", ["cardinal", "ordinal"], "cardinal", NAME);
      r.minimumIntegerDigits = u.int(o, "minimumIntegerDigits", 1, 21, 1);
      r.minimumFractionDigits = u.int(o, "minimumFractionDigits", 0, 100, 0);
      r.maximumFractionDigits = u.int(o, "maximumFractionDigits", 0, 100, Math.max(3, r.minimumFractionDigits));
      if (r.minimumFractionDigits > r.maximumFractionDigits) throw new RangeError("maximumFractionDigits value is out of range.");
      this._r = r;
      this._json = JSON.stringify({ type: r.type });
    }

    select(n) {
      const r = this._r;
      return I.plural(r.locale, this._json, Number(n), r.minimumFractionDigits, r.maximumFractionDigits);
    }

    resolvedOptions() {
      const r = Object.assign({}, this._r);
      // In the order node reports them: alphabetical, "other" last.
      const cats = I.pluralCategories(r.locale, this._json).filter((c) => c !== "other").sort();
      r.pluralCategories = [...cats, "other"];
      return r;
    }

    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(PluralRules.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return PluralRules;
})
