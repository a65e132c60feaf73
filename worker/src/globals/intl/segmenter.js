// Intl.Segmenter on ICU4X (intl/text.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.Segmenter";
  class Segments {
    constructor(granularity, input) {
      this._g = granularity;
      this._input = input;
      const flat = I.segment(granularity, input);
      this._list = [];
      for (let i = 0; i < flat.length; i += 3) {
        const s = { segment: input.slice(flat[i], flat[i + 1]), index: flat[i], input };
        if (granularity === "word") s.isWordLike = flat[i + 2] === 1;
        this._list.push(s);
      }
    }
    containing(index) {
      const n = index === undefined ? 0 : Math.trunc(Number(index)) || 0;
      if (n < 0 || n >= this._input.length) return undefined;
      const s = this._list.find((x) => n >= x.index && n < x.index + x.segment.length);
      return s && Object.assign({}, s);
    }
    [Symbol.iterator]() { return this._list.map((s) => Object.assign({}, s))[Symbol.iterator](); }
  }
  class Segmenter {
    constructor(locales, options) {
      const { locale } = u.resolve(locales);
      const o = u.options(options);
      this._r = { locale, granularity: u.pick(o, "granularity", ["grapheme", "word", "sentence"], "grapheme", NAME) };
    }
    segment(input) { return new Segments(this._r.granularity, String(input)); }
    resolvedOptions() { return Object.assign({}, this._r); }
    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(Segmenter.prototype, Symbol.toStringTag, { value: NAME, configurable: true });
  return Segmenter;
})
