#!/usr/bin/env node
// The reference encoder for test_hf_tokenizer.sh: @lenml/tokenizers@3.7.2
// (a dependency-free fork of transformers.js's tokenizers), reading a
// tokenizer.json and the tokenizer_config.json beside it, as the
// @lenml/tokenizer-NAME packages do. Encoding without the post-processor's
// BOS (add_special_tokens: false); added tokens in the text are matched.
// Usage: node test/hf_json_ref.mjs NODE_PREFIX TOKENIZER_JSON IN OUT [IN OUT ...]
//   NODE_PREFIX  the npm --prefix holding node_modules/@lenml/tokenizers
// Writes the ids of each IN (read as UTF-8) to OUT, one per line, checks that
// decoding them gives IN back (its NFC when the file's normalizer is NFC;
// exit 1 if not), and prints the bytes and CPU seconds spent encoding to
// stderr.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, tjPath, ...files] = process.argv.slice(2);
if (!prefix || !tjPath || files.length === 0 || files.length % 2 !== 0) {
  console.error("usage: node hf_json_ref.mjs NODE_PREFIX TOKENIZER_JSON IN OUT [IN OUT ...]");
  process.exit(2);
}
const pkgDir = join(resolve(prefix), "node_modules", "@lenml", "tokenizers");
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
const { TokenizerLoader } = await import(pathToFileURL(join(pkgDir, pkg.module)).href);
const tokenizerJSON = JSON.parse(readFileSync(tjPath, "utf8"));
const tokenizerConfig = JSON.parse(readFileSync(join(dirname(tjPath), "tokenizer_config.json"), "utf8"));
const tk = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });

const nfc = JSON.stringify(tokenizerJSON.normalizer ?? null).includes('"NFC"');
let bytes = 0, cpu = 0, bad = 0;
for (let i = 0; i < files.length; i += 2) {
  const text = readFileSync(files[i], "utf8");
  const c0 = process.cpuUsage();
  const ids = tk.encode(text, { add_special_tokens: false });
  const c1 = process.cpuUsage(c0);
  cpu += (c1.user + c1.system) / 1e6;
  bytes += Buffer.byteLength(text, "utf8");
  writeFileSync(files[i + 1], ids.length ? ids.join("\n") + "\n" : "");
  const back = tk.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  if (back !== (nfc ? text.normalize("NFC") : text)) {
    console.error(`hf_json_ref: ${files[i]}: decode(encode(text)) differs from the text`);
    bad++;
  }
}
console.error(
  `@lenml/tokenizers ${tjPath.split("/").slice(-2, -1)[0]}: ${bytes} bytes, ${cpu.toFixed(3)} s CPU, ` +
    `${(bytes / cpu / 1e6).toFixed(2)} MB/s per core`,
);
process.exit(bad ? 1 : 0);
