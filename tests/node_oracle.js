// Runs a tool body under node the way stsd runs it: the body as an async function body, args
// and statics as globals, undeclared names as `undefined`. Reads {code, args, declared} as JSON
// on stdin, prints {ok, result} or {ok:false, error}. WebCrypto results are wrapped in
// Uint8Array, the shape stsd (and the reference runtime, which returned arrays) give them.
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const subtle = globalThis.crypto.subtle;
const wrap = (f) => async (...a) => new Uint8Array(await f.apply(subtle, a));
const patched = { digest: wrap(subtle.digest), sign: wrap(subtle.sign),
  importKey: subtle.importKey.bind(subtle), verify: subtle.verify.bind(subtle) };
Object.defineProperty(globalThis.crypto, "subtle", { value: patched });
for (const [k, v] of Object.entries(input.args)) globalThis[k] = v;
const missing = input.declared.filter((n) => !(n in input.args));
const src = `(async function () {${missing.length ? "var " + missing.join(", ") + ";" : ""} ${input.code}\n})`;
(0, eval)(src)().then(
  (r) => console.log(JSON.stringify({ ok: true, result: r === undefined ? null : r })),
  (e) => console.log(JSON.stringify({ ok: false, error: String(e && e.message) })),
);
