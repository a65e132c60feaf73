// TextEncoder, TextDecoder, atob, btoa, crypto and structuredClone, compiled on first use
// (prelude.js `load`). Byte work is the host's (Rust); this gives it the web API's shape.
(function (host) {
  "use strict";
  function toBytes(data, what) {
    // A lone surrogate encodes as U+FFFD, as the standard's UTF-8 encode does.
    if (typeof data === "string") return host.utf8Encode(data.toWellFormed());
    if (data instanceof Uint8Array) return data;
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (data instanceof ArrayBuffer) return new Uint8Array(data);
    if (Array.isArray(data)) return Uint8Array.from(data, (b) => b & 0xff);
    throw new TypeError(`${what}: expected a BufferSource, got ${data === null ? "null" : typeof data}`);
  }

  // ---- encoding: TextEncoder, TextDecoder, atob, btoa ----------------------------------
  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(input = "") { return host.utf8Encode(String(input).toWellFormed()); }
    encodeInto(input, dest) {
      const bytes = host.utf8Encode(String(input).toWellFormed());
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
    // Both failures are InvalidCharacterError; the messages are node's.
    if (/[^A-Za-z0-9+/]/.test(s)) throw new DOMException("Invalid character", "InvalidCharacterError");
    if (s.length % 4 === 1) {
      throw new DOMException("The string to be decoded is not correctly encoded.", "InvalidCharacterError");
    }
    const padded = s + "===".slice((s.length + 3) % 4);
    const bytes = host.base64Decode(padded);
    if (bytes === null || bytes === undefined) {
      throw new DOMException("Invalid character", "InvalidCharacterError");
    }
    let out = "";
    for (let i = 0; i < bytes.length; i += 8192) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 8192));
    return out;
  }

  // ---- crypto ---------------------------------------------------------------------------
  const HASHES = { "SHA-1": 20, "SHA-256": 32, "SHA-384": 48, "SHA-512": 64 };
  function hashName(alg, what) {
    const n = String(typeof alg === "object" && alg !== null ? alg.name : alg).toUpperCase();
    // node's wording; `what` stays in the stack.
    if (!(n in HASHES)) throw new DOMException("Unrecognized algorithm name", "NotSupportedError");
    return n;
  }

  const KEY = Symbol("stsd key material");
  const WITHHELD = Symbol("stsd withheld secret");
  // A secret the code holds only as its placeholder (issue 35): the supervisor signs with it.
  const PLACEHOLDER = /^stsd-secret-[0-9a-f]{40}$/;
  class CryptoKey {
    constructor(material, algorithm, extractable, usages, withheld) {
      Object.defineProperty(this, KEY, { value: material });
      Object.defineProperty(this, WITHHELD, { value: withheld });
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
      const text = bytes.length <= 64 ? String.fromCharCode.apply(null, bytes) : "";
      const withheld = PLACEHOLDER.test(text) ? text : undefined;
      // A withheld secret's key is never extractable: its bytes are not here to give.
      return new CryptoKey(bytes, { name: "HMAC", hash: { name: hash }, length: bytes.length * 8 },
        withheld ? false : extractable, usages || [], withheld);
    },
    async exportKey(format, key) {
      if (!(key instanceof CryptoKey)) throw new TypeError("exportKey: not a CryptoKey");
      if (format !== "raw") throw new DOMException(`exportKey: format ${format} is not supported`, "NotSupportedError");
      if (key[WITHHELD]) throw new DOMException("exportKey: the key is a secret the host holds; it is not exported", "InvalidAccessError");
      if (!key.extractable) throw new DOMException("exportKey: the key is not extractable", "InvalidAccessError");
      return Uint8Array.from(key[KEY]);
    },
    async sign(algorithm, key, data) {
      const name = String(typeof algorithm === "object" && algorithm !== null ? algorithm.name : algorithm).toUpperCase();
      if (name !== "HMAC" || !(key instanceof CryptoKey)) throw new DOMException("sign: only HMAC keys are supported", "InvalidAccessError");
      if (key[WITHHELD]) return host.hmacWithheld(key.algorithm.hash.name, key[WITHHELD], toBytes(data, "sign"));
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
      // Read once: a Proxy may answer differently each time it is asked.
      const n = array.byteLength;
      if (!(n >= 0 && n <= 65536)) {
        throw new DOMException(`getRandomValues: ${n} bytes requested, the limit is 65536`, "QuotaExceededError");
      }
      // A real fill of every byte of every element, whatever its width.
      new Uint8Array(array.buffer, array.byteOffset, n).set(host.randomBytes(n));
      return array;
    },
    randomUUID() { return host.randomUUID(); },
    subtle: Object.freeze(subtle),
  };

  // ---- structuredClone --------------------------------------------------------------------
  // HTML's structured clone: an ordinary object of any class is copied as a plain object (own
  // enumerable properties), as node does; functions, symbols and objects with internal state
  // the algorithm does not know (WeakMap, Promise, ...) are a DataCloneError, worded as node's.
  const UNCLONEABLE = [WeakMap, WeakSet, Promise, typeof WeakRef === "function" ? WeakRef : WeakMap];
  const refuse = (what) => new DOMException(`${what} could not be cloned.`, "DataCloneError");
  function structuredClone(value) {
    const seen = new Map();
    const clone = (v) => {
      if (v === null || (typeof v !== "object" && typeof v !== "function")) {
        if (typeof v === "symbol") throw refuse(String(v));
        return v;
      }
      if (typeof v === "function") throw refuse(Function.prototype.toString.call(v));
      for (const C of UNCLONEABLE) if (v instanceof C) throw refuse(`#<${C.name}>`);
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
        out = {}; seen.set(v, out);
        for (const k of Object.keys(v)) out[k] = clone(v[k]);
        return out;
      }
      seen.set(v, out);
      return out;
    };
    return clone(value);
  }

  return { TextEncoder, TextDecoder: TextDecoderImpl, atob, btoa, crypto: Object.freeze(crypto), structuredClone };
})
