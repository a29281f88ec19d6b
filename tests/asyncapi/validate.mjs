// Checks AsyncAPI documents with the standard parser (@asyncapi/parser): each file named on the
// command line is parsed and validated; every diagnostic of severity error (0) or warning (1) is
// printed as JSON on its own line, and the exit status is 1 when there is an error.
import { readFile } from "node:fs/promises";
import { Parser } from "@asyncapi/parser";

const parser = new Parser();
let failed = false;
for (const path of process.argv.slice(2)) {
  const { document, diagnostics } = await parser.parse(await readFile(path, "utf8"));
  for (const d of diagnostics) {
    if (d.severity <= 1) console.log(JSON.stringify({ file: path, severity: d.severity, code: d.code, message: d.message, path: d.path }));
  }
  if (!document || diagnostics.some((d) => d.severity === 0)) failed = true;
  else console.log(JSON.stringify({ file: path, ok: true, messages: document.allMessages().length, operations: document.allOperations().length }));
}
process.exit(failed ? 1 : 0);
