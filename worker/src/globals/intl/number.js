// Intl.NumberFormat on ICU4X (intl/number.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  // ISO 4217 minor units that are not 2 (ECMA-402 CurrencyDigits).
  const DIGITS = { BHD: 3, BIF: 0, CLF: 4, CLP: 0, DJF: 0, GNF: 0, IQD: 3, ISK: 0, JOD: 3, JPY: 0, KMF: 0,
    KRW: 0, KWD: 3, LYD: 3, OMR: 3, PYG: 0, RWF: 0, TND: 3, UGX: 0, UYI: 0, UYW: 4, VND: 0, VUV: 0,
    XAF: 0, XOF: 0, XPF: 0 };
  const NAME = "Intl.NumberFormat";
  // ICU4X leaves the currency, percent and compact affixes unannotated; ECMA-402 names them
  // by style, with the spaces around them as literals.
  const SPACE = /^([\s\u00a0\u202f]*)(.*?)([\s\u00a0\u202f]*)$/s;
  const affixType = (style, notation, value) => {
    if (style === "percent" && /[%٪‰]/.test(value)) return "percentSign";
    if (style === "currency") return "currency";
    if (notation === "compact") return "compact";
    return "literal";
  };
  const typed = (r, pieces) => {
    const out = [];
    for (const [type, value] of pieces) {
      if (type !== "literal") { out.push({ type, value }); continue; }
      const [, lead, core, trail] = SPACE.exec(value);
      if (lead) out.push({ type: "literal", value: lead });
      if (core) out.push({ type: affixType(r.style, r.notation, core), value: core });
      if (trail) out.push({ type: "literal", value: trail });
    }
    return out;
  };

  class NumberFormat {
    constructor(locales, options) {
      const { locale } = u.resolve(locales);
      const o = u.options(options);
      const r = { locale, numberingSystem: "latn" };
      r.style = u.pick(o, "style", ["decimal", "percent", "currency", "unit"], "decimal", NAME);
      const currency = o.currency === undefined ? undefined : String(o.currency);
      if (currency !== undefined && !/^[A-Za-z]{3}$/.test(currency)) throw new RangeError(`Invalid currency code : ${currency}`);
      const currencyDisplay = u.pick(o, "currencyDisplay", ["code", "symbol", "narrowSymbol", "name"], "symbol", NAME);
      const currencySign = u.pick(o, "currencySign", ["standard", "accounting"], "standard", NAME);
      if (r.style === "currency") {
        if (currency === undefined) throw new TypeError("Currency code is required with currency style.");
        r.currency = currency.toUpperCase();
        r.currencyDisplay = currencyDisplay;
        r.currencySign = currencySign;
      }
      if (r.style === "unit") {
        throw new RangeError("stsd: Intl.NumberFormat style 'unit' is not supported (ICU4X's unit formatter is experimental)");
      }
      const notation = u.pick(o, "notation", ["standard", "scientific", "engineering", "compact"], "standard", NAME);
      if (notation === "scientific" || notation === "engineering") {
        throw new RangeError(`stsd: Intl.NumberFormat notation '${notation}' is not supported`);
      }
      r.minimumIntegerDigits = u.int(o, "minimumIntegerDigits", 1, 21, 1);
      const cd = r.style === "currency" ? (DIGITS[r.currency] ?? 2) : 0;
      const mxdDefault = r.style === "currency" ? cd : r.style === "percent" ? 0 : 3;
      const compactDefault = notation === "compact" && o.minimumFractionDigits === undefined && o.maximumFractionDigits === undefined;
      if (compactDefault) {
        r.minimumSignificantDigits = 1; r.maximumSignificantDigits = 2;
        r.minimumFractionDigits = 0; r.maximumFractionDigits = 0;
      } else {
        const mnfd = o.minimumFractionDigits === undefined ? undefined : u.int(o, "minimumFractionDigits", 0, 100, 0);
        const mxfd = o.maximumFractionDigits === undefined ? undefined : u.int(o, "maximumFractionDigits", 0, 100, 0);
        if (mnfd !== undefined && mxfd !== undefined && mnfd > mxfd) throw new RangeError("maximumFractionDigits value is out of range.");
        r.minimumFractionDigits = mnfd ?? Math.min(cd, mxfd ?? cd);
        r.maximumFractionDigits = mxfd ?? Math.max(r.minimumFractionDigits, mxdDefault);
      }
      const g = o.useGrouping;
      r.useGrouping = g === undefined ? (notation === "compact" ? "min2" : "auto")
        : g === true ? "always" : g === false || g === null || g === "" ? false
        : u.pick(o, "useGrouping", ["min2", "auto", "always"], "auto", NAME);
      r.notation = notation;
      if (notation === "compact") r.compactDisplay = u.pick(o, "compactDisplay", ["short", "long"], "short", NAME);
      r.signDisplay = u.pick(o, "signDisplay", ["auto", "never", "always", "exceptZero", "negative"], "auto", NAME);
      r.roundingMode = "halfExpand";
      r.roundingIncrement = 1;
      r.trailingZeroDisplay = "auto";
      r.roundingPriority = compactDefault ? "morePrecision" : "auto";
      this._r = r;
      this._json = JSON.stringify(r);
    }

    formatToParts(value) {
      const x = typeof value === "bigint" ? Number(value) : Number(value);
      const r = this._r;
      return typed(r, I.number(r.locale, this._json, x));
    }

    get format() {
      const f = (value) => this.formatToParts(value).map((p) => p.value).join("");
      Object.defineProperty(this, "format", { value: f, configurable: true });
      return f;
    }

    resolvedOptions() { return Object.assign({}, this._r); }

    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(NumberFormat.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return NumberFormat;
})
