#!/usr/bin/env node
// Write a tiktoken rank file (the format of OpenAI's *.tiktoken files: one
// line "BASE64TOKEN RANK\n" per mergeable token, in rank order) from
// js-tiktoken's table for one encoding.
// Usage: node scripts/tiktoken-ranks.mjs NODE_PREFIX ENCODING OUT
//   NODE_PREFIX  the npm --prefix holding node_modules/js-tiktoken
//   ENCODING     r50k_base | cl100k_base | o200k_base (a js-tiktoken rank table)
// js-tiktoken keeps the ranks compressed: each line of bpe_ranks is
// "NAME FIRST_RANK TOKEN TOKEN ...", the tokens base64 and numbered upwards
// from FIRST_RANK (its dist/chunk-*.js expands them the same way).
import { writeFileSync, renameSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [prefix, encoding, out] = process.argv.slice(2);
if (!prefix || !encoding || !out) {
  console.error("usage: node tiktoken-ranks.mjs NODE_PREFIX ENCODING OUT");
  process.exit(2);
}
const file = join(prefix, "node_modules/js-tiktoken/dist/ranks", encoding + ".js");
const table = (await import(pathToFileURL(file).href)).default;

const byRank = [];
for (const line of table.bpe_ranks.split("\n")) {
  if (!line) continue;
  const [, first, ...tokens] = line.split(" ");
  const start = Number.parseInt(first, 10);
  tokens.forEach((tok, i) => {
    if (byRank[start + i] !== undefined) throw new Error(`${encoding}: rank ${start + i} twice`);
    byRank[start + i] = tok;
  });
}
const lines = [];
for (let r = 0; r < byRank.length; r++) {
  if (byRank[r] === undefined) throw new Error(`${encoding}: no token of rank ${r}`);
  lines.push(`${byRank[r]} ${r}\n`);
}
// Written beside OUT, then renamed: never a half-written rank file.
writeFileSync(out + ".tmp", lines.join(""));
renameSync(out + ".tmp", out);
