// safety.parser, compiled on first use (prelude.js `load`).
(function (host, htmlHost, load) {
  "use strict";
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

  const parser = Object.freeze({
    csv: (input, opts = {}) => parse(host.csvParse, String(input ?? ""), Boolean(opts && opts.header),
      opts && opts.delimiter !== undefined ? String(opts.delimiter) : ","),
    xml: (input) => parse(host.xmlParse, String(input ?? ""), false, ""),
    yaml: (input) => parse(host.yamlParse, String(input ?? ""), false, ""),
    html: (input) => load("html")(input),
  });
  return parser;
})
