// The eager half of stsd's runtime globals, evaluated once per fresh context before the tool's
// code. It receives the Rust host functions as arguments (they are captured here and never
// appear on globalThis) and installs lazy accessors; each group (web.js, parser.js, intl.js,
// url.js, html.js) is compiled by the host the first time a tool touches it.
(function (host, htmlHost) {
  "use strict";
  // A custom Error.prepareStackTrace receives call sites whose getFunction() would hand tool
  // code the facades' internal functions; stack formatting stays the engine's own.
  Object.defineProperty(Error, "prepareStackTrace", { value: undefined, writable: false, configurable: false });
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });

  // Every group is parsed only when a tool first touches it: QuickJS parses a script whole,
  // and a fresh context per call would otherwise pay for all of it every time.
  const loaded = {};
  // The locale methods' stand-ins below: intl.js replaces a method only while it is still one.
  const stubs = new Set();
  const load = (name) => loaded[name] || (loaded[name] = host.compile(name)(host, htmlHost, load, stubs));
  const lazy = (name, get) => Object.defineProperty(globalThis, name, {
    configurable: true,
    enumerable: false,
    get() {
      const value = get();
      Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
      return value;
    },
    set(value) { Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false }); },
  });
  lazy("Intl", () => load("intl").Intl);
  lazy("URL", () => load("url").URL);
  lazy("URLSearchParams", () => load("url").URLSearchParams);
  // The locale-sensitive methods load intl.js, which replaces them with the real ones (those
  // the tool has not replaced first); each stand-in calls the real one.
  const localeMethods = [
    [Date.prototype, ["toLocaleString", "toLocaleDateString", "toLocaleTimeString"]],
    [Number.prototype, ["toLocaleString"]],
    [String.prototype, ["localeCompare", "toLocaleUpperCase", "toLocaleLowerCase"]],
  ];
  for (const [proto, names] of localeMethods) {
    for (const m of names) {
      const stub = function (...args) { return load("intl").real(proto, m).apply(this, args); };
      stubs.add(stub);
      Object.defineProperty(proto, m, { writable: true, configurable: true, value: stub });
    }
  }

  for (const name of ["TextEncoder", "TextDecoder", "atob", "btoa", "crypto", "structuredClone"]) {
    lazy(name, () => load("web")[name]);
  }

  // safety.parser is always there (safety.fs joins it when the posture grants files).
  const safety = {};
  Object.defineProperty(safety, "parser", {
    enumerable: true,
    configurable: true,
    get() {
      const value = load("parser");
      Object.defineProperty(safety, "parser", { value, enumerable: true });
      return value;
    },
  });
  define("safety", safety);
})
