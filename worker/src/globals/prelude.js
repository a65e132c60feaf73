// The JavaScript half of stsd's runtime globals. Evaluated once per context before the tool's
// code, as a function that receives the Rust host functions as an argument: they are captured
// here and never appear on globalThis. Byte work (UTF-8, base64, hashing, randomness) happens
// in Rust; this file only gives it the web API's shape.
(function (host, htmlHost) {
  "use strict";
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });

  // Any BufferSource, an array of numbers or a string (UTF-8) -> Uint8Array view or copy.
  function toBytes(data, what) {
    if (typeof data === "string") return host.utf8Encode(data);
    if (data instanceof Uint8Array) return data;
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (data instanceof ArrayBuffer) return new Uint8Array(data);
    if (Array.isArray(data)) return Uint8Array.from(data, (b) => b & 0xff);
    throw new TypeError(`${what}: expected a BufferSource, got ${data === null ? "null" : typeof data}`);
  }

  // ---- encoding: TextEncoder, TextDecoder, atob, btoa ----------------------------------
  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(input = "") { return host.utf8Encode(String(input)); }
    encodeInto(input, dest) {
      const bytes = host.utf8Encode(String(input));
      // Whole code points only, as the standard requires.
      let n = Math.min(bytes.length, dest.length);
      while (n > 0 && n < bytes.length && (bytes[n] & 0xc0) === 0x80) n--;
      dest.set(bytes.subarray(0, n));
      const read = new TextDecoderImpl().decode(bytes.subarray(0, n)).length;
      return { read, written: n };
    }
  }

  const UTF8_LABELS = ["utf-8", "utf8", "unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "x-unicode20utf8"];
  class TextDecoderImpl {
    constructor(label = "utf-8", options = {}) {
      const l = String(label).trim().toLowerCase();
      if (!UTF8_LABELS.includes(l)) throw new RangeError(`The "${label}" encoding is not supported`);
      this._fatal = Boolean(options && options.fatal);
      this._ignoreBOM = Boolean(options && options.ignoreBOM);
    }
    get encoding() { return "utf-8"; }
    get fatal() { return this._fatal; }
    get ignoreBOM() { return this._ignoreBOM; }
    decode(input) {
      if (input === undefined) return "";
      return host.utf8Decode(toBytes(input, "TextDecoder.decode"), this._fatal, this._ignoreBOM);
    }
  }
  Object.defineProperty(TextDecoderImpl, "name", { value: "TextDecoder" });

  function btoa(data) {
    if (arguments.length === 0) throw new TypeError("btoa: 1 argument required, but only 0 present.");
    const s = String(data);
    const bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c > 0xff) throw new DOMException("Invalid character", "InvalidCharacterError");
      bytes[i] = c;
    }
    return host.base64Encode(bytes);
  }

  // WHATWG forgiving-base64 decode.
  function atob(data) {
    if (arguments.length === 0) throw new TypeError("atob: 1 argument required, but only 0 present.");
    let s = String(data).replace(/[\t\n\f\r ]/g, "");
    if (s.length % 4 === 0) s = s.replace(/==?$/, "");
    if (s.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(s)) {
      throw new DOMException("The string to be decoded is not correctly encoded.", "InvalidCharacterError");
    }
    const padded = s + "===".slice((s.length + 3) % 4);
    const bytes = host.base64Decode(padded);
    if (bytes === null || bytes === undefined) {
      throw new DOMException("The string to be decoded is not correctly encoded.", "InvalidCharacterError");
    }
    let out = "";
    for (let i = 0; i < bytes.length; i += 8192) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 8192));
    return out;
  }

  // ---- crypto ---------------------------------------------------------------------------
  const HASHES = { "SHA-1": 20, "SHA-256": 32, "SHA-384": 48, "SHA-512": 64 };
  function hashName(alg, what) {
    const n = String(typeof alg === "object" && alg !== null ? alg.name : alg).toUpperCase();
    if (!(n in HASHES)) throw new DOMException(`${what}: unrecognized algorithm name ${n}`, "NotSupportedError");
    return n;
  }

  const KEY = Symbol("stsd key material");
  class CryptoKey {
    constructor(material, algorithm, extractable, usages) {
      Object.defineProperty(this, KEY, { value: material });
      this.type = "secret";
      this.extractable = Boolean(extractable);
      this.algorithm = algorithm;
      this.usages = usages;
      Object.freeze(this);
    }
  }

  const subtle = {
    // Results are Uint8Arrays, not bare ArrayBuffers: `new Uint8Array(r)` works as with the
    // standard API, and so does the catalog's `Array.isArray(d) ? d : Array.from(d)`.
    async digest(alg, data) {
      return host.digest(hashName(alg, "digest"), toBytes(data, "digest"));
    },
    async importKey(format, keyData, algorithm, extractable, usages) {
      if (format !== "raw") throw new DOMException(`importKey: format ${format} is not supported`, "NotSupportedError");
      const name = String(typeof algorithm === "object" && algorithm !== null ? algorithm.name : algorithm).toUpperCase();
      if (name !== "HMAC") throw new DOMException(`importKey: algorithm ${name} is not supported`, "NotSupportedError");
      const hash = hashName(typeof algorithm === "object" && algorithm.hash ? algorithm.hash : "SHA-256", "importKey");
      const bytes = Uint8Array.from(toBytes(keyData, "importKey"));
      if (bytes.length === 0) throw new DOMException("importKey: the key must not be empty", "DataError");
      return new CryptoKey(bytes, { name: "HMAC", hash: { name: hash }, length: bytes.length * 8 }, extractable, usages || []);
    },
    async sign(algorithm, key, data) {
      const name = String(typeof algorithm === "object" && algorithm !== null ? algorithm.name : algorithm).toUpperCase();
      if (name !== "HMAC" || !(key instanceof CryptoKey)) throw new DOMException("sign: only HMAC keys are supported", "InvalidAccessError");
      return host.hmac(key.algorithm.hash.name, key[KEY], toBytes(data, "sign"));
    },
    async verify(algorithm, key, signature, data) {
      const expected = await subtle.sign(algorithm, key, data);
      const got = toBytes(signature, "verify");
      if (got.length !== expected.length) return false;
      let diff = 0;
      for (let i = 0; i < got.length; i++) diff |= got[i] ^ expected[i];
      return diff === 0;
    },
  };

  const crypto = {
    getRandomValues(array) {
      const ok = array instanceof Int8Array || array instanceof Uint8Array || array instanceof Uint8ClampedArray ||
        array instanceof Int16Array || array instanceof Uint16Array || array instanceof Int32Array ||
        array instanceof Uint32Array || array instanceof BigInt64Array || array instanceof BigUint64Array;
      if (!ok) throw new DOMException("getRandomValues: an integer TypedArray is required", "TypeMismatchError");
      if (array.byteLength > 65536) {
        throw new DOMException(`getRandomValues: ${array.byteLength} bytes requested, the limit is 65536`, "QuotaExceededError");
      }
      // A real fill of every byte of every element, whatever its width.
      new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(host.randomBytes(array.byteLength));
      return array;
    },
    randomUUID() { return host.randomUUID(); },
    subtle: Object.freeze(subtle),
  };

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

  // ---- structuredClone --------------------------------------------------------------------
  function structuredClone(value) {
    const seen = new Map();
    const clone = (v) => {
      if (v === null || (typeof v !== "object" && typeof v !== "function")) {
        if (typeof v === "symbol") throw new DOMException("Symbol values cannot be cloned", "DataCloneError");
        return v;
      }
      if (typeof v === "function") throw new DOMException("function values cannot be cloned", "DataCloneError");
      if (seen.has(v)) return seen.get(v);
      let out;
      if (Array.isArray(v)) { out = []; seen.set(v, out); for (let i = 0; i < v.length; i++) out[i] = clone(v[i]); return out; }
      if (v instanceof Date) out = new Date(v.getTime());
      else if (v instanceof RegExp) out = new RegExp(v.source, v.flags);
      else if (v instanceof ArrayBuffer) out = v.slice(0);
      else if (ArrayBuffer.isView(v)) out = new v.constructor(v);
      else if (v instanceof Map) { out = new Map(); seen.set(v, out); for (const [k, x] of v) out.set(clone(k), clone(x)); return out; }
      else if (v instanceof Set) { out = new Set(); seen.set(v, out); for (const x of v) out.add(clone(x)); return out; }
      else if (v instanceof Error) { out = new (globalThis[v.name] || Error)(v.message); }
      else if (v instanceof Boolean || v instanceof Number || v instanceof String) out = Object(v.valueOf());
      else {
        const proto = Object.getPrototypeOf(v);
        if (proto !== Object.prototype && proto !== null) throw new DOMException("this object cannot be cloned", "DataCloneError");
        out = {}; seen.set(v, out);
        for (const k of Object.keys(v)) out[k] = clone(v[k]);
        return out;
      }
      seen.set(v, out);
      return out;
    };
    return clone(value);
  }

  define("TextEncoder", TextEncoder);
  define("TextDecoder", TextDecoderImpl);
  define("atob", atob);
  define("btoa", btoa);
  define("crypto", Object.freeze(crypto));
  define("structuredClone", structuredClone);
  define("Intl", Intl);
  define("URL", URL);
  define("URLSearchParams", URLSearchParams);

  // ---- safety.parser (always installed; safety.fs joins it when the posture grants files) --
  const parserError = (e) => {
    const m = /^INVALID_INPUT: ([\s\S]*)$/.exec(e && e.message);
    if (!m) return e;
    const err = new Error(m[1]);
    err.name = "InvalidInputError";
    return err;
  };
  const parse = (fn, ...a) => { try { return JSON.parse(fn(...a)); } catch (e) { throw parserError(e); } };
  const call = (fn) => { try { return fn(); } catch (e) { throw parserError(e); } };

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
  const parser = Object.freeze({
    csv: (input, opts = {}) => parse(host.csvParse, String(input ?? ""), Boolean(opts && opts.header),
      opts && opts.delimiter !== undefined ? String(opts.delimiter) : ","),
    xml: (input) => parse(host.xmlParse, String(input ?? ""), false, ""),
    yaml: (input) => parse(host.yamlParse, String(input ?? ""), false, ""),
    html: (input) => new HtmlDocument(call(() => htmlHost.parse(String(input ?? "")))),
  });
  const safety = {};
  Object.defineProperty(safety, "parser", { value: parser, enumerable: true });
  define("safety", safety);
})
