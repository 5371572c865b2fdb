// js-tiktoken's encoding speed on the given files, the reference beside
// dtrain-prepare's in bench/tokenize.sh. Usage:
//   node bench/tiktoken_speed.mjs NODE_MODULES_DIR ENCODING FILE...
// Prints "MB/s tokens": bytes of all files / seconds of encode() calls,
// after one warm-up pass (JIT). Ordinary encoding, one call per file.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const [modules, encoding, ...files] = process.argv.slice(2);
const require = createRequire(modules + "/");
const { getEncoding } = require("js-tiktoken");
const enc = getEncoding(encoding);
const texts = files.map((f) => readFileSync(f, "utf8"));
const bytes = files.reduce((s, f) => s + readFileSync(f).length, 0);
for (const t of texts) enc.encode(t); // warm-up
const t0 = process.hrtime.bigint();
let tokens = 0;
for (const t of texts) tokens += enc.encode(t).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log((bytes / 1e6 / s).toFixed(2), tokens);
