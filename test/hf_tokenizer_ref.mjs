#!/usr/bin/env node
// An exported tokenizer.json (io/tok_hf.h) against js-tiktoken, through
// Hugging Face's own JavaScript implementation of the tokenizer.json format
// (@huggingface/tokenizers, which compiles the Split pattern with
// Oniguruma's semantics translated to JavaScript).
// Usage: node test/hf_tokenizer_ref.mjs NODE_PREFIX TOKENIZER_JSON ENCODING FILE...
//   NODE_PREFIX  the npm --prefix holding node_modules/{js-tiktoken,@huggingface/tokenizers}
//   ENCODING     js-tiktoken's name: gpt2 | cl100k_base | o200k_base; or
//                bytes: the reference ids are the line's UTF-8 bytes (dtrain's byte kind)
// For each FILE (UTF-8), line by line: the ids of tokenizers.js equal
// js-tiktoken's ordinary encoding, and tokenizers.js decodes them back to
// the line. Two documented differences are taken out of the text first:
// the special tokens' text (Hugging Face tokenizers match it in input; dtrain
// and js-tiktoken's ordinary encoding treat it as text) and U+0085 (in
// Oniguruma's \s, as in the Rust tiktoken's, not in ECMAScript's).
// Prints "N ids, L lines, 0 differences"; exit 1 on any difference.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, tjPath, encoding, ...files] = process.argv.slice(2);
if (!prefix || !tjPath || !encoding || files.length === 0) {
  console.error("usage: node hf_tokenizer_ref.mjs NODE_PREFIX TOKENIZER_JSON ENCODING FILE...");
  process.exit(2);
}
const require = createRequire(join(resolve(prefix), "node_modules", "noop.js"));
const { getEncoding } = require("js-tiktoken");
// its ES module build (the package's "module" entry)
const hfDir = join(resolve(prefix), "node_modules", "@huggingface", "tokenizers");
const hfPkg = JSON.parse(readFileSync(join(hfDir, "package.json"), "utf8"));
const { Tokenizer } = await import(pathToFileURL(join(hfDir, hfPkg.module)).href);
const tj = JSON.parse(readFileSync(tjPath, "utf8"));
const hf = new Tokenizer(tj, {});
const enc = encoding === "bytes" ? { encode: (s) => [...Buffer.from(s, "utf8")] } : getEncoding(encoding);
const specials = tj.added_tokens.map((t) => t.content);

let ids = 0, lines = 0, diffs = 0;
for (const f of files) {
  let text = readFileSync(f, "utf8").replaceAll("\u0085", "");
  for (const s of specials) text = text.replaceAll(s, "");
  for (const line of text.split(/(?<=\n)/)) {
    const a = hf.encode(line, { add_special_tokens: false }).ids;
    const b = enc.encode(line, [], []);
    lines++;
    ids += b.length;
    const same = a.length === b.length && a.every((x, i) => x === b[i]);
    const back = hf.decode(a, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    if (!same || back !== line) {
      if (diffs++ < 3) {
        let i = 0;
        while (i < a.length && a[i] === b[i]) i++;
        console.error(`${f}: ${same ? "decode differs" : `id ${i} differs: ${a.slice(i, i + 5)} vs ${b.slice(i, i + 5)}`} in ${JSON.stringify(line.slice(0, 80))}`);
      }
    }
  }
}
console.log(`${ids} ids, ${lines} lines, ${diffs} differences`);
process.exit(diffs ? 1 : 0);
