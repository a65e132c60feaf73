// The node side of tests/fidelity.rs: runs many {code, args, declared} cases, one after the
// other, the way stsd runs a tool body (an async function body, args as globals, declared names
// without a value as `undefined`), and prints one JSON array of outcomes in the form stsd's
// caller sees them: {ok: true, json: <JSON.stringify of the result, or "undefined">} or
// {ok: false, error: "Name: message" for an error-like value, else "Uncaught <JSON or String>"}.
// WebCrypto results are wrapped in Uint8Array, the shape stsd (and the reference) give them.
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
const subtle = globalThis.crypto.subtle;
const wrap = (f) => async (...a) => new Uint8Array(await f.apply(subtle, a));
const patched = { digest: wrap(subtle.digest), sign: wrap(subtle.sign),
  importKey: subtle.importKey.bind(subtle), verify: subtle.verify.bind(subtle) };
Object.defineProperty(globalThis.crypto, "subtle", { value: patched });

function describe(e) {
  if (e !== null && typeof e === "object" && typeof e.name === "string" && typeof e.message === "string") {
    return e.message === "" ? e.name : `${e.name}: ${e.message}`;
  }
  if (typeof e === "string") return `Uncaught ${e}`;
  let j;
  try { j = JSON.stringify(e); } catch (_) { j = undefined; }
  if (j === "{}") { const s = String(e); if (s !== "[object Object]") j = s; }
  return `Uncaught ${j === undefined ? String(e) : j}`;
}

(async () => {
  const out = [];
  for (const c of cases) {
    for (const [k, v] of Object.entries(c.args)) if (v !== null) globalThis[k] = v;
    const missing = c.declared.filter((n) => !(n in c.args) || c.args[n] === null);
    const src = `(async function () {${missing.length ? "var " + missing.join(", ") + ";" : ""} ${c.code}\n})`;
    try {
      const r = await (0, eval)(src)();
      const j = r === undefined || r === null ? undefined : JSON.stringify(r);
      out.push({ ok: true, json: j === undefined ? "undefined" : j });
    } catch (e) {
      out.push({ ok: false, error: describe(e) });
    }
    for (const k of Object.keys(c.args)) delete globalThis[k];
  }
  process.stdout.write(JSON.stringify(out));
})();
