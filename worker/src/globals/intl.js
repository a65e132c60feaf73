// Intl.DateTimeFormat and Date#toLocale*String, compiled on first use (prelude.js `load`).
(function (host) {
  "use strict";
  // ---- Intl.DateTimeFormat (en-US and en-CA; real IANA zones) ---------------------------
  // Output follows node (ICU) for these two locales: part order, separators, the h24 hour
  // cycle that `hour12: false` selects, a.m./p.m. in en-CA. Other locales resolve to en-US.
  const WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
  const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December"];
  const FIELDS = ["weekday", "era", "year", "month", "day", "hour", "minute", "second"];
  const pad = (n, w) => String(n).padStart(w, "0");
  const pick = (opts, name, allowed, fallback) => {
    const v = opts[name];
    if (v === undefined) return fallback;
    const s = String(v);
    if (!allowed.includes(s)) throw new RangeError(`Value ${s} out of range for Intl.DateTimeFormat options property ${name}`);
    return s;
  };

  function zoneName(f, zone, ms) {
    if (zone === "UTC" || zone === "Etc/UTC" || zone === "Etc/GMT" || zone === "GMT") return "UTC";
    // ICU names US zones by abbreviation (EST, PDT) for en-US/en-CA, and only from 1970, where
    // its metazone history for them begins; everything else prints as a GMT offset.
    const american = ms >= 0 && (/^(America|US|Canada)\//.test(zone) || zone === "Pacific/Honolulu");
    if (american && /^[A-Z]{3,4}$/.test(f.abbreviation)) return f.abbreviation;
    const off = f.offsetSeconds, sign = off < 0 ? "-" : "+", a = Math.abs(off);
    const h = Math.floor(a / 3600), m = Math.floor((a % 3600) / 60);
    return off === 0 ? "GMT" : `GMT${sign}${h}${m ? ":" + pad(m, 2) : ""}`;
  }

  class DateTimeFormat {
    constructor(locales, options) {
      const requested = Array.isArray(locales) ? locales[0] : locales;
      const loc = requested === undefined ? "en-US" : String(requested);
      this._locale = /^en-CA$/i.test(loc) ? "en-CA" : (/^en-US$/i.test(loc) || /^en$/i.test(loc)) ? "en-US" : "en-US";
      const o = options === undefined ? {} : Object(options);
      if (o.dateStyle !== undefined || o.timeStyle !== undefined) {
        throw new RangeError("dateStyle and timeStyle are not supported by stsd's Intl; use component options");
      }
      const tz = o.timeZone === undefined ? "UTC" : String(o.timeZone);
      this._zone = host.tzFields(0, tz).zone; // validates; RangeError for an unknown zone
      const r = {};
      r.weekday = pick(o, "weekday", ["long", "short", "narrow"]);
      r.year = pick(o, "year", ["numeric", "2-digit"]);
      r.month = pick(o, "month", ["numeric", "2-digit", "long", "short", "narrow"]);
      r.day = pick(o, "day", ["numeric", "2-digit"]);
      r.hour = pick(o, "hour", ["numeric", "2-digit"]);
      r.minute = pick(o, "minute", ["numeric", "2-digit"]);
      r.second = pick(o, "second", ["numeric", "2-digit"]);
      r.timeZoneName = pick(o, "timeZoneName", ["short", "long", "shortOffset", "longOffset", "shortGeneric", "longGeneric"]);
      if (o.fractionalSecondDigits !== undefined) {
        const n = Number(o.fractionalSecondDigits);
        if (![1, 2, 3].includes(n)) throw new RangeError("fractionalSecondDigits value is out of range.");
        r.fractionalSecondDigits = n;
      }
      if (!FIELDS.some((k) => r[k] !== undefined) && r.fractionalSecondDigits === undefined) {
        r.year = "numeric"; r.month = "numeric"; r.day = "numeric";
      }
      // Hour cycle: hourCycle wins; `hour12: false` selects h24 as ICU does in node.
      let cycle = "h12";
      if (o.hourCycle !== undefined) cycle = pick(o, "hourCycle", ["h11", "h12", "h23", "h24"]);
      if (o.hour12 !== undefined) cycle = o.hour12 ? "h12" : "h24";
      this._cycle = r.hour !== undefined ? cycle : undefined;
      this._opts = r;
    }

    formatToParts(date) {
      const ms = date === undefined ? Date.now() : +(date instanceof Date ? date.getTime() : date);
      if (!Number.isFinite(ms)) throw new RangeError("Invalid time value");
      const f = host.tzFields(ms, this._zone);
      const o = this._opts, ca = this._locale === "en-CA";
      const out = [];
      const lit = (v) => out.push({ type: "literal", value: v });
      const part = (type, value) => out.push({ type, value: String(value) });
      const textMonth = o.month === "long" || o.month === "short" || o.month === "narrow";
      const monthText = o.month === "long" ? MONTHS[f.month - 1] : o.month === "short" ? MONTHS[f.month - 1].slice(0, 3) : MONTHS[f.month - 1][0];
      const yearText = o.year === "2-digit" ? pad(f.year % 100, 2) : String(f.year);
      const hasDate = o.year || o.month || o.day;
      if (o.weekday) {
        const w = WEEKDAYS[f.weekday];
        part("weekday", o.weekday === "long" ? w : o.weekday === "short" ? w.slice(0, 3) : w[0]);
        if (hasDate || o.hour || o.minute || o.second) lit(", ");
      }
      if (hasDate) {
        if (textMonth) {
          if (o.month) part("month", monthText);
          if (o.day) { if (o.month) lit(" "); part("day", o.day === "2-digit" ? pad(f.day, 2) : f.day); }
          if (o.year) { if (o.day) lit(", "); else if (o.month) lit(" "); part("year", yearText); }
        } else if (ca && o.year && o.month && o.day) {
          part("year", yearText); lit("-"); part("month", pad(f.month, 2)); lit("-"); part("day", pad(f.day, 2));
        } else {
          const seq = [];
          if (o.month) seq.push(["month", o.month === "2-digit" ? pad(f.month, 2) : f.month]);
          if (o.day) seq.push(["day", o.day === "2-digit" ? pad(f.day, 2) : f.day]);
          if (o.year) seq.push(["year", yearText]);
          seq.forEach(([t, v], i) => { if (i) lit("/"); part(t, v); });
        }
      }
      const hasTime = o.hour || o.minute || o.second || o.fractionalSecondDigits;
      if (hasTime) {
        if (hasDate) lit(", ");
        const items = [];
        if (o.hour) {
          let h = f.hour;
          if (this._cycle === "h12") h = h % 12 || 12;
          else if (this._cycle === "h11") h = h % 12;
          else if (this._cycle === "h24") h = h === 0 ? 24 : h;
          const twelve = this._cycle === "h12" || this._cycle === "h11";
          items.push(["hour", twelve && o.hour === "numeric" ? String(h) : pad(h, 2)]);
        }
        if (o.minute) items.push(["minute", o.hour ? pad(f.minute, 2) : o.minute === "2-digit" ? pad(f.minute, 2) : String(f.minute)]);
        if (o.second) items.push(["second", o.hour || o.minute ? pad(f.second, 2) : o.second === "2-digit" ? pad(f.second, 2) : String(f.second)]);
        items.forEach(([t, v], i) => { if (i) lit(":"); part(t, v); });
        if (o.fractionalSecondDigits) {
          if (items.length) lit(".");
          part("fractionalSecond", pad(f.millisecond, 3).slice(0, o.fractionalSecondDigits));
        }
        if (o.hour && (this._cycle === "h12" || this._cycle === "h11")) {
          lit("\u202f"); // ICU puts a narrow no-break space before the day period
          const pm = f.hour >= 12;
          part("dayPeriod", ca ? (pm ? "p.m." : "a.m.") : (pm ? "PM" : "AM"));
        }
      }
      if (o.timeZoneName) {
        lit(hasTime ? " " : ", ");
        part("timeZoneName", zoneName(f, this._zone, ms));
      }
      return out;
    }

    // As V8 does for web compatibility: format() prints a plain space where formatToParts()
    // keeps ICU's narrow no-break space.
    format(date) { return this.formatToParts(date).map((p) => p.value).join("").replace(/\u202f/g, " "); }

    resolvedOptions() {
      const r = { locale: this._locale, calendar: "gregory", numberingSystem: "latn", timeZone: this._zone };
      if (this._cycle) { r.hourCycle = this._cycle; r.hour12 = this._cycle === "h12" || this._cycle === "h11"; }
      for (const k of ["weekday", "year", "month", "day", "hour", "minute", "second", "fractionalSecondDigits", "timeZoneName"]) {
        if (this._opts[k] !== undefined) r[k] = this._opts[k];
      }
      // en-CA's numeric date pattern (y-MM-dd) pads month and day, and says so.
      const textMonth = ["long", "short", "narrow"].includes(r.month);
      if (this._locale === "en-CA" && r.year && r.month && r.day && !textMonth) { r.month = "2-digit"; r.day = "2-digit"; }
      if (r.hour && r.minute) r.minute = "2-digit";
      if ((r.hour || r.minute) && r.second) r.second = "2-digit";
      return r;
    }

    static supportedLocalesOf(locales) {
      const list = Array.isArray(locales) ? locales : locales === undefined ? [] : [locales];
      return list.map(String).filter((l) => /^en-(US|CA)$/i.test(l));
    }
  }
  Object.defineProperty(DateTimeFormat.prototype, Symbol.toStringTag, { value: "Intl.DateTimeFormat" });

  const Intl = {};
  Object.defineProperty(Intl, "DateTimeFormat", { value: DateTimeFormat, writable: true, configurable: true });
  Object.defineProperty(Intl, Symbol.toStringTag, { value: "Intl" });

  // Date's locale methods go through the same formatter (en-US defaults, as node prints them).
  const withDefaults = (options, defaults) => {
    const o = Object.assign({}, options);
    if (!["weekday", "year", "month", "day", "hour", "minute", "second"].some((k) => o[k] !== undefined)) Object.assign(o, defaults);
    return o;
  };
  const DATE = { year: "numeric", month: "numeric", day: "numeric" };
  const TIME = { hour: "numeric", minute: "2-digit", second: "2-digit" };
  const dateProto = Date.prototype;
  const defineMethod = (obj, name, fn) => Object.defineProperty(obj, name, { value: fn, writable: true, configurable: true });
  defineMethod(dateProto, "toLocaleString", function (locales, options) {
    return new DateTimeFormat(locales, withDefaults(options, Object.assign({}, DATE, TIME))).format(this);
  });
  defineMethod(dateProto, "toLocaleDateString", function (locales, options) {
    return new DateTimeFormat(locales, withDefaults(options, DATE)).format(this);
  });
  defineMethod(dateProto, "toLocaleTimeString", function (locales, options) {
    return new DateTimeFormat(locales, withDefaults(options, TIME)).format(this);
  });

  return { Intl, DateTimeFormat };
})
