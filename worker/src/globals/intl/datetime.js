// Intl.DateTimeFormat on ICU4X (intl/datetime.rs); compiled the first time a tool touches it.
(function (I, u) {
  "use strict";
  const NAME = "Intl.DateTimeFormat";
  const COMPONENTS = ["weekday", "era", "year", "month", "day", "hour", "minute", "second", "fractionalSecondDigits", "timeZoneName"];
  const STYLES = ["full", "long", "medium", "short"];


  // ---- en-US and en-CA component options: stsd's exact formatter ----------------------------
  // ICU4X chooses patterns by semantic field sets, which do not keep every field's width
  // (month: "2-digit" beside weekday: "short" prints "Jan"); the catalog's date tools read
  // such parts, so for these two locales the component options keep this formatter, which
  // follows node (ICU) field by field. Zone names other than "short" come from ICU4X.
  const WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
  const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December"];
  const pad = (n, w) => String(n).padStart(w, "0");
  function shortZone(f, zone, ms) {
    if (zone === "UTC") return "UTC";
    // ICU names US zones by abbreviation (EST, PDT) for en-US/en-CA, and only from 1970, where
    // its metazone history for them begins; everything else prints as a GMT offset.
    const american = ms >= 0 && (/^(America|US|Canada)\//.test(zone) || zone === "Pacific/Honolulu");
    if (american && /^[A-Z]{3,4}$/.test(f.abbreviation)) return f.abbreviation;
    const off = f.offsetSeconds, sign = off < 0 ? "-" : "+", a = Math.abs(off);
    const h = Math.floor(a / 3600), m = Math.floor((a % 3600) / 60);
    return off === 0 ? "GMT" : `GMT${sign}${h}${m ? ":" + pad(m, 2) : ""}`;
  }
  function exactParts(o, cycle, locale, zone, ms) {
    const f = I.tzFields(ms, zone);
    const ca = locale === "en-CA";
    const out = [];
    const lit = (v) => out.push({ type: "literal", value: v });
    const part = (type, value) => out.push({ type, value: String(value) });
    const textMonth = o.month === "long" || o.month === "short" || o.month === "narrow";
    const monthText = o.month === "long" ? MONTHS[f.month - 1] : o.month === "short" ? MONTHS[f.month - 1].slice(0, 3) : MONTHS[f.month - 1][0];
    // Years before 1 AD print as their era year (0 is 1 BC), as ICU does without an era field.
    const y = f.year > 0 ? f.year : 1 - f.year;
    const yearText = o.year === "2-digit" ? pad(y % 100, 2) : String(y);
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
        if (cycle === "h12") h = h % 12 || 12;
        else if (cycle === "h11") h = h % 12;
        else if (cycle === "h24") h = h === 0 ? 24 : h;
        const twelve = cycle === "h12" || cycle === "h11";
        items.push(["hour", twelve && o.hour === "numeric" ? String(h) : pad(h, 2)]);
      }
      if (o.minute) items.push(["minute", o.hour ? pad(f.minute, 2) : o.minute === "2-digit" ? pad(f.minute, 2) : String(f.minute)]);
      if (o.second) items.push(["second", o.hour || o.minute ? pad(f.second, 2) : o.second === "2-digit" ? pad(f.second, 2) : String(f.second)]);
      items.forEach(([t, v], i) => { if (i) lit(":"); part(t, v); });
      if (o.fractionalSecondDigits) {
        if (items.length) lit(".");
        part("fractionalSecond", pad(f.millisecond, 3).slice(0, o.fractionalSecondDigits));
      }
      if (o.hour && (cycle === "h12" || cycle === "h11")) {
        lit("\u202f"); // ICU puts a narrow no-break space before the day period
        const pm = f.hour >= 12;
        part("dayPeriod", ca ? (pm ? "p.m." : "a.m.") : (pm ? "PM" : "AM"));
      }
    }
    if (o.timeZoneName) {
      lit(hasTime ? " " : ", ");
      const name = o.timeZoneName === "short" ? shortZone(f, zone, ms)
        : I.dateTime(locale, JSON.stringify({ timeZone: zone, timeZoneName: o.timeZoneName }), ms)
          .filter(([t]) => t === "timeZoneName").map(([, v]) => v).join("");
      part("timeZoneName", name);
    }
    return out;
  }

  const timeValue = (date) => {
    const ms = date === undefined ? Date.now() : +(date instanceof Date ? date.getTime() : date);
    if (!Number.isFinite(ms) || Math.abs(ms) > 8.64e15) throw new RangeError("Invalid time value");
    return ms;
  };

  class DateTimeFormat {
    constructor(locales, options) {
      const { locale, ext } = u.resolve(locales);
      const o = u.options(options);
      const r = { locale, calendar: "gregory", numberingSystem: "latn" };
      const hour12 = o.hour12 === undefined ? undefined : Boolean(o.hour12);
      let hc = u.pick(o, "hourCycle", ["h11", "h12", "h23", "h24"], undefined, NAME);
      if (hc === undefined && ["h11", "h12", "h23", "h24"].includes(ext.hc)) hc = ext.hc;
      r.timeZone = o.timeZone === undefined ? "UTC" : I.zone(String(o.timeZone));
      const c = {};
      c.weekday = u.pick(o, "weekday", ["narrow", "short", "long"], undefined, NAME);
      c.era = u.pick(o, "era", ["narrow", "short", "long"], undefined, NAME);
      c.year = u.pick(o, "year", ["2-digit", "numeric"], undefined, NAME);
      c.month = u.pick(o, "month", ["2-digit", "numeric", "narrow", "short", "long"], undefined, NAME);
      c.day = u.pick(o, "day", ["2-digit", "numeric"], undefined, NAME);
      c.hour = u.pick(o, "hour", ["2-digit", "numeric"], undefined, NAME);
      c.minute = u.pick(o, "minute", ["2-digit", "numeric"], undefined, NAME);
      c.second = u.pick(o, "second", ["2-digit", "numeric"], undefined, NAME);
      if (o.fractionalSecondDigits !== undefined) {
        const n = Number(o.fractionalSecondDigits);
        if (![1, 2, 3].includes(n)) throw new RangeError("fractionalSecondDigits value is out of range.");
        c.fractionalSecondDigits = n;
      }
      c.timeZoneName = u.pick(o, "timeZoneName", ["short", "long", "shortOffset", "longOffset", "shortGeneric", "longGeneric"], undefined, NAME);
      const dateStyle = u.pick(o, "dateStyle", STYLES, undefined, NAME);
      const timeStyle = u.pick(o, "timeStyle", STYLES, undefined, NAME);
      if (dateStyle !== undefined || timeStyle !== undefined) {
        const bad = COMPONENTS.find((k) => c[k] !== undefined);
        if (bad) throw new TypeError(`Can't set option ${bad} when ${dateStyle !== undefined ? "dateStyle" : "timeStyle"} is used`);
      } else if (!["weekday", "year", "month", "day", "hour", "minute", "second", "fractionalSecondDigits"].some((k) => c[k] !== undefined)) {
        c.year = "numeric"; c.month = "numeric"; c.day = "numeric";
      }
      const hasHour = c.hour !== undefined || timeStyle !== undefined;
      // The hour cycle: hourCycle (or -u-hc) unless hour12 says otherwise; hour12 picks the
      // locale's own 12- or 24-hour cycle, as ICU does (hour12: false is h24 where the locale's
      // default is h12, as node prints "24:00").
      let cycle;
      if (hasHour) {
        const base = { locale, timeZone: r.timeZone, hour: "numeric" };
        const def = I.dateTimeInfo(locale, JSON.stringify(base)).hourCycle || "h12";
        const twelveDefault = def === "h11" || def === "h12";
        if (hour12 !== undefined) cycle = hour12 ? (def === "h11" ? "h11" : "h12") : (twelveDefault ? "h24" : "h23");
        else cycle = hc || def;
      }
      const req = { locale, timeZone: r.timeZone };
      if (dateStyle !== undefined) req.dateStyle = dateStyle;
      if (timeStyle !== undefined) req.timeStyle = timeStyle;
      for (const k of COMPONENTS) if (c[k] !== undefined) req[k] = c[k];
      // Only an explicit choice is passed on: the locale's own patterns already carry its
      // default cycle (and its hour digits: es writes 0:04, not 00:04).
      if (cycle && (hour12 !== undefined || hc !== undefined)) req.hourCycle = cycle;
      this._json = JSON.stringify(req);
      this._exact = dateStyle === undefined && timeStyle === undefined && (locale === "en-US" || locale === "en-CA") && !c.era;
      this._cycle = cycle;
      if (!this._exact) I.dateTimeInfo(locale, this._json); // builds the formatter now: bad combinations throw here
      if (cycle) { r.hourCycle = cycle; r.hour12 = cycle === "h11" || cycle === "h12"; }
      for (const k of COMPONENTS) if (c[k] !== undefined) r[k] = c[k];
      // As ICU reports the pattern it chose: minutes and seconds after an hour or minute are
      // two digits.
      if (r.hour && r.minute) r.minute = "2-digit";
      if ((r.hour || r.minute) && r.second) r.second = "2-digit";
      // en-CA's numeric date pattern (y-MM-dd) pads month and day, and says so.
      const textMonth = ["long", "short", "narrow"].includes(r.month);
      if (locale === "en-CA" && r.year && r.month && r.day && !textMonth) { r.month = "2-digit"; r.day = "2-digit"; }
      if (dateStyle !== undefined) r.dateStyle = dateStyle;
      if (timeStyle !== undefined) r.timeStyle = timeStyle;
      this._r = r;
    }

    formatToParts(date) {
      const ms = timeValue(date);
      if (this._exact) return exactParts(this._r, this._cycle, this._r.locale, this._r.timeZone, ms);
      return I.dateTime(this._r.locale, this._json, ms).map(([type, value]) => ({ type, value }));
    }

    // As V8 does for web compatibility: format() prints a plain space where formatToParts()
    // keeps ICU's narrow no-break space.
    get format() {
      const f = (date) => this.formatToParts(date).map((p) => p.value).join("").replace(/\u202f/g, " ");
      Object.defineProperty(this, "format", { value: f, configurable: true });
      return f;
    }

    formatRangeToParts(start, end) {
      if (start === undefined || end === undefined) throw new TypeError("Invalid time value");
      return I.dateTimeRange(this._r.locale, this._json, timeValue(start), timeValue(end))
        .map(([type, value, source]) => ({ type, value, source }));
    }

    formatRange(start, end) {
      return this.formatRangeToParts(start, end).map((p) => p.value).join("").replace(/\u202f/g, " ");
    }

    resolvedOptions() { return Object.assign({}, this._r); }

    static supportedLocalesOf(locales) { return I.supported(u.list(locales)); }
  }
  Object.defineProperty(DateTimeFormat.prototype, Symbol.toStringTag, { value: NAME, configurable: true });

  // Date's locale methods (ECMA-402 ToDateTimeOptions: which fields are required, which added).
  const withDefaults = (options, required, defaults) => {
    const o = Object.assign({}, u.options(options));
    const date = ["weekday", "year", "month", "day"].some((k) => o[k] !== undefined);
    const time = ["dayPeriod", "hour", "minute", "second", "fractionalSecondDigits"].some((k) => o[k] !== undefined);
    const styled = o.dateStyle !== undefined || o.timeStyle !== undefined;
    let need = !styled;
    if (required === "date" && date) need = false;
    if (required === "time" && time) need = false;
    if (required === "any" && (date || time)) need = false;
    if (need) {
      if (defaults === "date" || defaults === "all") Object.assign(o, { year: "numeric", month: "numeric", day: "numeric" });
      if (defaults === "time" || defaults === "all") Object.assign(o, { hour: "numeric", minute: "numeric", second: "numeric" });
    }
    return o;
  };
  const localeMethod = (required, defaults) => function (locales, options) {
    const t = Date.prototype.getTime.call(this);
    if (Number.isNaN(t)) return "Invalid Date";
    return new DateTimeFormat(locales, withDefaults(options, required, defaults)).format(t);
  };
  const dateMethods = {
    toLocaleString: localeMethod("any", "all"),
    toLocaleDateString: localeMethod("date", "date"),
    toLocaleTimeString: localeMethod("time", "time"),
  };
  return { DateTimeFormat, dateMethods };
})
