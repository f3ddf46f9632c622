// The built assets are committed; this stamp ties them to the sources they came from.
// `--write` (the last build step) records a SHA-256 over the sources; `--check` fails when
// a source changed since (rebuild with `npm run build`). tests/test_labextension.py does the
// same check in Python, so it runs where there is no node.
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const STAMP = join(here, '..', 'jupyter_infer', 'labextension', 'source-stamp.json');
const INPUTS = ['package.json', 'package-lock.json', 'tsconfig.json', 'src', 'style', 'schema', 'scripts'];

function files(path) {
  if (statSync(path).isDirectory()) {
    return readdirSync(path).sort().flatMap(name => files(join(path, name)));
  }
  return [path];
}

export function sourceHash() {
  const hash = createHash('sha256');
  for (const input of INPUTS) {
    for (const file of files(join(here, input))) {
      // Paths with "/" and text with "\n", so the hash is the same on every platform.
      hash.update(relative(here, file).split('\\').join('/') + '\0');
      hash.update(readFileSync(file, 'utf8').replace(/\r\n/g, '\n') + '\0');
    }
  }
  return hash.digest('hex');
}

const mode = process.argv[2];
const digest = sourceHash();
if (mode === '--write') {
  writeFileSync(STAMP, JSON.stringify({ sources: INPUTS, sha256: digest }, null, 2) + '\n');
} else {
  const recorded = JSON.parse(readFileSync(STAMP, 'utf8')).sha256;
  if (recorded !== digest) {
    console.error('labextension sources changed since the last build: run `npm run build` in labextension/.');
    process.exit(1);
  }
  console.log('built assets match their sources');
}
