// Intl.RelativeTimeFormat on ICU4X (intl/text.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.RelativeTimeFormat";
  const formatters = {};
  const nf = (locale) => formatters[locale] || (formatters[locale] = new u.NumberFormat(locale));
  const UNITS = ["second", "minute", "hour", "day", "week", "month", "quarter", "year"];
  class RelativeTimeFormat {
    constructor(locales, options) {
      const { locale } = u.resolve(locales);
      const o = u.options(options);
      this._r = {
        locale,
        style: u.pick(o, "style", ["long", "short", "narrow"], "long", NAME),
        numeric: u.pick(o, "numeric", ["always", "auto"], "always", NAME),
        numberingSystem: "latn",
      };
      this._json = JSON.stringify(this._r);
    }
    formatToParts(value, unit) {
      const v = Number(value);
      if (!Number.isFinite(v)) throw new RangeError("Invalid value");
      const s = String(unit);
      const one = s.endsWith("s") ? s.slice(0, -1) : s;
      if (!UNITS.includes(one)) throw new RangeError(`Invalid unit argument for format() '${s}'`);
      const text = I.relative(this._r.locale, this._json, v, one).map(([, val]) => val).join("");
      // ICU4X does not annotate the number; as V8 does, find the formatted number in the text
      // and give its parts the unit.
      const numParts = nf(this._r.locale).formatToParts(Math.abs(v));
      const num = numParts.map((p) => p.value).join("");
      const at = text.indexOf(num);
      if (at < 0) return [{ type: "literal", value: text }];
      const out = [];
      if (at > 0) out.push({ type: "literal", value: text.slice(0, at) });
      for (const p of numParts) out.push({ type: p.type, value: p.value, unit: one });
      if (at + num.length < text.length) out.push({ type: "literal", value: text.slice(at + num.length) });
      return out;
    }
    format(value, unit) { return this.formatToParts(value, unit).map((p) => p.value).join(""); }
    resolvedOptions() { return Object.assign({}, this._r); }
    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(RelativeTimeFormat.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return RelativeTimeFormat;
})
