// safety.fs/v1 with the reference runtime's API (reference-runtime.md §4), installed only when
// the posture grants fileRead or fileWrite. The read group needs fileRead, the write group
// fileWrite; the host functions (Rust) do the file work and the path checks.
(function (h, canRead, canWrite) {
  "use strict";
  const KIND = { SECURITY: "SecurityError", INVALID_INPUT: "InvalidInputError", HELPER_RUNTIME: "HelperRuntimeError" };
  const typed = (kind, msg) => { const e = new Error(msg); e.name = KIND[kind]; return e; };
  // The host functions (fs.rs) throw errors already named for their class.
  const needRead = (name) => { if (!canRead) throw typed("SECURITY", `safety.fs.${name} needs the fileRead capability`); };
  const needWrite = (name) => { if (!canWrite) throw typed("SECURITY", `safety.fs.${name} needs the fileWrite capability`); };
  const path = (p) => { if (p === undefined || p === null || p === "") throw typed("INVALID_INPUT", "path required"); return String(p); };
  const int = (v, d) => (v === undefined || v === null || v === "" ? d : Math.trunc(Number(v)));
  const lines = (p) => h.lines(path(p));

  const fs = {
    workspace: () => h.workspace(),
    readRoots: () => [h.workspace()],
    readText(p) { needRead("readText"); return h.readText(path(p)); },
    list(dir = ".") { needRead("list"); return h.list(String(dir)); },
    exists(p) { if (!canRead) return false; try { return h.exists(path(p)); } catch (e) { return false; } },
    stat(p) { needRead("stat"); return h.stat(path(p)); },
    grep(pattern, p, opts = {}) {
      needRead("grep");
      return h.grep(String(pattern), path(p), Boolean(opts.caseInsensitive), Math.max(0, int(opts.limit, 10000)), Boolean(opts.numbered));
    },
    lineCount(p) { needRead("lineCount"); return h.lineCount(path(p)); },
    slice(p, start, end) {
      needRead("slice");
      const all = lines(p), n = all.length;
      const norm = (v, d) => { let x = int(v, d); if (x < 0) x += n; return Math.min(Math.max(x, 0), n); };
      return all.slice(norm(start, 0), norm(end, n));
    },
    cut(p, opts = {}) {
      needRead("cut");
      const fields = opts.fields;
      if (!Array.isArray(fields) || fields.length === 0) throw typed("INVALID_INPUT", "cut: `fields` must be a non-empty array of 1-based column numbers");
      const delim = opts.delimiter === undefined || opts.delimiter === null ? "\t" : String(opts.delimiter);
      const regex = Boolean(opts.regex);
      const splitter = regex ? new RegExp(delim) : delim;
      return lines(p).map((l) => {
        const cols = l.split(splitter);
        return fields.map((f) => cols[int(f, 0) - 1] ?? "").join(regex ? "\t" : delim);
      });
    },
    sort(p, opts = {}) {
      needRead("sort");
      let out = lines(p);
      const key = (s) => (opts.caseInsensitive ? s.toLowerCase() : s);
      if (opts.numeric) {
        const num = (s) => { const x = parseFloat(s); return Number.isNaN(x) ? Infinity : x; };
        out.sort((a, b) => num(a) - num(b) || (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
      } else {
        out.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
      }
      if (opts.unique) out = out.filter((l, i) => i === 0 || key(l) !== key(out[i - 1]));
      if (opts.reverse) out.reverse();
      return out;
    },
    find(dir = ".", glob = "*", opts = {}) {
      needRead("find");
      const type = opts.type === "file" || opts.type === "dir" ? opts.type : "any";
      return h.find(String(dir), String(glob), Math.max(0, int(opts.maxDepth, 0)), type);
    },
    searchInFiles(dir = ".", glob = "*", pattern = "", opts = {}) {
      needRead("searchInFiles");
      return h.searchInFiles(String(dir), String(glob), String(pattern), Boolean(opts.caseInsensitive),
        Math.max(0, int(opts.maxDepth, 0)), Math.max(0, int(opts.limit, 1000)));
    },
    writeText(p, content) { needWrite("writeText"); return h.writeText(path(p), String(content ?? ""), false); },
    appendText(p, content) { needWrite("appendText"); return h.writeText(path(p), String(content ?? ""), true); },
    editText(p, oldString, newString, replaceAll = false) {
      needWrite("editText");
      const text = h.readText(path(p));
      const from = String(oldString ?? "");
      if (from === "") throw typed("INVALID_INPUT", "editText: oldString must not be empty");
      const count = text.split(from).length - 1;
      if (count === 0) throw typed("INVALID_INPUT", `editText: oldString not found in ${p}`);
      if (count > 1 && !replaceAll) throw typed("INVALID_INPUT", `editText: oldString occurs ${count} times in ${p}; pass replaceAll=true`);
      const to = String(newString ?? "");
      const next = replaceAll ? text.split(from).join(to) : text.replace(from, () => to);
      const written = h.writeText(path(p), next, false);
      return { path: written, replacements: replaceAll ? count : 1 };
    },
    copy(from, to) { needWrite("copy"); return h.copy(path(from), path(to)); },
    move(from, to) { needWrite("move"); return h.move(path(from), path(to)); },
    delete(p) { needWrite("delete"); return h.delete(path(p)); },
    deleteDir(p) { needWrite("deleteDir"); return h.deleteDir(path(p)); },
  };
  const safety = globalThis.safety || {};
  Object.defineProperty(safety, "fs", { value: Object.freeze(fs), enumerable: true });
  Object.defineProperty(globalThis, "safety", { value: safety, writable: true, configurable: true });
})
