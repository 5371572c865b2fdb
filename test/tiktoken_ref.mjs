#!/usr/bin/env node
// The reference encoder for test_tokenizer.sh: js-tiktoken@1.0.21, ordinary
// encoding (special-token text is encoded as text).
// Usage: node test/tiktoken_ref.mjs NODE_PREFIX ENCODING IN OUT [IN OUT ...]
//   NODE_PREFIX  the npm --prefix holding node_modules/js-tiktoken
//   ENCODING     gpt2 | r50k_base | cl100k_base | o200k_base
// Writes the ids of each IN (read as UTF-8) to OUT, one per line, and the
// bytes and seconds spent encoding to stderr ("js-tiktoken ENC: B bytes,
// W s wall, C s CPU, R MB/s per core": CPU time, as machines are shared).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";

const [prefix, encoding, ...files] = process.argv.slice(2);
if (!prefix || !encoding || files.length === 0 || files.length % 2 !== 0) {
  console.error("usage: node tiktoken_ref.mjs NODE_PREFIX ENCODING IN OUT [IN OUT ...]");
  process.exit(2);
}
const require = createRequire(join(resolve(prefix), "node_modules", "noop.js"));
const { getEncoding } = require("js-tiktoken");
const enc = getEncoding(encoding);

let bytes = 0;
let seconds = 0;
let cpu = 0;
for (let i = 0; i < files.length; i += 2) {
  const text = readFileSync(files[i], "utf8");
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  const ids = enc.encode(text, [], []);
  const c1 = process.cpuUsage(c0);
  seconds += Number(process.hrtime.bigint() - t0) / 1e9;
  cpu += (c1.user + c1.system) / 1e6;
  bytes += Buffer.byteLength(text, "utf8");
  writeFileSync(files[i + 1], ids.length ? ids.join("\n") + "\n" : "");
}
console.error(
  `js-tiktoken ${encoding}: ${bytes} bytes, ${seconds.toFixed(3)} s wall, ${cpu.toFixed(3)} s CPU, ` +
    `${(bytes / cpu / 1e6).toFixed(2)} MB/s per core`,
);
