// Intl on ICU4X: the namespace, shared option helpers and the locale-sensitive methods of
// Date, Number and String. Compiled the first time a tool touches any of them (prelude.js);
// each Intl class is compiled from its own file (globals/intl/*.js) on its first use, and its
// ICU4X formatter is built by the host (globals/intl/) when an instance first needs it.
(function (host, _htmlHost, _load, stubs) {
  "use strict";
  const I = host.intlHost();

  const u = {
    list(locales) {
      if (locales === undefined) return [];
      if (typeof locales === "string") return [locales];
      const o = Object(locales), out = [];
      for (let i = 0; i < (o.length >>> 0); i++) {
        const v = o[i];
        if (typeof v !== "string" && (typeof v !== "object" || v === null)) throw new TypeError("Language ID should be string or object.");
        out.push(String(v));
      }
      return out;
    },
    resolve(locales) { return I.resolve(u.list(locales)); },
    options(options) {
      if (options === undefined) return {};
      if (options === null) throw new TypeError("Cannot convert undefined or null to object");
      return Object(options);
    },
    pick(o, name, allowed, fallback, service) {
      const v = o[name];
      if (v === undefined) return fallback;
      const s = String(v);
      if (!allowed.includes(s)) throw new RangeError(`Value ${s} out of range for ${service} options property ${name}`);
      return s;
    },
    int(o, name, min, max, fallback) {
      const v = o[name];
      if (v === undefined) return fallback;
      const n = Number(v);
      if (!Number.isFinite(n) || n < min || n > max) throw new RangeError(`${name} value is out of range.`);
      return Math.floor(n);
    },
  };

  const loaded = {};
  const load = (name) => loaded[name] || (loaded[name] = host.compile("intl-" + name)(I, u));
  const Intl = {};
  const lazyClass = (prop, get) => Object.defineProperty(Intl, prop, {
    configurable: true,
    enumerable: false,
    get() {
      const value = get();
      Object.defineProperty(Intl, prop, { value, writable: true, configurable: true, enumerable: false });
      return value;
    },
    set(value) { Object.defineProperty(Intl, prop, { value, writable: true, configurable: true, enumerable: false }); },
  });
  lazyClass("DateTimeFormat", () => load("datetime").DateTimeFormat);
  lazyClass("NumberFormat", () => load("number"));
  lazyClass("Collator", () => load("collator"));
  lazyClass("PluralRules", () => load("plural"));
  lazyClass("ListFormat", () => load("list"));
  lazyClass("RelativeTimeFormat", () => load("relative"));
  lazyClass("Segmenter", () => load("segmenter"));
  Object.defineProperty(Intl, "getCanonicalLocales", {
    value: (locales) => [...new Set(I.canonical(u.list(locales)))], writable: true, configurable: true,
  });
  Object.defineProperty(Intl, Symbol.toStringTag, { value: "Intl", configurable: true });
  // RelativeTimeFormat formats its number with NumberFormat.
  Object.defineProperty(u, "NumberFormat", { get: () => load("number") });

  // Only over the prelude's stand-in: a method the tool replaced (or deleted) before Intl
  // loaded stays as the tool left it, as it would in node. A stand-in the tool kept a
  // reference to calls the real method (`real`), not whatever is on the prototype now.
  const reals = new Map();
  const method = (obj, name, fn) => {
    if (!reals.has(obj)) reals.set(obj, Object.create(null));
    reals.get(obj)[name] = fn;
    const now = Object.getOwnPropertyDescriptor(obj, name);
    if (stubs && !(now && stubs.has(now.value))) return;
    Object.defineProperty(obj, name, { value: fn, writable: true, configurable: true });
  };
  const real = (obj, name) => reals.get(obj)[name];
  for (const name of ["toLocaleString", "toLocaleDateString", "toLocaleTimeString"]) {
    method(Date.prototype, name, function (...args) { return load("datetime").dateMethods[name].apply(this, args); });
  }

  // One formatter and one collator for the argument-less calls a sort or a loop makes.
  let plainNumber, plainCollator;
  method(Number.prototype, "toLocaleString", function (locales, options) {
    const x = Number.prototype.valueOf.call(this);
    if (locales === undefined && options === undefined) {
      return (plainNumber || (plainNumber = new Intl.NumberFormat())).format(x);
    }
    return new Intl.NumberFormat(locales, options).format(x);
  });
  method(String.prototype, "localeCompare", function (that, locales, options) {
    if (this === undefined || this === null) throw new TypeError("String.prototype.localeCompare called on null or undefined");
    const c = locales === undefined && options === undefined
      ? (plainCollator || (plainCollator = new Intl.Collator()))
      : new Intl.Collator(locales, options);
    return c.compare(String(this), String(that));
  });
  const caseMethod = (upper) => function (locales) {
    if (this === undefined || this === null) throw new TypeError("String.prototype method called on null or undefined");
    const list = u.list(locales);
    const locale = list.length ? I.resolve(list).locale : "und";
    return I.caseMap(locale, String(this), upper);
  };
  method(String.prototype, "toLocaleUpperCase", caseMethod(true));
  method(String.prototype, "toLocaleLowerCase", caseMethod(false));

  return { Intl, real };
})
